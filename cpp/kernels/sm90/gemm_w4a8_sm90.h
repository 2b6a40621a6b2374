// The Hopper W4A8 GEMM (gemm_w4a8_sm90.cu, built for sm_90a only), called by cuda::gemm_w4a8
// (cpp/kernels/sm80/gemm_w4a8_sm80.cu), which checks the arguments and picks the kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/sm90_choice.h"

namespace lowbit::cuda::detail {

// One checked W4A8 problem, as plain pointers: y[m, n] = (x · Wᵀ) * x_scale[m] * channel_scale[n]
// (f16), or the raw int32 accumulators; W packed by pack_sm80_w4a8 (u4 tiles, u8 steps/offsets).
struct W4A8Problem {
  const int8_t* x;  // s8 [m, k], rows ldx bytes apart (a multiple of 16)
  int64_t ldx;
  const float* x_scale;  // [m]; unused when raw
  const uint8_t* w;      // [ceil(n/16), k/64 * 512]
  const uint8_t* steps;  // [groups, npad]
  const uint8_t* offsets;
  const float* channel_scale;  // [npad]
  void* y;                     // [m, n] f16 or s32, rows ldy elements apart
  int64_t ldy;
  int m, n, k, group, npad;
  bool raw;
};

// True when `device` is sm_90 and this library holds the sm_90a image of the kernel.
bool gemm_w4a8_sm90_usable(int device);
// The tile (16, 32, 64, 128 or 256 tokens) and split-K cluster size come from a cost model unless `choice` pins them.
void gemm_w4a8_sm90(const W4A8Problem& p, const Sm90Choice& choice, cudaStream_t stream);
// The tile and split gemm_w4a8_sm90 takes for this shape (device: the current one).
Sm90Plan gemm_w4a8_sm90_plan(int m, int n, int k, const Sm90Choice& choice);

}  // namespace lowbit::cuda::detail
