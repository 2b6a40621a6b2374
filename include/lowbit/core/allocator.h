// Allocators own raw memory. The host allocator hands out 64-byte aligned blocks; the CUDA
// allocator caches freed blocks by size (stream-ordered reuse) so steady-state decoding never
// calls cudaMalloc. Each device kind has one process-wide allocator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "lowbit/core/device.h"

namespace lowbit {

struct AllocatorStats {
  int64_t allocated_bytes = 0;   // live bytes handed out
  int64_t reserved_bytes = 0;    // bytes held from the system (live + cached)
  int64_t peak_allocated_bytes = 0;
  int64_t num_allocs = 0;        // allocate() calls
  int64_t num_system_allocs = 0; // calls that reached malloc / cudaMalloc
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, const Device& device) = 0;
  virtual void deallocate(void* ptr, size_t bytes, const Device& device) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void empty_cache() {}
};

// Device memory owned by one CUDA graph. While a GraphPoolScope is active on a thread, that thread's
// CUDA allocations come from (and are freed back to) the pool instead of the shared cache, so a
// buffer whose address a captured graph baked in is never handed to anyone else. Blocks freed during
// the capture are reused by later allocations of the same capture (one stream: replay keeps that
// order). The pool returns its blocks to the device when destroyed: destroy it after its graph.
class GraphPoolScope;
class GraphMemoryPool {
 public:
  GraphMemoryPool();
  ~GraphMemoryPool();
  GraphMemoryPool(const GraphMemoryPool&) = delete;
  GraphMemoryPool& operator=(const GraphMemoryPool&) = delete;
  int64_t reserved_bytes() const;
  struct Impl;  // kept by the CUDA allocator (allocator.cpp)

 private:
  friend class GraphPoolScope;
  std::unique_ptr<Impl> impl_;
};

class GraphPoolScope {
 public:
  explicit GraphPoolScope(GraphMemoryPool& pool);
  ~GraphPoolScope();
  GraphPoolScope(const GraphPoolScope&) = delete;
  GraphPoolScope& operator=(const GraphPoolScope&) = delete;

 private:
  GraphMemoryPool::Impl* previous_;
};

Allocator& host_allocator();
// Throws when CUDA is unavailable (built without it, or no GPU present).
Allocator& cuda_allocator();
Allocator& allocator_for(const Device& device);

}  // namespace lowbit
