// Internal: the large-M W4A16 GEMM (gemm_w4a16_large_sm80.cu), dispatched by gemm_w4a16.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda {

struct W4A16LargeArgs {
  const __half* x;  // [m, k], row stride ldx (multiple of 8, 16-byte aligned start)
  int64_t ldx;
  const uint8_t* w;  // pack_sm80 tiles
  const __half* scales;
  const __half* zeros;  // [G, npad]
  __half* y;            // [m, n], row stride ldy
  int64_t ldy;
  int m, n, k, group, npad;
};

// Block tile (tokens x weight rows); automatic: 128 x 128, or 64 x 128 when that fills more SMs.
enum class W4A16LargeTile { automatic, m64n128, m128n128, m128n256 };

// y = x · dequant(W)ᵀ in one pass over k (no split-K); checked arguments, current device = x's.
void gemm_w4a16_large(const W4A16LargeArgs& p, W4A16LargeTile tile, int device, cudaStream_t stream);

}  // namespace lowbit::cuda
