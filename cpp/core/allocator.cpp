#include "lowbit/core/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "lowbit/core/error.h"
#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lowbit {

struct GraphMemoryPool::Impl {
  std::map<std::pair<int, size_t>, std::vector<void*>> free;  // (device, rounded size) -> free blocks
  std::vector<std::pair<void*, size_t>> blocks;                 // every block the pool holds
  int64_t reserved = 0;
};

namespace {

thread_local GraphMemoryPool::Impl* g_active_pool = nullptr;

constexpr size_t kHostAlign = 64;  // one cache line; also satisfies AVX-512 aligned loads

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, const Device&) override {
    const size_t rounded = (bytes + kHostAlign - 1) / kHostAlign * kHostAlign;
    void* p = rounded ? std::aligned_alloc(kHostAlign, rounded) : nullptr;
    if (rounded && !p)
      LOWBIT_FAIL(ErrorKind::kOutOfMemory, "host allocator: out of memory allocating ", bytes, " bytes");
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated_bytes += static_cast<int64_t>(bytes);
    stats_.reserved_bytes += static_cast<int64_t>(bytes);
    stats_.num_allocs++;
    stats_.num_system_allocs++;
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
    return p;
  }
  void deallocate(void* p, size_t bytes, const Device&) override {
    std::free(p);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated_bytes -= static_cast<int64_t>(bytes);
    stats_.reserved_bytes -= static_cast<int64_t>(bytes);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  mutable std::mutex mu_;
  AllocatorStats stats_;
};

#ifdef LOWBIT_WITH_CUDA
// Caches freed device blocks by rounded size, per device. All lowbit work on a device runs on
// one stream in order, so a block freed by the host can be reused by the next launch safely.
class CudaCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, const Device& device) override {
    const size_t size = round_size(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.num_allocs++;
    GraphMemoryPool::Impl* graph_pool = g_active_pool;
    auto& pool = graph_pool ? graph_pool->free[{device.index, size}] : free_[{device.index, size}];
    void* p = nullptr;
    if (!pool.empty()) {
      p = pool.back();
      pool.pop_back();
    } else {
      int prev = 0;
      cudaGetDevice(&prev);
      cudaSetDevice(device.index);
      cudaError_t err = cudaMalloc(&p, size);
      if (err != cudaSuccess) {  // free the cache and retry once before giving up
        cudaGetLastError();
        release_cached_locked();
        err = cudaMalloc(&p, size);
      }
      cudaSetDevice(prev);
      if (err != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        LOWBIT_FAIL(ErrorKind::kOutOfMemory, "CUDA allocator: out of memory on ", device.str(), " allocating ",
                    bytes, " bytes (", free_b, " free of ", total_b, "; lowbit holds ", stats_.reserved_bytes, ")");
      }
      stats_.num_system_allocs++;
      stats_.reserved_bytes += static_cast<int64_t>(size);
      if (graph_pool) {
        graph_pool->blocks.emplace_back(p, size);
        graph_pool->reserved += static_cast<int64_t>(size);
        owner_[p] = graph_pool;
      }
    }
    stats_.allocated_bytes += static_cast<int64_t>(size);
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
    return p;
  }
  void deallocate(void* p, size_t bytes, const Device& device) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    const size_t size = round_size(bytes);
    const auto owner = owner_.find(p);
    if (owner != owner_.end())
      owner->second->free[{device.index, size}].push_back(p);
    else
      free_[{device.index, size}].push_back(p);
    stats_.allocated_bytes -= static_cast<int64_t>(size);
  }
  // Frees every block of a graph's pool (live tensors in it must be gone: the graph owned them).
  void release_pool(GraphMemoryPool::Impl& pool) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [p, size] : pool.blocks) {
      cudaFree(p);
      owner_.erase(p);
      stats_.reserved_bytes -= static_cast<int64_t>(size);
    }
    pool.blocks.clear();
    pool.free.clear();
    pool.reserved = 0;
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

 private:
  static size_t round_size(size_t b) { return b < 512 ? 512 : (b + 511) / 512 * 512; }
  void release_cached_locked() {
    for (auto& [key, ptrs] : free_) {
      for (void* p : ptrs) {
        cudaFree(p);
        stats_.reserved_bytes -= static_cast<int64_t>(key.second);
      }
      ptrs.clear();
    }
  }
  mutable std::mutex mu_;
  std::map<std::pair<int, size_t>, std::vector<void*>> free_;
  std::unordered_map<void*, GraphMemoryPool::Impl*> owner_;  // blocks that belong to a graph's pool
  AllocatorStats stats_;
};

CudaCachingAllocator* g_cuda_allocator = nullptr;  // set on first use of cuda_allocator()
#endif

}  // namespace

Allocator& host_allocator() {
  static HostAllocator a;
  return a;
}

Allocator& cuda_allocator() {
#ifdef LOWBIT_WITH_CUDA
  require_device(Device::cuda(0), "cuda_allocator");
  static CudaCachingAllocator* a = g_cuda_allocator = new CudaCachingAllocator();  // leaked: outlives static tensors
  return *a;
#else
  require_device(Device::cuda(0), "cuda_allocator");
  LOWBIT_FAIL(ErrorKind::kNotSupported, "unreachable");
#endif
}

Allocator& allocator_for(const Device& device) {
  if (device.is_cpu()) return host_allocator();
  require_device(device, "allocate");
  return cuda_allocator();
}

GraphMemoryPool::GraphMemoryPool() : impl_(std::make_unique<Impl>()) {}

GraphMemoryPool::~GraphMemoryPool() {
#ifdef LOWBIT_WITH_CUDA
  if (g_cuda_allocator) g_cuda_allocator->release_pool(*impl_);
#endif
}

int64_t GraphMemoryPool::reserved_bytes() const { return impl_->reserved; }

GraphPoolScope::GraphPoolScope(GraphMemoryPool& pool) : previous_(g_active_pool) { g_active_pool = pool.impl_.get(); }

GraphPoolScope::~GraphPoolScope() { g_active_pool = previous_; }

}  // namespace lowbit
