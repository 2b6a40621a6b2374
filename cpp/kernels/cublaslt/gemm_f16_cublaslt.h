// The f16 GEMM on cuBLASLt (gemm_f16_cublaslt.cpp): y[m, n] = x[m, k] · w[n, k]ᵀ (+ f16 bias), f32 accumulation.
// Built only when CMake found cuBLASLt (cmake/cublaslt.cmake defines LOWBIT_WITH_CUBLASLT).
#pragma once
#include <cuda_runtime_api.h>

#include "lowbit/core/tensor.h"

namespace lowbit::cuda {

// x [m, k], w [n, k], y [m, n]: f16 on one CUDA device, rows of unit column stride and any row stride (views of
// wider buffers are fine); bias: undefined or f16 [n], contiguous. Runs on `stream` and is safe under CUDA graph
// capture (the plan, cached per thread and shape, is made on the first eager call of a shape; a first call
// inside a capture makes it there, which needs no device work).
void gemm_f16_cublaslt(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, cudaStream_t stream);

}  // namespace lowbit::cuda
