// The mainloop pieces that the sm80-family W4A8 GEMMs share (gemm_w4a8_sm80.cu, and gemm_fmpq_sm80.cu, which
// adds COMET's per-block activation scales): a stage's cp.async loads, the in-register u4 -> s8 weight dequant and
// one warp's m16n8k32 s8 MMAs over a stage. A block-shape Cfg (each kernel's own) names the tile counts and the
// stage layout: kWBytes weight tiles, then kPBytes step/offset rows, then the swizzled activation rows.
#pragma once
#include <cstdint>

#include "kernels/sm80/w4a16_common_sm80.cuh"

namespace lowbit::cuda::w4a8 {

using w4a16::cp_async16;
using w4a16::kChunkBytes;
using w4a16::kChunkK;
using w4a16::kTileN;

// Lane (g, t) reads 4 bytes at k 32j + 4t (+16) of token g: without a swizzle tokens g and g+2 (64-byte
// rows) hit the same banks. XOR-ing the 16-byte unit index with (r >> 1) & 3 spreads the 8 tokens'
// reads over all 32 banks.
__device__ inline int x_swizzle(int r) { return (r >> 1) & 3; }

// The weight tiles, step/offset rows and activation rows of chunks [kc0, kc0 + C::kChunks) into one stage
// (Args: any kernel argument struct with x, ldx, w, steps, offsets, m, n, k, group, npad).
template <class C, class Args>
__device__ inline void load_operands(const Args& p, uint8_t* stage, int kc0, int kc_end, int n0, int m0) {
  const int tid = threadIdx.x, k_chunks = p.k / kChunkK, n_tiles = (p.n + kTileN - 1) / kTileN;
  constexpr int kWUnits = C::kBlockTiles * C::kChunks * 32;  // 16-byte units
#pragma unroll
  for (int u0 = 0; u0 < kWUnits; u0 += C::kThreads) {
    const int u = u0 + tid;
    if (kWUnits % C::kThreads != 0 && u >= kWUnits) break;
    const int tile = u / (C::kChunks * 32), rest = u % (C::kChunks * 32);
    const int nt = n0 / kTileN + tile;
    if (nt < n_tiles && kc0 + rest / 32 < kc_end)
      cp_async16(stage + u * 16, p.w + (static_cast<int64_t>(nt) * k_chunks + kc0) * kChunkBytes + rest * 16);
  }
  constexpr int kRowUnits = C::kBlockN / 16;
  constexpr int kPUnits = C::kChunks * 2 * kRowUnits;
#pragma unroll
  for (int u0 = 0; u0 < kPUnits; u0 += C::kThreads) {
    const int u = u0 + tid;
    if (u >= kPUnits) break;
    const int c = u / (2 * kRowUnits), which = (u / kRowUnits) % 2, off = (u % kRowUnits) * 16;
    const int kc = kc0 + c;
    if (kc < kc_end && n0 + off < p.npad) {
      const uint8_t* src = (which ? p.offsets : p.steps) + static_cast<int64_t>(kc * kChunkK / p.group) * p.npad + n0 + off;
      cp_async16(stage + C::kWBytes + u * 16, src);
    }
  }
  constexpr int kXUnits = C::kChunks * C::kBlockM * (kChunkK / 16);
  uint8_t* x_base = stage + C::kWBytes + C::kPBytes;
#pragma unroll
  for (int u0 = 0; u0 < kXUnits; u0 += C::kThreads) {
    const int u = u0 + tid;
    if (kXUnits % C::kThreads != 0 && u >= kXUnits) break;
    const int c = u / (C::kBlockM * 4), r = (u / 4) % C::kBlockM, q = u % 4;
    if (m0 + r < p.m && kc0 + c < kc_end)
      cp_async16(x_base + (u ^ x_swizzle(r)) * 16, p.x + (m0 + r) * p.ldx + (kc0 + c) * kChunkK + q * 16);
  }
}

__device__ inline void mma_s8_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four u4 codes, one per byte, to four s8 weights: (q*s + a) XOR 0x80 per byte. `offset4` is a
// replicated into every byte; q*s <= 240 and q*s + a <= 255 keep each byte's sum inside its byte.
__device__ inline uint32_t dequant_bytes(uint32_t codes, uint32_t step, uint32_t offset4) {
  return (codes * step + offset4) ^ 0x80808080u;
}

// One warp's share of a stage: per chunk and k32 step, each weight tile is dequantized once into
// its A fragment and multiplied into all of the warp's 8-token tiles.
template <class C>
__device__ inline void compute_stage(const uint8_t* stage, int chunks, int warp_n, int warp_m,
                                     int (&acc)[C::kTilesN][C::kTilesM][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint4* ws = reinterpret_cast<const uint4*>(stage);
  const uint8_t* ps = stage + C::kWBytes;
  const uint8_t* xs = stage + C::kWBytes + C::kPBytes;
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c) {
    if (c >= chunks) break;
    uint4 wv[C::kTilesN];
    uint32_t s_g[C::kTilesN], s_g8[C::kTilesN], a_g[C::kTilesN], a_g8[C::kTilesN];
#pragma unroll
    for (int i = 0; i < C::kTilesN; ++i) {
      const int tile = warp_n * C::kTilesN + i, row = tile * kTileN + g;
      wv[i] = ws[(tile * C::kChunks + c) * 32 + lane];
      const uint8_t* pc = ps + c * 2 * C::kBlockN;
      s_g[i] = pc[row];
      s_g8[i] = pc[row + 8];
      a_g[i] = pc[C::kBlockN + row] * 0x01010101u;
      a_g8[i] = pc[C::kBlockN + row + 8] * 0x01010101u;
    }
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      // The B fragment of token g: b0 = k 32 step + 4t + 0..3 (16-byte unit 2 step), b1 = 16 further.
      uint2 xv[C::kTilesM];
#pragma unroll
      for (int j = 0; j < C::kTilesM; ++j) {
        const int r = (warp_m * C::kTilesM + j) * 8 + g;
        const uint8_t* row = xs + (c * C::kBlockM + r) * kChunkK + 4 * t;
        xv[j].x = *reinterpret_cast<const uint32_t*>(row + 16 * ((2 * step) ^ x_swizzle(r)));
        xv[j].y = *reinterpret_cast<const uint32_t*>(row + 16 * ((2 * step + 1) ^ x_swizzle(r)));
      }
#pragma unroll
      for (int i = 0; i < C::kTilesN; ++i) {
        const uint32_t w_g = step ? wv[i].z : wv[i].x, w_g8 = step ? wv[i].w : wv[i].y;
        const uint32_t a[4] = {dequant_bytes(w_g & 0x0f0f0f0fu, s_g[i], a_g[i]),
                               dequant_bytes(w_g8 & 0x0f0f0f0fu, s_g8[i], a_g8[i]),
                               dequant_bytes((w_g >> 4) & 0x0f0f0f0fu, s_g[i], a_g[i]),
                               dequant_bytes((w_g8 >> 4) & 0x0f0f0f0fu, s_g8[i], a_g8[i])};
#pragma unroll
        for (int j = 0; j < C::kTilesM; ++j) mma_s8_16832(acc[i][j], a, xv[j].x, xv[j].y);
      }
    }
  }
}

}  // namespace lowbit::cuda::w4a8
