// The Hopper W4A16 GEMM (gemm_w4a16_sm90.cu, built for sm_90a only), called by cuda::gemm_w4a16
// (cpp/kernels/sm80/gemm_w4a16_sm80.cu), which checks the arguments and picks the kernel.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/sm90_choice.h"

namespace lowbit::cuda::detail {

// One checked W4A16 problem, as plain pointers: y[m, n] = x · Wᵀ (f16 out, f32 accumulation), W packed
// by pack_sm80 (u4 tiles in fragment k order, f16 scales and zeros or mins [groups, npad]).
struct W4A16Problem {
  const __half* x;  // [m, k], rows ldx elements apart (a multiple of 8)
  int64_t ldx;
  const uint8_t* w;  // [ceil(n/16), k/64 * 512]
  const __half* scales;
  const __half* zeros;  // zero points, or the mins of w = q*s + m when `mins`
  __half* y;            // [m, n], rows ldy elements apart
  int64_t ldy;
  int m, n, k, group, npad;  // group: a multiple of 32
  bool mins;
};

// True when `device` is sm_90 and this library holds the sm_90a image of the kernel.
bool gemm_w4a16_sm90_usable(int device);
// The tile (128 or 256 tokens) and split-K cluster size come from a cost model unless `choice` pins them.
void gemm_w4a16_sm90(const W4A16Problem& p, const Sm90Choice& choice, cudaStream_t stream);
// The tile and split gemm_w4a16_sm90 takes for this shape (device: the current one).
Sm90Plan gemm_w4a16_sm90_plan(int m, int n, int k, const Sm90Choice& choice);

}  // namespace lowbit::cuda::detail
