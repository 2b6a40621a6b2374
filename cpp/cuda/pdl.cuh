// Programmatic dependent launch (Hopper): a kernel launched with the programmatic-serialization
// attribute may start while the kernel before it on the stream is still running. It must call
// pdl_wait_for_producers() before it touches anything that kernel writes (the wait returns once the
// producer grid has completed and its memory is visible); what it does before the wait (e.g. prefetch
// of its weights) overlaps the producer's tail and its own launch. A producer calls
// pdl_allow_dependents() to let the dependent grid launch before the producer's blocks exit.
// Both are no-ops below sm_90 and in kernels launched without the attribute.
#pragma once
#include <cuda_runtime.h>

#include "lowbit/cuda/check.h"

namespace lowbit::cuda {

__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait_for_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether `device` has programmatic dependent launch (sm_90+); whether a launch uses it is the
// caller's option (KernelTuning::pdl, kernel_overrides {"pdl": "off"}).
inline bool pdl_supported(int device) { return compute_capability_major(device) >= 9; }

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent when `pdl`.
template <typename... Params, typename... Args>
void launch_maybe_pdl(const char* op, bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  LOWBIT_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace lowbit::cuda
