// The int4 stream of the COMET W4Ax GEMM for Ampere/Ada's int4 tensor cores (COMET §4: two MMA streams into one
// tile's accumulators): gemm_fmpq_sm80.cu's kernel with kS4 runs a stage's int4 activation block here, on mma.sync
// m16n8k64 s4 x s4, and an int8 block on the m16n8k32 s8 stream (w4a8_common_sm80.cuh), chosen per 128-channel
// block by the block map (a bit mask in the kernel's arguments). Only the int4 blocks' inner product differs, and
// it is exact, so the int32 block sums (raw output) equal the s8 stream's bit for bit.
//
// The s4 stream never widens the weight to s8. pack_sm80_w4a8's s8 weight of a row and group is affine in
// its u4 code q: w8 = (q*s + a) - 128 (QoQ a = 128 - z*s, LiquidQuant a = min + 128 as stored), so over a
// group's k
//     sum_k w8_k * x_k = s * sum_k (q_k - 8) * x_k + c * sum_k x_k,   c = 8*s + a - 128,
// with q - 8 in [-8, 7] an s4 operand (q ^ 8 per nibble) and x in [-7, 7] (int4 blocks). Per 64-k chunk
// (groups are multiples of 64) one s4 MMA per weight tile gives sum (q - 8) x, one s4 MMA of a ones tile
// per token tile gives sum x (in the accumulator layout, tokens 2t and 2t+1), and two IMADs per element
// fold them into the block's int32 sums.
//
// Fragment order: the k order inside an MMA is free as long as A and B agree. A lane's packed weight word
// (pack_sm80_w4a8.cpp) holds, at nibble 2b / 2b+1, chunk k 4t+b / 16+4t+b (+32 for the second k32 step),
// which is the s4 A register as it is (no permutation, one XOR). The B register is built to match from
// the s8 codes in shared memory: (lo & 0x0f0f0f0f) | (hi & 0x0f0f0f0f) << 4 of the two words the s8
// stream reads (first version: activations arrive as s8 codes and are narrowed in registers; an s4
// activation layout from the quantizer would halve their bytes and is not written).
//
// Hopper runs this code (test_gpu_fmpq.py forces it there for correctness) but its s4 mma is slow: the
// registry takes this kernel by default on sm_80/86/87/89 only; on sm_90 it runs only when forced by name.
// Tiles (gemm_fmpq_sm80.cu, FmpqShapes<true>): the s8 kernel's, except 64-token tiles from 33 tokens on (its
// 128-token tile spilled on sm_80) and 3 CTAs per SM at <= 8 tokens (4 spilled on sm_90a); 0 spills on sm_80 and
// sm_90a. Speed: unmeasured (no GPU with int4 tensor cores measured yet; docs/benchmarks_gpu.md, COMET round 3).
#pragma once
#include <cstdint>

#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm80/w4a8_common_sm80.cuh"

namespace lowbit::cuda::fmpq_s4 {

using w4a16::kChunkK;
using w4a16::kTileN;

__device__ inline void mma_s4_16864(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two s8 words of a token (k 4t+0..3 and 16+4t+0..3 of a k32 step) as one s4 B register: nibble 2b = byte b
// of lo, nibble 2b+1 = byte b of hi, the order of the packed weight word.
__device__ inline uint32_t s4_pair(uint32_t lo, uint32_t hi) {
  return (lo & 0x0f0f0f0fu) | ((hi << 4) & 0xf0f0f0f0u);
}

// One warp's share of an int4 block's stage: per chunk, each token tile's B fragment and its ones-MMA
// activation sums, then per weight tile one s4 MMA and the affine fold into the int32 block sums.
template <class C>
__device__ inline void compute_stage_s4(const uint8_t* stage, int chunks, int warp_n, int warp_m,
                                        int (&acc)[C::kTilesN][C::kTilesM][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint4* ws = reinterpret_cast<const uint4*>(stage);
  const uint8_t* ps = stage + C::kWBytes;
  const uint8_t* xs = stage + C::kWBytes + C::kPBytes;
  const uint32_t ones[4] = {0x11111111u, 0x11111111u, 0x11111111u, 0x11111111u};  // s4 1s: the sum of x
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c) {
    if (c >= chunks) break;
    uint32_t a[C::kTilesN][4];
    int s_g[C::kTilesN], s_g8[C::kTilesN], c_g[C::kTilesN], c_g8[C::kTilesN];
#pragma unroll
    for (int i = 0; i < C::kTilesN; ++i) {
      const int tile = warp_n * C::kTilesN + i, row = tile * kTileN + g;
      const uint4 wv = ws[(tile * C::kChunks + c) * 32 + lane];
      a[i][0] = wv.x ^ 0x88888888u;  // q - 8 as s4: rows g / g+8, k32 steps 0 / 1
      a[i][1] = wv.y ^ 0x88888888u;
      a[i][2] = wv.z ^ 0x88888888u;
      a[i][3] = wv.w ^ 0x88888888u;
      const uint8_t* pc = ps + c * 2 * C::kBlockN;
      s_g[i] = pc[row];
      s_g8[i] = pc[row + 8];
      c_g[i] = 8 * s_g[i] + pc[C::kBlockN + row] - 128;
      c_g8[i] = 8 * s_g8[i] + pc[C::kBlockN + row + 8] - 128;
    }
#pragma unroll
    for (int j = 0; j < C::kTilesM; ++j) {
      const int r = (warp_m * C::kTilesM + j) * 8 + g;
      const uint8_t* xrow = xs + (c * C::kBlockM + r) * kChunkK + 4 * t;
      uint32_t b[2];
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const uint32_t lo = *reinterpret_cast<const uint32_t*>(xrow + 16 * ((2 * step) ^ w4a8::x_swizzle(r)));
        const uint32_t hi = *reinterpret_cast<const uint32_t*>(xrow + 16 * ((2 * step + 1) ^ w4a8::x_swizzle(r)));
        b[step] = s4_pair(lo, hi);
      }
      int xsum[4] = {0, 0, 0, 0};  // [0] / [1]: sum of the chunk's codes of tokens 2t / 2t+1 (every row alike)
      mma_s4_16864(xsum, ones, b[0], b[1]);
#pragma unroll
      for (int i = 0; i < C::kTilesN; ++i) {
        int d[4] = {0, 0, 0, 0};
        mma_s4_16864(d, a[i], b[0], b[1]);
        acc[i][j][0] += s_g[i] * d[0] + c_g[i] * xsum[0];
        acc[i][j][1] += s_g[i] * d[1] + c_g[i] * xsum[1];
        acc[i][j][2] += s_g8[i] * d[2] + c_g8[i] * xsum[0];
        acc[i][j][3] += s_g8[i] * d[3] + c_g8[i] * xsum[1];
      }
    }
  }
}

}  // namespace lowbit::cuda::fmpq_s4
