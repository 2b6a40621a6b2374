// The Hopper COMET W4Ax GEMM (gemm_fmpq_sm90.cu, built for sm_90a only), called by cuda::gemm_fmpq
// (cpp/kernels/sm80/gemm_fmpq_sm80.cu), which checks the arguments and picks the kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda::detail {

// One checked FMPQ problem: y[m, n] = channel_scale[n] * sum_b x_scale[m, b] * (x · Wᵀ)_b over 128-channel
// blocks b (f16 or f32 y); W packed by pack_sm80_w4a8 (u4 tiles, u8 steps/offsets).
struct FmpqProblem {
  const int8_t* x;  // s8 [m, k], rows ldx bytes apart (a multiple of 16)
  int64_t ldx;
  const float* x_scale;  // [m, blocks]
  const uint8_t* w;      // [ceil(n/16), k/64 * 512]
  const uint8_t* steps;  // [groups, npad]
  const uint8_t* offsets;
  const float* channel_scale;  // [npad]
  void* y;                     // [m, n] f16 or f32, rows ldy elements apart
  int64_t ldy;
  int m, n, k, blocks, group, npad;
  bool f32_out;
};

// True when `device` is sm_90 and this library holds the sm_90a image of the kernel.
bool gemm_fmpq_sm90_usable(int device);
// split: 0 picks the split-K cluster size, else 1, 2, 4 or 8. overlap: the mainloop that flushes each block
// while the next block's wgmmas run (the default; bit-identical outputs), else the serial
// one that waits for each block's wgmmas before flushing them.
void gemm_fmpq_sm90(const FmpqProblem& p, int split, bool overlap, cudaStream_t stream);

}  // namespace lowbit::cuda::detail
