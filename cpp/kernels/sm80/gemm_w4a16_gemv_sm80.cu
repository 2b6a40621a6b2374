// W4A16 GEMV for 1-8 tokens, register-direct (kernel name "gemv[:T[:rDbB]]"): no shared-memory staging of the weights.
//
// Why: the decode step at batch 1 is W4A16 GEMVs, and on an H200 the smem-ring kernels (the sm80 small kernel, the
// TMA-fed decode90) reach ~2.0-2.3 TB/s of weight bytes (docs/benchmarks_gpu.md, "W4A16 decode on Hopper"). Timed
// inside decode90, a stage's copy took ~2.3-3 us from issue to landing, so a CTA held too few bytes in flight per
// microsecond of latency. Here every warp keeps its own loads in flight, in registers: no barrier, no producer.
//
// Shape of the work: a warp owns one 16-row weight tile and a contiguous run of its 64-k chunks (pack_sm80 stores a
// tile's chunks back to back: one 16-byte word per lane per chunk, already the lane's mma A fragment for the four
// k16 steps). It streams them with 16-byte ld.global.nc.L1::no_allocate loads, D chunks ahead (a register ring of
// depth D). D and the CTAs per SM B are compile-time configurations (kGemvConfigs, "rDbB"); the automatic one is
// r4b4: 4 CTAs x 8 warps per SM at <= 64 registers, 32 x 4 x 512 B = 64 KB of weights in flight per SM.
// A CTA is T tiles x 8/T k-slices (T = 1, 2, 4, 8: the "gemv:T" name); its slices meet in shared memory in a fixed
// order at the end, so one launch and no partials buffer for every layer whose x fits (below). The ring's first
// loads are issued before the programmatic-dependent wait (the weights do not depend on the kernel before).
//
// Math: mma.sync m16n8k16, the dequantized lane word is the A fragment as it is (the same lop3 dequant and the
// same f16 weights as the other W4A16 kernels, w4a16_common_sm80.cuh), the tokens are the B operand (8 columns,
// tokens past m read a zero row), f32 accumulation. Per chunk that is 4 mma + ~50 dequant instructions,
// against ~4 x 4 x 8 = 128 FMAs (plus conversions) for the same chunk on CUDA cores at one token; the tensor cores'
// idle columns cost nothing here. x (the CTA's k range for its tokens) is copied once per CTA into shared memory,
// natural layout with rows 16 bytes apart modulo 128 (conflict-free ldmatrix.x4: two per chunk give all four B
// fragments). Scales and zeros ride the ring beside each chunk: lanes 0-15 load rows 0-15 of k half 0, lanes
// 16-31 those of half 1 (one 2-byte load each of scale and zero), and each lane takes its rows g and g+8 by two
// shuffles when the chunk is computed.
//
// Measured (H200, one token, docs/benchmarks_gpu.md "W4A16 decode on Hopper", rounds 3 and 4): the first version
// (r8b2: 16 warps per SM) streamed only ~1.5-1.7 TB/s on the large layers, whatever T. At about the same bytes in
// flight per SM (60-64 KB), 32-40 warps (r4b4, r3b5) took 8B gate_up 36.7 -> 26.5 us and 70B/TP2 gate_up 74.8 ->
// 46.7 us (2.36-2.67 TB/s, 1.09-1.14x decode90; the device reads 4.14 TB/s); at 48 KB, 8 / 24 / 48 warps gave
// 59.8 / 35.0 / 27.3 us on 8B gate_up: warps per SM (each warp's dependent chain per chunk) set the pace first,
// bytes in flight second (24 warps: 48 KB 35.0 us, 72 KB 28.3). So the automatic choice takes it at one token on
// sm_90 for every layer (T = 1, r4b4, or r6b3 where r4b4's x would split k).
//
// When x for the CTA's k range would not fit (its budget per CTA follows B: ~100 KB at 2 CTAs per SM, ~47 KB at 4; at
// r4b4 one token past k ~12100, 8 tokens past k ~2700), the k range is split over
// gridDim.y CTAs whose f32 partials the shared sum kernel adds in a fixed order (deterministic), as the small
// kernel does.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "cuda/pdl.cuh"
#include "cuda/smem_limit.h"
#include "kernels/sm80/gemm_w4a16_gemv_sm80.h"
#include "kernels/sm80/gemv_plan.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda::detail {
namespace {

using namespace w4a16;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRedBytes = kWarps * 32 * 16;
// Bytes of x per CTA: what leaves `blocks` CTAs per SM room on Hopper / A100 (228 KB, 1 KB reserved per CTA) with the
// reduction area, at most 100000 (today's 2-CTA budget).
constexpr int x_budget(int blocks) { return std::min(100000, 228 * 1024 / blocks - 1024 - kRedBytes - 512); }
// Ring depth with two groups per chunk (two parameter words per chunk): 8 -> 6 keeps the 2-CTA budget.
constexpr int two_group_depth(int depth) { return depth >= 8 ? depth - 2 : depth; }

struct Args {
  W4A16Problem p;
  float* partial;  // [gridDim.y, m, n] when gridDim.y > 1
  int k_chunks, tiles, slices, z_chunks;  // z_chunks: chunks per CTA along y
  int x_row;                              // halves between x rows in shared memory
  float inv_half_groups;                  // 1 / (group / 32)
  bool pdl;
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t ld_u16(const __half* p) {
  unsigned short r;
  asm("ld.global.nc.u16 %0, [%1];" : "=h"(r) : "l"(p));
  return r;
}

// (scale, addend) of w = fma(q, s, addend) for one row, broadcast as f16x2 pairs, from the packed (s, z or m) word.
template <bool kMins>
__device__ __forceinline__ void row_params(uint32_t sz, __half2& s2, __half2& add2) {
  s2 = __low2half2(as_h2(sz));
  if (kMins) {
    add2 = __high2half2(as_h2(sz));
  } else {  // the high half holds -z: (s * -z) rounds as -(z * s) (neg_zero_scale)
    add2 = __hmul2(as_h2(sz), __lowhigh2highlow(as_h2(sz)));
  }
}

// kRing: chunks in flight per warp (one group per chunk); kBlocks: CTAs per SM the registers are budgeted for.
template <bool kMins, bool kTwoHalves, int kRing, int kBlocks>
__global__ void __launch_bounds__(kThreads, kBlocks) gemm_w4a16_gemv_kernel(Args a) {
  extern __shared__ uint4 smem_u4[];
  __half* xs = reinterpret_cast<__half*>(smem_u4);
  const W4A16Problem& p = a.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tile = warp % a.tiles, slice = warp / a.tiles;
  const int nt = blockIdx.x * a.tiles + tile, n_tiles = (p.n + kTileN - 1) / kTileN;
  const int zb = blockIdx.y * a.z_chunks, ze = min(zb + a.z_chunks, a.k_chunks);
  const int per = (ze - zb + a.slices - 1) / a.slices;
  const int kb = zb + slice * per, ke = min(kb + per, ze);
  const bool active = nt < n_tiles && slice < a.slices;

  // This lane's 16 bytes of chunk kc are at p.w + 16 * (wofs + kc * 32). Parameters: lanes 0-15 load the scales of the tile's rows
  // 0-15, lanes 16-31 their zeros (or mins), for k half 0 of the chunk and, with two groups per chunk, half 1.
  // 32-bit offsets from the kernel parameters' pointers, not 64-bit pointers held in registers (two registers fewer
  // for the small-ring configurations; a layer's weights stay below 2^31 16-byte words).
  const uint32_t wofs = static_cast<uint32_t>(nt) * a.k_chunks * (kChunkBytes / 16) + lane;
  const uint32_t pofs = nt * kTileN + (lane & 15);
  const bool scale_lane = lane < 16;
  // Where registers are tight (3+ CTAs per SM) a slot is refilled after its chunk is computed, not before: the
  // chunk's word and the refill's never live together (D - 1 chunks in flight while one is computed).
  constexpr bool kLateRefill = kBlocks >= 3;
  constexpr int kHalves = kTwoHalves ? 2 : 1, kDepth = kTwoHalves ? two_group_depth(kRing) : kRing;
  uint4 wbuf[kDepth];
  uint32_t pbuf[kDepth][kHalves];
  auto issue = [&](int d, int kc) {
    wbuf[d] = ld_stream(reinterpret_cast<const uint4*>(p.w) + (wofs + static_cast<uint32_t>(kc) * 32));
#pragma unroll
    for (int hh = 0; hh < kHalves; ++hh) {
      const int row = static_cast<int>((static_cast<float>(2 * kc + hh) + 0.5f) * a.inv_half_groups);
      pbuf[d][hh] = ld_u16((scale_lane ? p.scales : p.zeros) + (pofs + static_cast<int64_t>(row) * p.npad));
    }
  };
  if (active) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
      if (kb + d < ke) issue(d, kb + d);
  }
  if (a.pdl) pdl_wait_for_producers();

  // x rows [0, m) of k range [zb, ze) chunks, then a zero row that tokens past m read (the whole range: their
  // ldmatrix addresses step by one chunk like the others', so the step is a constant, not a register).
  // cp.async: every 16-byte copy of the thread leaves at once (no register round trip per copy: k 14336 is 7 per
  // thread), landing while the weight ring fills.
  const int len8 = (ze - zb) * (kChunkK / 8);
  for (int r = 0; r < p.m; ++r)
    for (int q = threadIdx.x; q < len8; q += kThreads)
      cp_async16(xs + r * a.x_row + q * 8, p.x + r * p.ldx + zb * kChunkK + q * 8);
  cp_async_commit();
  __half* zero_row = xs + p.m * a.x_row;
  if (p.m < 8)
    for (int q = threadIdx.x; q < len8; q += kThreads) reinterpret_cast<uint4*>(zero_row)[q] = make_uint4(0, 0, 0, 0);
  cp_async_wait<0>();
  __syncthreads();

  // ldmatrix.x4 rows: lane l addresses token l & 7 of matrix l >> 3 = (k16 step parity, k half): its regs are then
  // b0, b1 of step 2j and b0, b1 of step 2j + 1 for the j-th ldmatrix of a chunk.
  const int tok = lane & 7, mat = lane >> 3;
  const bool tok_valid = tok < p.m;
  constexpr uint32_t xstep = kChunkK * 2;  // bytes per chunk
  uint32_t xaddr = smem_addr((tok_valid ? xs + tok * a.x_row : zero_row) + 16 * (mat >> 1) + 8 * (mat & 1)) +
                   (kb - zb) * xstep;

  const int g = lane >> 2;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (active) {
    for (int base = kb; base < ke; base += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int kc = base + d;
        if (kc >= ke) break;
        const uint4 wv = wbuf[d];
        uint32_t pv[kHalves];
#pragma unroll
        for (int hh = 0; hh < kHalves; ++hh) pv[hh] = pbuf[d][hh];
        if (!kLateRefill && kc + kDepth < ke) issue(d, kc + kDepth);
        // (s, z) of row lane & 15 in lanes 0-15 (z negated: w = fma(q, s, s * -z)), then rows g and g + 8 per lane.
        __half2 s_lo[kHalves], add_lo[kHalves], s_hi[kHalves], add_hi[kHalves];
#pragma unroll
        for (int hh = 0; hh < kHalves; ++hh) {
          const uint32_t sz = __byte_perm(pv[hh], __shfl_xor_sync(0xffffffffu, pv[hh], 16), 0x5410) ^
                              (kMins ? 0u : 0x80000000u);
          row_params<kMins>(__shfl_sync(0xffffffffu, sz, g), s_lo[hh], add_lo[hh]);
          row_params<kMins>(__shfl_sync(0xffffffffu, sz, g + 8), s_hi[hh], add_hi[hh]);
        }
        uint32_t b[2][4];
        ldmatrix_x4(xaddr, b[0][0], b[0][1], b[0][2], b[0][3]);
        ldmatrix_x4(xaddr + 64, b[1][0], b[1][1], b[1][2], b[1][3]);
        xaddr += xstep;
#pragma unroll
        for (int step = 0; step < 4; ++step) {
          const uint32_t word = step == 0 ? wv.x : step == 1 ? wv.y : step == 2 ? wv.z : wv.w;
          uint32_t af[4];
          const int hh = kTwoHalves && step >= 2 ? 1 : 0;  // g32 (or an odd multiple): k 32-63 is the next group
          dequant_word(word, s_lo[hh], add_lo[hh], s_hi[hh], add_hi[hh], af);
          mma_16816(acc, af, b[step >> 1][2 * (step & 1)], b[step >> 1][2 * (step & 1) + 1]);
        }
        if (kLateRefill && kc + kDepth < ke) issue(d, kc + kDepth);
      }
    }
  }

  // The k slices of a tile meet in shared memory (after x), summed in slice order by slice 0's warp.
  if (a.slices > 1) {
    float4* red = reinterpret_cast<float4*>(reinterpret_cast<uint8_t*>(smem_u4) +
                                            ((p.m + 1) * a.x_row * 2 + 15) / 16 * 16);
    red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (slice != 0) return;
    for (int s = 1; s < a.slices; ++s) {
      const float4 v = red[(s * a.tiles + tile) * 32 + lane];
      acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
    }
  }
  if (nt >= n_tiles) return;
  // acc: c0, c1 = row g, tokens 2t, 2t + 1; c2, c3 = row g + 8, the same tokens.
  const int t = lane & 3;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int token = 2 * t + (c & 1), col = nt * kTileN + g + 8 * (c >> 1);
    if (token >= p.m || col >= p.n) continue;
    if (gridDim.y == 1)
      p.y[token * p.ldy + col] = __float2half_rn(acc[c]);
    else
      a.partial[(static_cast<int64_t>(blockIdx.y) * p.m + token) * p.n + col] = acc[c];
  }
}

int x_bytes(int m, int chunks) { return ((m + 1) * (chunks * kChunkK + 8) * 2 + 15) / 16 * 16; }

}  // namespace

GemvPlan gemm_w4a16_gemv_plan(int m, int /*n: no part of the rule today*/, int k, int tiles, int ring, int blocks) {
  LOWBIT_CHECK(tiles == 0 || tiles == 1 || tiles == 2 || tiles == 4 || tiles == 8,
               "gemm_w4a16: the gemv kernel's tiles per CTA must be 0 (automatic), 1, 2, 4 or 8, got ", tiles);
  LOWBIT_CHECK(m >= 1 && m <= kGemvMaxTokens, "gemm_w4a16: the gemv kernel takes 1-", kGemvMaxTokens,
               " tokens, got m=", m);
  // The group row of a chunk is found in f32 ((2 kc + half + 0.5) / (group / 32)): exact while k stays below ~46K.
  LOWBIT_CHECK(k <= kGemvMaxK, "gemm_w4a16: the gemv kernel takes k up to ", kGemvMaxK, ", got k=", k);
  // The automatic configuration: 32 warps per SM (r4b4) was the fastest or within 1% of it on every Llama shape it
  // takes unsplit at one token (H200, round 4); where its ~47 KB of x per CTA would split k over CTAs (k 14336: down),
  // 24 warps (r6b3) keep one CTA along k and were 0.4-5% faster.
  const GemvShape s = plan_gemv_shape("gemm_w4a16", kGemvConfigs, k / kChunkK, ring, blocks,
                                      [&](int b, int chunks) { return x_bytes(m, chunks) <= x_budget(b); });
  // One tile per CTA (8 k slices): measured best or within 3% of the best T on every Llama-3-8B / 70B-TP2 shape
  // at one token (H200; more tiles per CTA, i.e. longer runs per warp, gained nothing: docs/benchmarks_gpu.md).
  if (tiles == 0) tiles = 1;
  return {tiles, s.split, s.chunks_per_split, s.config};
}

namespace {
template <int kRing, int kBlocks>
void launch_config(const W4A16Problem& p, const Args& args, dim3 grid, int smem, bool pdl, cudaStream_t stream) {
  const char* op = "gemm_w4a16";
  const bool two_halves = p.group % kChunkK != 0;  // halves_differ
  auto kernel = p.mins ? (two_halves ? gemm_w4a16_gemv_kernel<true, true, kRing, kBlocks>
                                     : gemm_w4a16_gemv_kernel<true, false, kRing, kBlocks>)
                       : (two_halves ? gemm_w4a16_gemv_kernel<false, true, kRing, kBlocks>
                                     : gemm_w4a16_gemv_kernel<false, false, kRing, kBlocks>);
  raise_dynamic_smem_limit(op, kernel, smem);  // smem varies by launch (cuda/smem_limit.h)
  launch_maybe_pdl(op, pdl, kernel, grid, dim3(kThreads), static_cast<size_t>(smem), stream, args);
}
}  // namespace

void gemm_w4a16_gemv(const W4A16Problem& p, float* partial, const GemvPlan& plan, bool pdl, cudaStream_t stream) {
  const char* op = "gemm_w4a16";
  const int k_chunks = p.k / kChunkK, n_tiles = (p.n + kTileN - 1) / kTileN;
  const int x_row = plan.chunks_per_split * kChunkK + 8;
  const int smem = x_bytes(p.m, plan.chunks_per_split) + (plan.tiles < kWarps ? kRedBytes : 0);
  LOWBIT_CHECK(plan.split <= 65535, op, ": split too large");
  const Args args{p, partial, k_chunks, plan.tiles, kWarps / plan.tiles, plan.chunks_per_split, x_row,
                  1.f / static_cast<float>(p.group / 32), pdl};
  const dim3 grid(static_cast<unsigned>((n_tiles + plan.tiles - 1) / plan.tiles), static_cast<unsigned>(plan.split));
  // One case per kGemvConfigs entry (gemm_w4a16_gemv_sm80.h), in its order.
  static_assert(kGemvConfigCount == 7, "a launch case per configuration");
  switch (plan.config) {
    case 0: launch_config<kGemvConfigs[0].depth, kGemvConfigs[0].blocks>(p, args, grid, smem, pdl, stream); break;
    case 1: launch_config<kGemvConfigs[1].depth, kGemvConfigs[1].blocks>(p, args, grid, smem, pdl, stream); break;
    case 2: launch_config<kGemvConfigs[2].depth, kGemvConfigs[2].blocks>(p, args, grid, smem, pdl, stream); break;
    case 3: launch_config<kGemvConfigs[3].depth, kGemvConfigs[3].blocks>(p, args, grid, smem, pdl, stream); break;
    case 4: launch_config<kGemvConfigs[4].depth, kGemvConfigs[4].blocks>(p, args, grid, smem, pdl, stream); break;
    case 5: launch_config<kGemvConfigs[5].depth, kGemvConfigs[5].blocks>(p, args, grid, smem, pdl, stream); break;
    case 6: launch_config<kGemvConfigs[6].depth, kGemvConfigs[6].blocks>(p, args, grid, smem, pdl, stream); break;
    default: LOWBIT_CHECK(false, op, ": bad gemv configuration ", plan.config);
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda::detail
