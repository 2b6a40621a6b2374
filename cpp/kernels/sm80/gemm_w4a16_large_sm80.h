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
  const __half* zeros;  // [G, npad]: zero points, or the mins of w = q*s + m when `mins`
  __half* y;            // [m, n], row stride ldy
  int64_t ldy;
  float* partial;  // [split, m, n] f32 when split > 1
  int m, n, k, group, npad;  // group: a multiple of 32
  int chunks_per_split;      // 64-k chunks per blockIdx.z
  bool mins;
};

// Block tile (tokens x weight rows); automatic: 128 x 128, or 64 x 128 when that fills more SMs.
enum class W4A16LargeTile { automatic, m64n128, m128n128, m128n256 };

// Resolves automatic for (m, n) on device and checks that the tile fits its shared memory.
W4A16LargeTile gemm_w4a16_large_tile(int64_t m, int64_t n, W4A16LargeTile tile, int device);
// Split-K only where the (m, n) blocks leave SMs idle (e.g. down_proj at 256 tokens).
int gemm_w4a16_large_pick_split(int64_t m, int64_t n, int64_t k, W4A16LargeTile tile, int device);
// y = x · dequant(W)ᵀ with a resolved tile and split (> 1: f32 partials in p.partial, summed in a
// fixed order); checked arguments, current device = x's.
void gemm_w4a16_large(const W4A16LargeArgs& p, W4A16LargeTile tile, int split, cudaStream_t stream);

}  // namespace lowbit::cuda
