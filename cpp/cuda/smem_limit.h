// A kernel's dynamic shared-memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize), raised and never lowered.
// Kernels whose launches need different sizes (the GEMVs: their copy of x grows with k) must not set the limit to
// each launch's size: the limit is one value per kernel and device, so two host threads launching the same kernel on
// one device (tensor-parallel ranks sharing a GPU over the thread communicator, two engines in one process) could
// lower it between the other thread's set and launch, and that launch fails with "invalid argument".
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>

#include "lowbit/cuda/check.h"

namespace lowbit::cuda {

// Raises `kernel`'s limit on the current device to at least `bytes` (once per larger need; a no-op otherwise).
inline void raise_dynamic_smem_limit(const char* op, const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> limits;  // (kernel, device) -> the limit set there
  int device = 0;
  LOWBIT_CUDA_CHECK(op, cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  int& limit = limits[{kernel, device}];
  if (bytes <= limit) return;
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  limit = bytes;
}

template <typename... Params>
void raise_dynamic_smem_limit(const char* op, void (*kernel)(Params...), int bytes) {
  raise_dynamic_smem_limit(op, reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace lowbit::cuda
