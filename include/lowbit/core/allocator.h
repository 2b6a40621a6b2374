// Allocators own raw memory. The host allocator hands out 64-byte aligned blocks; the CUDA
// allocator caches freed blocks by size (stream-ordered reuse) so steady-state decoding never
// calls cudaMalloc. Each device kind has one process-wide allocator.
#pragma once
#include <cstddef>
#include <cstdint>

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

Allocator& host_allocator();
// Throws when CUDA is unavailable (built without it, or no GPU present).
Allocator& cuda_allocator();
Allocator& allocator_for(const Device& device);

}  // namespace lowbit
