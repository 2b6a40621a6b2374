// Every CUDA runtime call and every kernel launch is checked; a failure becomes a lowbit::Error
// that names the op and the CUDA error string: MemoryError in Python when CUDA ran out of memory,
// RuntimeError otherwise. The error is also cleared from cudaGetLastError (a non-sticky one, such
// as out of memory, would otherwise fail the next launch check of a correct call).
#pragma once
#include <cuda_runtime_api.h>

#include "lowbit/core/error.h"
#include "lowbit/core/tensor.h"

#define LOWBIT_CUDA_CHECK(op, call)                                                              \
  do {                                                                                           \
    const cudaError_t lowbit_err_ = (call);                                                      \
    if (lowbit_err_ != cudaSuccess) {                                                            \
      (void)cudaGetLastError();                                                                  \
      LOWBIT_FAIL(lowbit_err_ == cudaErrorMemoryAllocation ? ::lowbit::ErrorKind::kOutOfMemory   \
                                                           : ::lowbit::ErrorKind::kRuntime,      \
                  op, ": ", #call, " failed: ", cudaGetErrorName(lowbit_err_), " (",             \
                  cudaGetErrorString(lowbit_err_), ")");                                         \
    }                                                                                            \
  } while (0)

// After each <<<...>>>: catches bad launch configurations at once (asynchronous faults surface at
// the next synchronizing call, which is checked too).
#define LOWBIT_CUDA_CHECK_LAUNCH(op) LOWBIT_CUDA_CHECK(op, cudaGetLastError())

namespace lowbit::cuda {

// Throws unless `t` lives on a usable CUDA device (names op and argument).
void check_cuda_tensor(const Tensor& t, const char* op, const char* arg);
// Throws unless `t` is on the same device as `ref`.
void check_same_device(const Tensor& t, const Tensor& ref, const char* op, const char* arg);

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  int64_t total_memory = 0;
  int l2_bytes = 0;
  int max_smem_per_block_optin = 0;
  int runtime_version = 0, driver_version = 0;
};
DeviceInfo device_info(int index);
// Number of multiprocessors of the current device (cached per device), for grid sizing.
int multiprocessor_count(int device);
// Compute capability major version of a device (cached per device), for arch-dependent launch paths.
int compute_capability_major(int device);

}  // namespace lowbit::cuda
