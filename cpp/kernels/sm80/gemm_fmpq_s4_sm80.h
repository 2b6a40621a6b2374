// The Ampere/Ada COMET W4Ax GEMM with int4 tensor cores (gemm_fmpq_s4_sm80.cu), called by cuda::gemm_fmpq
// (cpp/kernels/sm80/gemm_fmpq_sm80.cu), which checks the arguments and picks the kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/gemm_fmpq_sm90.h"

namespace lowbit::cuda::detail {

// p as gemm_fmpq_sm90 takes it; raw: y is s32 [m, blocks, n] (each block's int32 sum, x_scale unused).
// int8_mask: bit b set = block b is int8 (kFmpqMaxBlocks bits); the others must hold codes in [-8, 7].
// split: 0 picks the split-K, else the number of splits (whole blocks each).
void gemm_fmpq_s4_sm80(const FmpqProblem& p, const uint32_t* int8_mask, bool raw, int split, bool pdl,
                       cudaStream_t stream);

}  // namespace lowbit::cuda::detail
