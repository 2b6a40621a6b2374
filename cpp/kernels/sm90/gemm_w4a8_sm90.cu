// W4A8 GEMM for Hopper (sm_90a): wgmma with the weight as a register A operand, dequantized in
// registers (LiquidGEMM's design, §5), and the s8 activations as the shared-memory B operand.
//
// Yᵀ = W · Xᵀ: a CTA owns 128 weight rows (two consumer warpgroups of 64, one wgmma m64 each) x BT
// tokens (the wgmma n: 128 or 256; 16, 32 or 64 for decode-sized batches, two CTAs per SM) x its k range,
// in stages of 128 k (two packed 64-k chunks). Three
// producer threads (lane 0 of warps 0-2) fill each stage, one copy kind each: the activation tile by TMA
// (128-byte swizzle, zero fill past m and k, the layout wgmma's descriptor reads), the stage's packed u4
// weight tiles by one 3-D TMA box over pack_sm80_w4a8's [tile][chunk] layout, and the u8 steps and offsets
// of its groups by 1-D bulk copies (one thread issuing all of them was the stage's bound: produce_part;
// 'sm90o' names keep that producer for A/B). The layout's k order is the wgmma A fragment's, so each consumer lane turns its
// 16 bytes per chunk into the fragment registers with one IMAD and one XOR per four weights,
// (q*s + a) ^ 0x80808080, then issues the stage's four m64nBTk32 wgmmas; while they run it dequantizes
// the next stage into a second fragment set (the dequant hides under the tensor-core work, and the
// other consumer warpgroup's wgmmas fill the gaps), keeping one stage's wgmmas in flight across the next
// issue (wait_group 1). The tile (128 or 256 tokens) and split come from a cost model (sm90_common.cuh; it may plan
// two launches: whole unsplit waves, then the rest split, or one stream-K launch: sm90_streamk.cuh); at 5-64 tokens
// the small tiles have a model of their own (plan_small). One-tile-per-CTA launches may run as programmatic dependents
// (Args::pdl): only the activation copies wait for the kernel before. Accumulation is
// int32
// (exact); split-K runs as a thread-block cluster along k whose int32 partial tiles are summed
// through distributed shared memory, as in gemm_w8a8_sm90.cu. The scales apply once, at the end;
// without split, the f16 tile leaves through shared memory as 16-byte row segments. Token tiles vary
// fastest in the grid (CTAs resident together share weight tiles in L2). Opt-in ('sm90p' names; measured no faster): a
// persistent grid of the resident CTAs walking whole tiles, its producers filling the next tile's stages during an
// epilogue staged in smem of its own (gemm_w4a8_sm90_persistent_kernel). Opt-in ('sm90m' names; measured no faster):
// pairs of CTAs on neighbouring weight-row tiles sharing the activation tile by TMA multicast
// (gemm_w4a8_sm90_pair_kernel). Opt-in ('sm90q' / 'sm90r' names: kTune; measured 1-8% slower): the weight and
// parameter producers prefetch later stages into L2, the unsplit epilogue's scales staged in smem, and ('sm90r') each
// weight-row tile's k blocks walked from its own start.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "cuda/pdl.cuh"
#include "kernels/sm90/gemm_w4a8_sm90.h"
#include "kernels/sm90/sm90_common.cuh"
#include "kernels/sm90/sm90_producer.cuh"
#include "kernels/sm90/sm90_streamk.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda::detail {
namespace {

using namespace sm90;

constexpr int kRows = 128;        // weight rows per CTA: two consumer warpgroups of 64
constexpr int kTiles = kRows / 16;  // packed 16-row tiles per CTA
constexpr int kBK = 128;          // k per stage: two 64-k chunks
constexpr int kChunkBytes = 512;  // one packed 16-row x 64-k tile
constexpr int kThreads = 384;     // warpgroup 0: producer (one thread issues the copies), 1-2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kSmemBudget = 215040;
constexpr int kSmallSmemBudget = 112640;  // two CTAs per SM: each under half of 228 KB with its 1 KB reserve

// Small token tiles (16, 32, 64 tokens: 5-64 tokens, where the weight's bytes bound the time) run two CTAs per SM, so
// that a gate_up-sized layer's 224 unsplit tiles fit one wave and split plans find slots at a finer grain: half the
// shared memory (up to 16 stages of a smaller stage) and registers (launch bounds of 2 x 384 threads: 80 a thread at
// entry; the consumers take 96, the producers keep 40). The 128 / 256-token tiles keep one CTA per SM.
template <int BT>
struct Config {
  static constexpr bool kSmall = BT < 128;
  static constexpr int kCtasPerSm = kSmall ? 2 : 1;
  static constexpr int kProducerRegs = 40, kConsumerRegs = kSmall ? 96 : 232;
  static constexpr int kXBytes = BT * kBK;                  // activation tile (swizzled, 1024-aligned)
  static constexpr int kWBytes = kTiles * 2 * kChunkBytes;  // [tile][chunk][lane] 16-byte units
  static constexpr int kPBytes = 2 * 2 * kRows;             // [chunk][step | offset][row] u8
  static constexpr int kStageBytes = (kXBytes + kWBytes + kPBytes + 1023) / 1024 * 1024;
  static constexpr int kStages =
      kSmall ? std::min(16, kSmallSmemBudget / kStageBytes) : std::min(8, kSmemBudget / kStageBytes);
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
  static constexpr int kScaleBytes = (BT + kRows) * 4;  // tuned launches: the tile's x_scale and channel_scale
  static_assert(kRows * BT * 4 <= kStages * kStageBytes, "split-K reduction must fit in the pipeline smem");
  static_assert(BT * (kRows + 8) * 2 <= kStages * kStageBytes, "the staged output tile must fit in the pipeline smem");
  static_assert(!kSmall || 2 * (kSmemBytes + 1024) <= 233472, "two small-tile CTAs must fit one SM's shared memory");
  static_assert(!kSmall || 128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 80, "the register split must fit the "
                "80 registers a thread that two CTAs per SM start with");
};

struct Args {
  W4A8Problem p;
  int k_blocks, k_chunks, split;
  int tile_base, tiles_m;  // this launch's first tile; token tiles per weight-row tile
  bool vector_y;  // f16 y rows 16-byte aligned: the staged epilogue stores 8 halves at a time
  bool shared_params;  // both chunks of a stage in one group (group % 128 == 0): chunk 0's parameters serve both
  // Tuned launches (kTune > 0; groups of 64 * 2^j only): log2(group / 64), a chunk's group row by a shift.
  int cshift = 0;
  // Launched as a programmatic dependent (Sm90Choice::pdl): the activation producer (and the tuned launches' consumers,
  // which stage x's scales first) waits for the kernel before; the weight and parameter producers do not.
  bool pdl = false;
};

#ifdef LOWBIT_SM90_DEVICE
// D += A · Bᵀ for one k32 step: A (64 weight rows x 32 k, s8) from the four fragment registers, B
// (BT tokens x 32 k, s8) from shared memory through descriptor db.
// (n16 / n32 / n64: the small token tiles.)
__device__ inline void wgmma_rs(int (&d)[8], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, "
      "p;\n}\n"
      : LOWBIT_ACC8("+r", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(int (&d)[16], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 " LOWBIT_REGS16 ", {%16, %17, %18, %19}, %20, p;\n}\n"
      : LOWBIT_ACC16("+r", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(int (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 " LOWBIT_REGS32 ", {%32, %33, %34, %35}, %36, p;\n}\n"
      : LOWBIT_ACC32("+r", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(int (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " LOWBIT_REGS64 ", {%64, %65, %66, %67}, %68, p;\n}\n"
      : LOWBIT_ACC64("+r", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(int (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 " LOWBIT_REGS128
      ", {%128, %129, %130, %131}, %132, p;\n}\n"
      : LOWBIT_ACC128("+r", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// Four u4 codes, one per byte, to four s8 weights (no byte carries: q*s + a <= 255 by construction).
__device__ inline uint32_t dequant_bytes(uint32_t codes, uint32_t step, uint32_t offset4) {
  return (codes * step + offset4) ^ 0x80808080u;
}

// Writes accumulator v of lane `lane` in consumer warp gw: weight row gw*16 + lane/4 (+8 when
// v%4 >= 2), token (v/4)*8 + 2*(lane%4) + v%2 (the wgmma accumulator layout).
__device__ inline void store_acc(const W4A8Problem& p, int n0, int m0, int gw, int lane, int v, int acc) {
  const int n = n0 + gw * 16 + (lane >> 2) + ((v >> 1) & 1) * 8;
  const int m = m0 + (v >> 2) * 8 + (lane & 3) * 2 + (v & 1);
  if (n >= p.n || m >= p.m) return;
  if (p.raw)
    static_cast<int32_t*>(p.y)[m * p.ldy + n] = acc;
  else
    static_cast<__half*>(p.y)[m * p.ldy + n] =
        __float2half_rn(static_cast<float>(acc) * p.x_scale[m] * p.channel_scale[n]);
}

// Turns a stage's packed weights of consumer warp gw's 16-row tile into wgmma A fragments:
// a[(2c + j) * 4 + r] is register r of chunk c, k32 step j ((q*s + a) ^ 0x80 on every byte).
// A one-chunk tail stage (k ends 64 past a multiple of 128) needs no case of its own: chunk 1's fragments come out of
// zero-filled weights and stale parameters, but x's tile past k arrives as zeros (the TMA box past the tensor's k),
// so they add exactly nothing to the int32 sums.
template <class C>
__device__ __forceinline__ void dequant_stage(const uint8_t* st, int gw, int lane, uint32_t (&a)[16],
                                              bool shared_params = false) {
  const uint4* ws = reinterpret_cast<const uint4*>(st + C::kXBytes);
  const uint8_t* ps = st + C::kXBytes + C::kWBytes;
  const int row = gw * 16 + (lane >> 2);
  uint32_t s_g = 0, s_g8 = 0, a_g = 0, a_g8 = 0;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint4 wv = ws[(gw * 2 + c) * 32 + lane];
    if (c == 0 || !shared_params) {  // shared: only chunk 0's parameters were copied
      const uint8_t* pc = ps + c * 2 * kRows;
      s_g = pc[row], s_g8 = pc[row + 8];
      a_g = pc[kRows + row] * 0x01010101u, a_g8 = pc[kRows + row + 8] * 0x01010101u;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t w_g = j ? wv.z : wv.x, w_g8 = j ? wv.w : wv.y;
      uint32_t* f = a + (2 * c + j) * 4;
      f[0] = dequant_bytes(w_g & 0x0f0f0f0fu, s_g, a_g);
      f[1] = dequant_bytes(w_g8 & 0x0f0f0f0fu, s_g8, a_g8);
      f[2] = dequant_bytes((w_g >> 4) & 0x0f0f0f0fu, s_g, a_g);
      f[3] = dequant_bytes((w_g8 >> 4) & 0x0f0f0f0fu, s_g8, a_g8);
    }
  }
}

template <int N>
__device__ __forceinline__ void wgmma_frag(int (&acc)[N], const uint32_t (&a)[16], int i, uint64_t db) {
  const uint32_t f[4] = {a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]};
  wgmma_rs(acc, f, db + 2 * i);  // k32 step i of the stage: +32 bytes of k in the swizzled row
}

// Releases a stage to the producers: every consumer thread arrives on its own CTA's barrier (256). In a multicast pair
// (kPair) the partner's producer also writes into the stage (our half of the activation tile, which we read only
// through wgmma, complete by now), so lane 0 of each consumer warp also arrives on the partner's barrier (empty counts
// 256 + 8), without a cluster-scope fence (mbar_arrive_remote).
template <bool kPair>
__device__ __forceinline__ void release_stage(uint64_t* bar, int lane, int peer) {
  mbar_arrive(bar);
  if constexpr (kPair) {
    __syncwarp();
    if (lane == 0) mbar_arrive_remote(bar, peer);
  }
}

// One stage of one consumer warpgroup: issue the wgmmas of the stage at `pos` from `cur`, advance `pos`, and
// dequantize the next stage (has_next) into `next` while they run.
// Serial (kOverlap false): then wait for them and release the stage, so the warpgroup's tensor work stops between
// stages. Overlapped: wait only for the previous stage's wgmmas (at most one group pending), which read `next` and
// that stage, release it (release_prev: not at a run's first stage), then dequantize: this stage's wgmmas stay in
// flight into the next stage's issue (same-shape wgmmas on the same accumulators are ordered by the hardware). Every
// consumer thread arrives on the empty barrier: each one's shared-memory reads of the stage are ordered before it.
template <bool kOverlap, class C, int N, bool kPair = false>
__device__ __forceinline__ void consumer_step(int (&acc)[N], const uint32_t (&cur)[16], uint32_t (&next)[16],
                                              const StageRing<C>& ring, RingPos& pos, bool release_prev,
                                              bool has_next, int gw, int lane, bool shared_params = false,
                                              int peer = 0) {
  const int s = pos.s;
  const uint64_t db = ring.desc(s);
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < 4; ++i) wgmma_frag(acc, cur, i, db);
  wgmma_commit();
  pos = StageRing<C>::next(pos);
  if constexpr (kOverlap) {
    wgmma_wait<1>();
    if (release_prev) release_stage<kPair>(&ring.empty[StageRing<C>::prev(s)], lane, peer);
  }
  if (has_next) {
    mbar_wait(&ring.full[pos.s], pos.parity);
    dequant_stage<C>(ring.stage(pos.s), gw, lane, next, shared_params);
    fence_regs(next);  // complete here: ptxas would sink the last XORs past the next stage's first wgmma (C7519)
  }
  if constexpr (!kOverlap) {
    wgmma_wait<0>();
    fence_regs(acc);
    release_stage<kPair>(&ring.empty[s], lane, peer);
  }
}

// One tile's mainloop over the running stages [g, g_end) of a kernel that walks several tiles (stream-K segments,
// persistent tiles): zeroes acc, runs the overlapped consumer steps, and after the last wgmmas release the run's last
// stage, so the producers may fill the next run's stages while this one's epilogue runs.
template <class C, int N>
__device__ __forceinline__ void consume_run(int (&acc)[N], uint32_t (&fa)[16], uint32_t (&fb)[16], int g, int g_end,
                                            const StageRing<C>& ring, int gw, int lane, bool shared) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0;
  fence_regs(acc);
  RingPos pos = StageRing<C>::at(g);
  mbar_wait(&ring.full[pos.s], pos.parity);
  dequant_stage<C>(ring.stage(pos.s), gw, lane, fa, shared);
  for (int it = g; it < g_end; it += 2) {
    consumer_step<true, C>(acc, fa, fb, ring, pos, it > g, it + 1 < g_end, gw, lane, shared);
    if (it + 1 >= g_end) break;
    consumer_step<true, C>(acc, fb, fa, ring, pos, true, it + 2 < g_end, gw, lane, shared);
  }
  wgmma_wait<0>();
  fence_regs(acc);
  mbar_arrive(&ring.empty[StageRing<C>::prev(pos.s)]);
}

// Part `part` of stage kb's copies (sm90_producer.cuh): 128 k of x, its two packed 64-k chunks, then the u8 steps and
// offsets of its `chunks` chunks (chunk 0's only when shared_params: both chunks in one group), prow bytes each.
// Tuned launches (kTuned): pf_kb >= 0 names a later stage (pf_chunks chunks) whose weight box (part 1) or parameters
// (part 2) are prefetched into L2 after this stage's copies are issued, and a chunk's group row is chunk >> cshift.
template <class C, bool kTuned = false>
__device__ __forceinline__ void produce_part(int part, uint8_t* st, uint64_t* bar, const CUtensorMap* map_x,
                                             const CUtensorMap* map_w, const W4A8Problem& p, int kb, int m0, int n0,
                                             int chunks, int prow, bool shared_params, int pf_kb = -1,
                                             int pf_chunks = 0, int cshift = 0) {
  const auto group_row = [&](int chunk) {
    return static_cast<int64_t>(kTuned ? chunk >> cshift : chunk * 64 / p.group) * p.npad + n0;
  };
  produce_stage_part<C>(part, st, bar, map_x, map_w, kb * kBK, m0, 2 * kb, n0, [&] {
    uint8_t* ps = st + C::kXBytes + C::kWBytes;
    const int copies = shared_params ? 1 : chunks;
    mbar_expect_tx(bar, copies * 2 * prow);
    for (int c = 0; c < copies; ++c) {
      const int64_t row0 = group_row(2 * kb + c);
      bulk_load(ps + c * 2 * kRows, p.steps + row0, prow, bar);
      bulk_load(ps + c * 2 * kRows + kRows, p.offsets + row0, prow, bar);
    }
  });
  if (!kTuned || pf_kb < 0) return;
  if (part == 1) {
    tma_prefetch_3d(map_w, 0, 2 * pf_kb, n0 / 16);
  } else if (part == 2) {
    for (int c = 0; c < (shared_params ? 1 : pf_chunks); ++c) {
      const int64_t row0 = group_row(2 * pf_kb + c);
      bulk_prefetch_l2(p.steps + row0, prow);
      bulk_prefetch_l2(p.offsets + row0, prow);
    }
  }
}

// The consumers' epilogue. Split 1: each lane stores its accumulators. Split-K: split rank j reduces
// rows [j, j+1) * 128/split of the tile; slot r of CTA j holds split rank r's partial of that slice as
// [warp in slice][v/4][lane] int4 (the pipeline smem is idle by then; the producer warpgroup joins
// the two cluster barriers).
// Split 1, f16 y: the scaled tile leaves through shared memory as 16-byte row segments.
template <int BT>
__device__ inline void store_tile_staged(const W4A8Problem& p, bool vector_y, uint8_t* smem, int n0, int m0, int gw,
                                         int lane, const int (&acc)[BT / 2]) {
  const int r_lo = n0 + gw * 16 + (lane >> 2), r_hi = r_lo + 8;  // channel_scale holds npad rows
  const float cs_lo = r_lo < p.npad ? p.channel_scale[r_lo] : 0.f, cs_hi = r_hi < p.npad ? p.channel_scale[r_hi] : 0.f;
  store_rows_through_smem<kRows, BT, kConsumerWarps>(
      smem, static_cast<__half*>(p.y), p.ldy, p.m, p.n, m0, n0, gw, lane, vector_y, [&](int v, int token) {
        const float xs = m0 + token < p.m ? p.x_scale[m0 + token] : 0.f;
        return __float2half_rn(static_cast<float>(acc[v]) * xs * (((v >> 1) & 1) ? cs_hi : cs_lo));
      });
}

// The same epilogue with the tile's scales read from smem (tuned launches): x_scale [BT] then channel_scale [kRows],
// staged by stage_tile_scales before the mainloop (zeros past m and npad), in place of global loads after the last
// wgmma. The same products, so the same f16 values.
template <int BT>
__device__ inline void store_tile_staged_scales(const W4A8Problem& p, bool vector_y, uint8_t* smem, int n0, int m0,
                                                int gw, int lane, const int (&acc)[BT / 2], const float* scales) {
  const int r_lo = gw * 16 + (lane >> 2);
  const float cs_lo = scales[BT + r_lo], cs_hi = scales[BT + r_lo + 8];
  store_rows_through_smem<kRows, BT, kConsumerWarps>(
      smem, static_cast<__half*>(p.y), p.ldy, p.m, p.n, m0, n0, gw, lane, vector_y, [&](int v, int token) {
        return __float2half_rn(static_cast<float>(acc[v]) * scales[token] * (((v >> 1) & 1) ? cs_hi : cs_lo));
      });
}

// The consumers (thread t of 256) copy the tile's scales into `scales` (store_tile_staged's layout), then sync.
template <int BT>
__device__ inline void stage_tile_scales(const W4A8Problem& p, float* scales, int m0, int n0, int t) {
  for (int i = t; i < BT + kRows; i += kConsumerWarps * 32) {
    const int r = n0 + i - BT;
    scales[i] = i < BT ? (m0 + i < p.m ? p.x_scale[m0 + i] : 0.f) : (r < p.npad ? p.channel_scale[r] : 0.f);
  }
  consumer_sync();
}

template <int BT>
__device__ inline void store_tile(const W4A8Problem& p, bool vector_y, uint8_t* smem, int n0, int m0, int gw,
                                  int lane, int rank, int split, const int (&acc)[BT / 2]) {
  constexpr int kR = BT / 2;
  if (split == 1 && !p.raw) {
    store_tile_staged<BT>(p, vector_y, smem, n0, m0, gw, lane, acc);
    return;
  }
  if (split == 1) {
#pragma unroll
    for (int v = 0; v < kR; ++v) store_acc(p, n0, m0, gw, lane, v, acc[v]);
    return;
  }
  reduce_split_k<kConsumerWarps, int4>(smem, gw, lane, rank, split, acc, [&](int w, int ln, int v, int4 sum) {
    store_acc(p, n0, m0, w, ln, v, sum.x);
    store_acc(p, n0, m0, w, ln, v + 1, sum.y);
    store_acc(p, n0, m0, w, ln, v + 2, sum.z);
    store_acc(p, n0, m0, w, ln, v + 3, sum.w);
  });
}
#endif  // LOWBIT_SM90_DEVICE

// Grid: x = tiles [tile_base, tile_base + gridDim.x) of BT tokens x 128 weight rows (token tiles fastest),
// z = split (one cluster along z). kSplitProducer: three producer threads (produce_part), else the one thread of
// the earlier rounds (kept for A/B timing: kernel names 'sm90o...'). kTune (split producer and overlapped mainloop
// only; 0 is the kernel as before): 1 ('sm90q', and the automatic plan's unsplit one-launch tiles) the weight and
// parameter producers prefetch stage kb + kStages into L2 after issuing stage kb, group rows by a shift (cshift), the
// unsplit f16 epilogue's scales staged in smem before the mainloop; 2 ('sm90r') also each weight-row tile walks its k
// blocks from block (row tile % nk) on, wrapping, so that CTAs running together read different activation blocks (the
// int32 sums do not depend on the order).
template <int BT, bool kOverlap, bool kSplitProducer = true, int kTune = 0>
__global__ void __launch_bounds__(kThreads, Config<BT>::kCtasPerSm)
    gemm_w4a8_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                          const Args args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = Config<BT>;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kR = BT / 2;
  const W4A8Problem& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  const int split = args.split, rank = static_cast<int>(blockIdx.z);
  const int tile = args.tile_base + static_cast<int>(blockIdx.x);  // token tiles vary fastest
  const int m0 = tile % args.tiles_m * BT, n0 = tile / args.tiles_m * kRows;
  const int kb0 = rank * args.k_blocks / split, nk = (rank + 1) * args.k_blocks / split - kb0;
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;
  static_assert(kTune == 0 || (kOverlap && kSplitProducer), "tuned launches: overlapped mainloop, split producer");
  const int rot = kTune == 2 && nk > 0 ? (tile / args.tiles_m) % nk : 0;
  const auto kb_of = [&](int it) { return kb0 + (it + rot < nk ? it + rot : it + rot - nk); };  // it's k block
  constexpr int kAhead = kTune > 0 ? kStages : 0;  // L2 prefetch distance in stages

  init_pipeline<kStages>(&map_x, &map_w, full, empty, kSplitProducer ? kProducerParts : 1, kConsumerWarps * 32);

  int acc[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) acc[i] = 0;
  const int gw = (wg - 1) * 4 + ((threadIdx.x >> 5) & 3);  // consumer warp = its 16-row weight tile

  // The producer warpgroup needs few registers; the consumers' 64 x BT int32 tile needs many.
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs) : "memory");
    const int part = threadIdx.x >> 5;
    if (kSplitProducer && lane == 0 && part < kProducerParts) {  // producers: one part of each stage
      const int prow = min(kRows, p.npad - n0);
      if (args.pdl && part == 0) pdl_wait_for_producers();  // x comes from the kernel before
      for (int it = 0, s = 0, phase = 1; it < nk; ++it) {
        const int kb = kb_of(it);
        const int pk = kAhead > 0 && it + kAhead < nk ? kb_of(it + kAhead) : -1;
        mbar_wait(&empty[s], phase);
        produce_part<C, (kTune > 0)>(part, smem + s * kStageBytes, &full[s], &map_x, &map_w, p, kb, m0, n0,
                                     min(2, args.k_chunks - 2 * kb), prow, args.shared_params, pk,
                                     pk >= 0 ? min(2, args.k_chunks - 2 * pk) : 0, args.cshift);
        if (++s == kStages) s = 0, phase ^= 1;
      }
    }
    if (!kSplitProducer && threadIdx.x == 0) {  // producer
      if (args.pdl) pdl_wait_for_producers();
      const int tile0 = n0 / 16;
      const int prow = min(kRows, p.npad - n0);  // param bytes per row range (a multiple of 16)
      for (int it = 0; it < nk; ++it) {
        const int s = it % kStages, kb = kb0 + it;
        const int chunks = min(2, args.k_chunks - 2 * kb);
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        uint8_t* st = smem + s * kStageBytes;
        // TMA boxes count in full (tiles past n and a chunk past k arrive as zeros).
        mbar_expect_tx(&full[s], C::kXBytes + C::kWBytes + chunks * 2 * prow);
        tma_load_2d(st, &map_x, kb * kBK, m0, &full[s]);
        uint8_t* ws = st + C::kXBytes;
        tma_load_3d(ws, &map_w, 0, 2 * kb, tile0, &full[s]);
        uint8_t* ps = ws + C::kWBytes;
        for (int c = 0; c < chunks; ++c) {
          const int64_t row0 = static_cast<int64_t>((2 * kb + c) * 64 / p.group) * p.npad + n0;
          bulk_load(ps + c * 2 * kRows, p.steps + row0, prow, &full[s]);
          bulk_load(ps + c * 2 * kRows + kRows, p.offsets + row0, prow, &full[s]);
        }
      }
    }
    if (split > 1) {  // the two cluster barriers of the consumers' split-K reduction
      cooperative_groups::this_cluster().sync();
      cooperative_groups::this_cluster().sync();
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs) : "memory");
    // Software pipeline over stages: while stage i's wgmmas run, stage i+1 is dequantized into the
    // other fragment set (the wgmmas read their A registers asynchronously, so the two sets alternate).
    uint32_t fa[16], fb[16];
    const StageRing<C> ring(smem, full, empty);
    // tuned, unsplit f16: the tile's scales in smem, loaded while the first stages are in flight
    float* scales = reinterpret_cast<float*>(empty + kStages);
    const bool smem_scales = kTune > 0 && split == 1 && !p.raw;
    if (smem_scales && args.pdl) pdl_wait_for_producers();  // x_scale comes from the kernel before
    if (smem_scales) stage_tile_scales<BT>(p, scales, m0, n0, static_cast<int>(threadIdx.x) - 128);
    fence_regs(acc);
    const bool shared = kSplitProducer && args.shared_params;
    RingPos pos = {0, 0};
    if (nk > 0) {
      mbar_wait(&full[0], 0);
      dequant_stage<C>(ring.stage(0), gw, lane, fa, shared);
    }
    for (int it = 0; it < nk; it += 2) {
      consumer_step<kOverlap, C>(acc, fa, fb, ring, pos, it > 0, it + 1 < nk, gw, lane, shared);
      if (it + 1 >= nk) break;
      consumer_step<kOverlap, C>(acc, fb, fa, ring, pos, true, it + 2 < nk, gw, lane, shared);
    }
    if constexpr (kOverlap) {  // the last stage's wgmmas
      wgmma_wait<0>();
      fence_regs(acc);
      if (nk > 0) mbar_arrive(&empty[StageRing<C>::prev(pos.s)]);
    }
    pdl_allow_dependents();  // the next kernel may launch during the epilogue (it waits for this grid's end)
    if (smem_scales)
      store_tile_staged_scales<BT>(p, args.vector_y, smem, n0, m0, gw, lane, acc, scales);
    else
      store_tile<BT>(p, args.vector_y, smem, n0, m0, gw, lane, rank, split, acc);
  }

#endif
}

// Resident CTAs per split (1, 2, 4, 8) of the BT-token kernel, measured once.
template <int BT, bool kOverlap>
void slots_of(const char* op, int (&slots)[4]) {
  static DeviceSlots slot_cache = {};
  resident_slots(op, gemm_w4a8_sm90_kernel<BT, kOverlap>, kThreads, Config<BT>::kSmemBytes, slot_cache, slots);
}

// Groups of a multiple of 128 k put both 64-k chunks of a 128-k stage in one group.
inline bool stage_in_one_group(const W4A8Problem& p) { return p.group % kBK == 0; }

// log2(group / 64) when group / 64 is a power of two, else -1 (the producers then divide).
inline int chunk_group_shift(const W4A8Problem& p) {
  const int cpg = p.group / 64;
  if (p.group % 64 != 0 || cpg <= 0 || (cpg & (cpg - 1)) != 0) return -1;
  int shift = 0;
  while ((1 << shift) < cpg) ++shift;
  return shift;
}

// kTune: gemm_w4a8_sm90_kernel's (its smem holds the tile's scales past the barriers when > 0).
template <int BT, bool kOverlap, bool kSplitProducer, int kTune = 0>
void launch(const W4A8Problem& p, int split, int tile_base, int tiles, bool pdl, cudaStream_t stream) {
  const char* op = "gemm_w4a8";
  auto kernel = gemm_w4a8_sm90_kernel<BT, kOverlap, kSplitProducer, kTune>;
  constexpr int kSmem = Config<BT>::kSmemBytes + (kTune > 0 ? Config<BT>::kScaleBytes : 0);
  static_assert(kSmem <= 232448, "the tuned kernel's smem exceeds the sm_90 per-block limit");
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int tiles_m = (p.m + BT - 1) / BT;
  const int k_blocks = (p.k + kBK - 1) / kBK;
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;

  const bool vector_y = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  Args args{p, k_blocks, p.k / 64, split, tile_base, tiles_m, vector_y, kSplitProducer && stage_in_one_group(p)};
  if (kTune > 0) args.cshift = chunk_group_shift(p);
  args.pdl = pdl;
  const CUtensorMap map_x = make_map(op, p.x, p.m, p.k, p.ldx, BT);
  const CUtensorMap map_w = make_packed_weight_map(op, p.w, (p.n + 15) / 16, p.k / 64, kChunkBytes, kTiles, 2);
  launch_split_clusters(op, cfg, kernel, p.n, tiles, 1, split, pdl, map_x, map_w, args);
}

// ---- Multicast pairs ('sm90m' names, opt-in; measured 0-4% slower): two CTAs on neighbouring weight-row tiles ----
//
// Each CTA of the default grid reads its BT x 128 activation tile through L2 for every 128 weight rows: per stage 16
// (BT 128) or 32 KB of activations against 8 KB of packed weights. A pair (a cluster of 2 along x) owns row tiles 2j
// and 2j + 1 at one token tile; CTA r's activation producer loads token rows [r, r + 1) * BT/2 of the stage's tile and
// multicasts them to both CTAs (the 128-byte swizzle depends on smem address bits, so a half box at a 1024-aligned
// offset lands in the full box's layout), so each CTA reads half the activation bytes. Each CTA's full barrier
// expects the whole tile's bytes (both halves signal it); a stage is free only when the consumers of both CTAs have
// released it (release_stage<true>: every local consumer thread, and one arrival per partner consumer warp). Unsplit
// tiles, the overlapped mainloop and the split producer only; the int32 sums run in the same order as
// gemm_w4a8_sm90_kernel's unsplit tile (bit-identical). An odd row-tile count leaves the last pair a spare CTA past
// npad: it loads its half of the activations only (its consumers run on whatever the weight slots hold) and stores
// nothing.
template <int BT>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_w4a8_sm90_pair_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                               const Args args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = Config<BT>;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kR = BT / 2;
  const W4A8Problem& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  const int mc = static_cast<int>(blockIdx.x) & 1, pair = static_cast<int>(blockIdx.x) >> 1;  // token tiles fastest
  const int m0 = pair % args.tiles_m * BT, n0 = (pair / args.tiles_m * 2 + mc) * kRows;
  const int nk = args.k_blocks;
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  init_pipeline<kStages>(&map_x, &map_w, full, empty, kProducerParts, kConsumerWarps * 32 + kConsumerWarps);
  namespace cg = cooperative_groups;
  cg::this_cluster().sync();  // the partner's barriers exist before any multicast or arrival reaches them

  int acc[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) acc[i] = 0;
  const int gw = (wg - 1) * 4 + ((threadIdx.x >> 5) & 3);

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    const int part = threadIdx.x >> 5;
    if (lane == 0 && part < kProducerParts) {
      const int prow = max(0, min(kRows, p.npad - n0));  // 0 on a spare CTA
      for (int kb = 0, s = 0, phase = 1; kb < nk; ++kb) {
        mbar_wait(&empty[s], phase);
        uint8_t* st = smem + s * kStageBytes;
        if (part == 0) {  // our half of the activation tile, to both CTAs; our barrier counts both halves
          mbar_expect_tx(&full[s], C::kXBytes);
          tma_load_2d_multicast(st + mc * (BT / 2) * kBK, &map_x, kb * kBK, m0 + mc * (BT / 2), &full[s], 3);
        } else if (prow > 0) {
          produce_part<C>(part, st, &full[s], &map_x, &map_w, p, kb, m0, n0, min(2, args.k_chunks - 2 * kb), prow,
                          args.shared_params);
        } else {
          mbar_arrive(&full[s]);  // a spare CTA: no weights or parameters (its consumers' sums are never stored)
        }
        if (++s == kStages) s = 0, phase ^= 1;
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    uint32_t fa[16], fb[16];
    const StageRing<C> ring(smem, full, empty);
    const bool shared = args.shared_params;
    const int peer = mc ^ 1;
    fence_regs(acc);
    RingPos pos = {0, 0};
    if (nk > 0) {
      mbar_wait(&full[0], 0);
      dequant_stage<C>(ring.stage(0), gw, lane, fa, shared);
    }
    for (int it = 0; it < nk; it += 2) {
      consumer_step<true, C, kR, true>(acc, fa, fb, ring, pos, it > 0, it + 1 < nk, gw, lane, shared, peer);
      if (it + 1 >= nk) break;
      consumer_step<true, C, kR, true>(acc, fb, fa, ring, pos, true, it + 2 < nk, gw, lane, shared, peer);
    }
    wgmma_wait<0>();
    fence_regs(acc);
    if (nk > 0) release_stage<true>(&empty[StageRing<C>::prev(pos.s)], lane, peer);
    // Every multicast into this CTA's stages has landed (each was awaited on a full barrier): the staged epilogue may
    // reuse them.
    store_tile<BT>(p, args.vector_y, smem, n0, m0, gw, lane, 0, 1, acc);
  }
  cg::this_cluster().sync();  // the partner may arrive on our empty barriers until it has consumed its last stage
#endif
}

// The pair launch: one unsplit launch over whole pairs of row tiles (an odd count gets a spare CTA).
template <int BT>
void launch_pair(const W4A8Problem& p, cudaStream_t stream) {
  const char* op = "gemm_w4a8";
  auto kernel = gemm_w4a8_sm90_pair_kernel<BT>;
  constexpr int kSmem = Config<BT>::kSmemBytes;
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int tiles_m = (p.m + BT - 1) / BT, pairs_n = ((p.n + kRows - 1) / kRows + 1) / 2;
  const int64_t ctas = int64_t{2} * pairs_n * tiles_m;
  LOWBIT_CHECK(ctas <= INT32_MAX, op, ": m=", p.m, " x n=", p.n, " is too large for the sm90 pair grid");
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  const bool vector_y = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  const Args args{p, (p.k + kBK - 1) / kBK, p.k / 64, 1, 0, tiles_m, vector_y, stage_in_one_group(p)};
  const CUtensorMap map_x = make_map(op, p.x, p.m, p.k, p.ldx, BT / 2);
  const CUtensorMap map_w = make_packed_weight_map(op, p.w, (p.n + 15) / 16, p.k / 64, kChunkBytes, kTiles, 2);
  LOWBIT_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, map_x, map_w, args));
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

// ---- Stream-K (sm90_streamk.cuh): a persistent grid of the resident CTAs, equal k-block ranges ----

// Config<BT>'s stages, fewer so the epilogue tile has smem of its own (BT 128: 7 stages; 256: 3).
template <int BT>
struct SkConfig : Config<BT> {
  static constexpr int kOutBytes = BT * (kRows + 8) * 2;
  static constexpr int kStages = std::min(8, (230400 - kOutBytes) / Config<BT>::kStageBytes);
  static constexpr int kSmemBytes = 1024 + kStages * Config<BT>::kStageBytes + kOutBytes + 2 * kStages * 8;
};

struct SkArgs {
  W4A8Problem p;
  StreamKSpace space;  // tiles x 128-k blocks over gridDim.x CTAs
  int k_chunks, tiles_m;
  bool vector_y;
  StreamKWorkspace ws;  // s32 partial slots of kRows x BT, flags
  bool shared_params;   // Args::shared_params
  int cshift = 0;       // Args::cshift (tuned launches)
};

// gemm_w4a16_sm90.cu's stream-K kernel with this file's stage: segments last to first, one running stage counter.
// kSplitProducer as in gemm_w4a8_sm90_kernel: each of the three producer threads walks the same segments. kTune
// ('sm90qk...', 'sm90rk...'; split producer only): the L2 prefetch of stage kb + kStages within the segment's tile
// and the group-row shift, as gemm_w4a8_sm90_kernel's kTune 1 (the epilogue's scales stay global loads).
template <int BT, bool kSplitProducer = true, bool kTune = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_w4a8_sm90_streamk_kernel(const __grid_constant__ CUtensorMap map_x,
                                  const __grid_constant__ CUtensorMap map_w, const SkArgs args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = SkConfig<BT>;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kR = BT / 2;
  const W4A8Problem& p = args.p;
  const StreamKSpace& sp = args.space;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* out = smem + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(out + C::kOutBytes);
  uint64_t* empty = full + kStages;
  const int cta = static_cast<int>(blockIdx.x), kb_n = sp.k_blocks;
  const int beg = sp.begin(cta), end = sp.begin(cta + 1);
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  init_pipeline<kStages>(&map_x, &map_w, full, empty, kSplitProducer ? kProducerParts : 1, kConsumerWarps * 32);

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    const int part = threadIdx.x >> 5;
    if (kSplitProducer ? (lane != 0 || part >= kProducerParts) : threadIdx.x != 0) return;
    int g = 0;
    for (int pe = end; pe > beg;) {
      int tile, ps;
      streamk_segment(sp, beg, pe, tile, ps);
      const int m0 = tile % args.tiles_m * BT, n0 = tile / args.tiles_m * kRows;
      const int tile0 = n0 / 16, prow = min(kRows, p.npad - n0);
      for (int kb = ps - tile * kb_n; kb < pe - tile * kb_n; ++kb, ++g) {
        const int s = g % kStages;
        const int chunks = min(2, args.k_chunks - 2 * kb);
        mbar_wait(&empty[s], ((g / kStages) & 1) ^ 1);
        uint8_t* st = smem + s * kStageBytes;
        if constexpr (kSplitProducer) {
          const int pk = kTune && kb + kStages < kb_n ? kb + kStages : -1;
          produce_part<C, kTune>(part, st, &full[s], &map_x, &map_w, p, kb, m0, n0, chunks, prow, args.shared_params,
                                 pk, pk >= 0 ? min(2, args.k_chunks - 2 * pk) : 0, args.cshift);
          continue;
        }
        mbar_expect_tx(&full[s], C::kXBytes + C::kWBytes + chunks * 2 * prow);
        tma_load_2d(st, &map_x, kb * kBK, m0, &full[s]);
        uint8_t* ws = st + C::kXBytes;
        tma_load_3d(ws, &map_w, 0, 2 * kb, tile0, &full[s]);
        uint8_t* ps8 = ws + C::kWBytes;
        for (int c = 0; c < chunks; ++c) {
          const int64_t row0 = static_cast<int64_t>((2 * kb + c) * 64 / p.group) * p.npad + n0;
          bulk_load(ps8 + c * 2 * kRows, p.steps + row0, prow, &full[s]);
          bulk_load(ps8 + c * 2 * kRows + kRows, p.offsets + row0, prow, &full[s]);
        }
      }
      pe = ps;
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int t = threadIdx.x - 128;
  const int gw = (wg - 1) * 4 + ((threadIdx.x >> 5) & 3);
  const StageRing<C> ring(smem, full, empty);
  uint32_t fa[16], fb[16];
  int acc[kR];
  int g = 0;
  for (int pe = end; pe > beg;) {
    int tile, ps;
    streamk_segment(sp, beg, pe, tile, ps);
    const int g_end = g + (pe - ps);
    consume_run<C>(acc, fa, fb, g, g_end, ring, gw, lane, kSplitProducer && args.shared_params);
    if (streamk_fixup<int4>(sp, args.ws, cta, t, tile, ps, pe, acc)) {
      const int m0 = tile % args.tiles_m * BT, n0 = tile / args.tiles_m * kRows;
      if (p.raw) {
#pragma unroll
        for (int v = 0; v < kR; ++v) store_acc(p, n0, m0, gw, lane, v, acc[v]);
      } else {
        store_tile_staged<BT>(p, args.vector_y, out, n0, m0, gw, lane, acc);
      }
    }
    pe = ps;
    g = g_end;
  }
#endif
}

// Resident CTAs of the stream-K kernel (one per SM: its smem), measured once per tile (both producers: same smem).
template <int BT>
int streamk_resident(const char* op) {
  static DeviceCounts cache = {};
  return resident_ctas(op, gemm_w4a8_sm90_streamk_kernel<BT, true>, kThreads, SkConfig<BT>::kSmemBytes, cache);
}

// The stream-K launch over `ctas` CTAs (0: every resident one); false without a workspace (first use inside a graph
// capture). The workspace is the W4A16 kernel's (one per device, 128 x 256 slots of 4 bytes).
template <int BT, bool kSplitProducer, bool kTune = false>
bool launch_streamk(const W4A8Problem& p, int ctas, cudaStream_t stream) {
  const char* op = "gemm_w4a8";
  const int resident = streamk_resident<BT>(op);
  LOWBIT_CHECK(ctas >= 0 && ctas <= resident, op, ": stream-K over ", ctas, " CTAs; at most ", resident,
               " are resident at once");
  if (ctas == 0) ctas = resident;
  int dev = 0, sms = 0;
  LOWBIT_CUDA_CHECK(op, cudaGetDevice(&dev));
  LOWBIT_CUDA_CHECK(op, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const StreamKWorkspace ws = streamk_workspace(op, dev, std::max(resident, sms), int64_t{kRows} * 256, stream);
  if (ws.partials == nullptr) return false;
  const int tiles_m = (p.m + BT - 1) / BT;
  const int k_blocks = (p.k + kBK - 1) / kBK;
  const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * tiles_m;
  LOWBIT_CHECK(tiles * k_blocks <= INT32_MAX, op, ": m=", p.m, " n=", p.n, " k=", p.k, " is too large for stream-K");
  const bool vector_y = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  SkArgs args{p, {static_cast<int>(tiles * k_blocks), ctas, k_blocks}, p.k / 64, tiles_m, vector_y, ws,
              kSplitProducer && stage_in_one_group(p)};
  if (kTune) args.cshift = chunk_group_shift(p);
  const CUtensorMap map_x = make_map(op, p.x, p.m, p.k, p.ldx, BT);
  const CUtensorMap map_w = make_packed_weight_map(op, p.w, (p.n + 15) / 16, p.k / 64, kChunkBytes, kTiles, 2);
  static_assert(!kTune || kSplitProducer, "tuned stream-K: split producer only");
  auto kernel = gemm_w4a8_sm90_streamk_kernel<BT, kSplitProducer, kTune>;
  if constexpr (!kSplitProducer || kTune)  // streamk_resident raised the default instance's limit on this device only
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               SkConfig<BT>::kSmemBytes));
  kernel<<<ctas, kThreads, SkConfig<BT>::kSmemBytes, stream>>>(map_x, map_w, args);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  return true;
}

// ---- Persistent tile loop ('sm90p' names): a grid of the resident CTAs, each walking whole tiles ----
//
// CTA c takes tiles c, c + gridDim.x, ... (token tiles fastest, as in the one-tile-per-CTA grid) with all k blocks
// each (no split), and one running stage counter g across its tiles: the producers fill tile i+1's first stages as
// soon as the consumers release tile i's, while the consumers finish tile i's wgmmas and run its epilogue. The
// epilogue stages its f16 tile in a region of its own (PConfig::kOutBytes, never a pipeline stage), in 64-token
// slices so that the pipeline keeps Config<BT>'s stage count (BT 128: 8 stages; 256: 5). Per tile the wgmmas run in
// the same order over the same k blocks as gemm_w4a8_sm90_kernel's unsplit tile: the int32 sums are the same.
//
// Barrier invariant (g counts a CTA's stages over all its tiles, k_blocks per tile): fill g uses stage s = g %
// kStages; full[s] completes phase g / kStages when fill g has landed (kProducerParts arrivals + bytes), so the
// consumers wait parity (g / kStages) & 1; empty[s] completes phase g / kStages when all 256 consumer threads
// released fill g (exactly once each: consumer_step releases fill it-1 for it > the tile's first g, the tail
// releases the tile's last fill after wgmma_wait<0>, before the epilogue); the producer waits for the release of
// fill g - kStages (parity ((g / kStages) & 1) ^ 1, which a fresh barrier passes for g < kStages). A barrier is
// never two phases ahead of its waiter: fill g needs the release of g - kStages, which needs fill g - kStages
// consumed. Tile boundaries change nothing of this: the producer's loop and the consumers' loop count the same g.
template <int BT>
struct PConfig : Config<BT> {
  static constexpr int kOutTokens = 64;  // tokens per staged epilogue slice
  static constexpr int kOutBytes = kOutTokens * (kRows + 8) * 2;
  static constexpr int kStages = Config<BT>::kStages;
  static constexpr int kSmemBytes = 1024 + kStages * Config<BT>::kStageBytes + kOutBytes + 2 * kStages * 8;
  static_assert(kSmemBytes <= 232448, "the persistent kernel's smem exceeds the sm_90 per-block limit");
};

struct PArgs {
  W4A8Problem p;
  int k_blocks, k_chunks, tiles, tiles_m;
  bool vector_y;
  bool shared_params;  // Args::shared_params
};

#ifdef LOWBIT_SM90_DEVICE
// The unsplit f16 epilogue through `out` (PConfig::kOutBytes) in 64-token slices: slice sl holds accumulators
// [32 sl, 32 sl + 32), tokens [64 sl, 64 sl + 64). store_rows_through_smem's first consumer_sync also orders the
// previous slice's (or tile's) reads of `out` before this slice's writes.
template <int BT>
__device__ inline void store_tile_sliced(const W4A8Problem& p, bool vector_y, uint8_t* out, int n0, int m0, int gw,
                                         int lane, const int (&acc)[BT / 2]) {
  constexpr int kT = PConfig<BT>::kOutTokens;
  const int r_lo = n0 + gw * 16 + (lane >> 2), r_hi = r_lo + 8;  // channel_scale holds npad rows
  const float cs_lo = r_lo < p.npad ? p.channel_scale[r_lo] : 0.f, cs_hi = r_hi < p.npad ? p.channel_scale[r_hi] : 0.f;
#pragma unroll
  for (int sl = 0; sl < BT / kT; ++sl) {
    const int ms = m0 + sl * kT;
    if (ms >= p.m) break;  // uniform over the consumers: no slice past m
    store_rows_through_smem<kRows, kT, kConsumerWarps>(
        out, static_cast<__half*>(p.y), p.ldy, p.m, p.n, ms, n0, gw, lane, vector_y, [&](int v, int token) {
          const float xs = ms + token < p.m ? p.x_scale[ms + token] : 0.f;
          return __float2half_rn(static_cast<float>(acc[sl * (kT / 2) + v]) * xs * (((v >> 1) & 1) ? cs_hi : cs_lo));
        });
  }
}
#endif

template <int BT>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_w4a8_sm90_persistent_kernel(const __grid_constant__ CUtensorMap map_x,
                                     const __grid_constant__ CUtensorMap map_w, const PArgs args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = PConfig<BT>;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kR = BT / 2;
  const W4A8Problem& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* out = smem + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(out + C::kOutBytes);
  uint64_t* empty = full + kStages;
  const int nk = args.k_blocks, stride = static_cast<int>(gridDim.x);
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  init_pipeline<kStages>(&map_x, &map_w, full, empty, kProducerParts, kConsumerWarps * 32);

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    const int part = threadIdx.x >> 5;
    if (lane != 0 || part >= kProducerParts) return;
    // s, phase: stage and empty-barrier parity of the running fill g (never reset between tiles).
    int s = 0, phase = 1;
    for (int tile = static_cast<int>(blockIdx.x); tile < args.tiles; tile += stride) {
      const int m0 = tile % args.tiles_m * BT, n0 = tile / args.tiles_m * kRows;
      const int prow = min(kRows, p.npad - n0);
      for (int kb = 0; kb < nk; ++kb) {
        mbar_wait(&empty[s], phase);
        produce_part<C>(part, smem + s * kStageBytes, &full[s], &map_x, &map_w, p, kb, m0, n0,
                        min(2, args.k_chunks - 2 * kb), prow, args.shared_params);
        if (++s == kStages) s = 0, phase ^= 1;
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int gw = (wg - 1) * 4 + ((threadIdx.x >> 5) & 3);
  const StageRing<C> ring(smem, full, empty);
  const bool shared = args.shared_params;
  uint32_t fa[16], fb[16];
  int acc[kR];
  int g = 0;  // the running fill index of this tile's first stage
  for (int tile = static_cast<int>(blockIdx.x); tile < args.tiles; tile += stride) {
    const int g_end = g + nk;
    consume_run<C>(acc, fa, fb, g, g_end, ring, gw, lane, shared);
    const int m0 = tile % args.tiles_m * BT, n0 = tile / args.tiles_m * kRows;
    if (p.raw) {
#pragma unroll
      for (int v = 0; v < kR; ++v) store_acc(p, n0, m0, gw, lane, v, acc[v]);
    } else {
      store_tile_sliced<BT>(p, args.vector_y, out, n0, m0, gw, lane, acc);
    }
    g = g_end;
  }
#endif
}

// Resident CTAs of the persistent kernel (one per SM by its smem), measured once per tile.
template <int BT>
int persistent_resident(const char* op) {
  static DeviceCounts cache = {};
  return resident_ctas(op, gemm_w4a8_sm90_persistent_kernel<BT>, kThreads, PConfig<BT>::kSmemBytes, cache);
}

// The persistent launch over min(tiles, ctas) CTAs (ctas 0: every resident one).
template <int BT>
void launch_persistent(const W4A8Problem& p, int ctas, cudaStream_t stream) {
  const char* op = "gemm_w4a8";
  const int resident = persistent_resident<BT>(op);
  LOWBIT_CHECK(ctas >= 0 && ctas <= resident, op, ": the persistent kernel over ", ctas, " CTAs; at most ", resident,
               " are resident at once");
  const int tiles_m = (p.m + BT - 1) / BT;
  const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * tiles_m;
  LOWBIT_CHECK(tiles <= INT32_MAX - resident, op, ": m=", p.m, " x n=", p.n, " is too large for the persistent grid");
  const int grid = static_cast<int>(std::min<int64_t>(tiles, ctas == 0 ? resident : ctas));
  const int k_blocks = (p.k + kBK - 1) / kBK;
  LOWBIT_CHECK((tiles + grid - 1) / grid * k_blocks <= INT32_MAX, op, ": m=", p.m, " n=", p.n, " k=", p.k, " over ",
               grid, " CTAs overflows the persistent kernel's stage counter");
  const bool vector_y = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  const PArgs args{p, k_blocks, p.k / 64, static_cast<int>(tiles), tiles_m, vector_y,
                   stage_in_one_group(p)};
  const CUtensorMap map_x = make_map(op, p.x, p.m, p.k, p.ldx, BT);
  const CUtensorMap map_w = make_packed_weight_map(op, p.w, (p.n + 15) / 16, p.k / 64, kChunkBytes, kTiles, 2);
  gemm_w4a8_sm90_persistent_kernel<BT><<<grid, kThreads, PConfig<BT>::kSmemBytes, stream>>>(map_x, map_w, args);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

// Cost model constants (us per 128-k block at 128 / 256 tokens, fixed, reduction per 128-token partial;
// sm90_common.cuh's pick_tile_split), fitted to each mainloop's forced tile x split timings on an H200
// (bench/results/h200-2026-11-26-sm90-tiles-db5be10.json): the model's pick is the fastest measured pair on every
// Llama-3-8B shape at M = 256 and 1024. A 128-token block costs nearly what a 256-token one does here: the
// mainloop is bound per stage, not by the int8 tensor rate.
constexpr TileCosts kSerialCosts{0.70, 0.95, 2.0, 6.5};
constexpr TileCosts kOverlapCosts{0.70, 0.80, 2.0, 6.5};
// The split producer (produce_part), fitted to its forced one-launch timings on an H200
// (bench/results/h200-2026-11-27-w4a8-producers-e011925.json: one wave of 32 / 112 k blocks, qkv / o / down): 0.52 us
// per 128-k block at 128 tokens, 0.66 at 256, 4 us fixed (the prediction, 0.42 / 0.68 / 2, picked 128-token tiles
// for qkv M = 1024: 59.3 us against 50.3 at 256).
constexpr TileCosts kSplitProducerCosts{0.52, 0.66, 4.0, 6.5};

// ---- Small token tiles (16 / 32 / 64 tokens): decode-sized batches ----
//
// At 5-64 tokens a CTA's 128-k block is 8 KB of packed codes (and 256-512 bytes of u8 steps and offsets) read once
// from DRAM, against BT x 128 bytes of activations that every weight-row tile re-reads from L2: the weight's bytes
// bound the launch, and the plan's job is to keep enough of them in flight. The tile is the smallest that holds m
// (unless pinned); the split is the cost model's: per CTA, its k blocks at the slower of the copy engine's rate (one
// CTA alone on an SM takes a block in ~0.45 us; two CTAs on an SM share it) and the active CTAs' share of DRAM, a
// fixed cost, and the cluster reduction (per doubling of the split), times the waves of resident CTAs. Fitted to the
// forced splits on an H200 (bench/results/h200-2026-11-29-w4a8-small-tiles-m*-cf0e011.json): replayed on them with
// 264 / 264 / 264 / 256 resident CTAs per cluster size, it picks the fastest measured split on every Llama-3-8B and
// 70B/TP2 shape at 5-64 tokens.
// one CTA's 128-k block alone on its SM (us), its bytes, the DRAM read rate the active CTAs share, fixed, reduction
constexpr SmallTileCosts kSmallCosts{0.45, kRows * kBK / 2 + 2 * 2 * kRows, 3.6e6, 3.0, 1.0};

// Whether the plan takes a small tile: pinned, or m <= kSmallAutoMaxTokens with the tile free, on the launches that
// have small-tile kernels (the overlapped mainloop with the split producer, one tile per CTA).
inline bool small_plan(const W4A8Problem& p, const Sm90Choice& ch) {
  if (is_small_tile(ch.tokens)) return true;
  return ch.tokens == 0 && p.m <= kSmallAutoMaxTokens && !ch.serial && !ch.one_producer && !ch.streamk &&
         !ch.persistent && ch.pair != 2 && ch.prefetch == 0;
}

Sm90Plan plan_small(const W4A8Problem& p, const Sm90Choice& ch) {
  const int bt = ch.tokens != 0 ? ch.tokens : small_tile_for(p.m);
  int slots[4];
  if (bt == 16)
    slots_of<16, true>("gemm_w4a8", slots);
  else if (bt == 32)
    slots_of<32, true>("gemm_w4a8", slots);
  else
    slots_of<64, true>("gemm_w4a8", slots);
  const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * ((p.m + bt - 1) / bt);
  const int k_blocks = (p.k + kBK - 1) / kBK;
  const int split = pick_small_split(tiles, k_blocks, slots, Config<16>::kCtasPerSm, kSmallCosts, ch.split);
  return {bt, split, 0, false};
}

// The persistent kernel's tile when the caller leaves it free: the fewer rounds of tiles over the resident CTAs,
// by kSplitProducerCosts' per-block costs with the fixed cost per tile dropped to 1 us (the next tile's pipeline fill
// hides under the epilogue; a guess until measured).
inline int persistent_tokens(const W4A8Problem& p) {
  const int k_blocks = (p.k + kBK - 1) / kBK, tiles_n = (p.n + kRows - 1) / kRows;
  double best = 1e300;
  int tokens = 256;
  for (const int bt : {256, 128}) {
    const int resident = bt == 128 ? persistent_resident<128>("gemm_w4a8") : persistent_resident<256>("gemm_w4a8");
    const int64_t tiles = static_cast<int64_t>(tiles_n) * ((p.m + bt - 1) / bt);
    const double rounds = static_cast<double>((tiles + resident - 1) / resident);
    const double cost = rounds * (k_blocks * (bt == 128 ? kSplitProducerCosts.c128 : kSplitProducerCosts.c256) + 1.0);
    if (cost < best) best = cost, tokens = bt;
  }
  return tokens;
}

// The plan: pick_tile_split's, with stream-K in place of its split-K cluster plans (one launch, split > 1: at the same
// tile) and at 128 tokens when the tokens fit one 128-token tile (free choice, overlapped mainloop, allow_streamk), or
// where the caller forces it. Measured on an H200 (docs/benchmarks_gpu.md, "Stream-K"): it won or tied in every such
// Llama-3-8B case (down M = 128 45.7 -> 29.1 us, M = 256 47.0 -> 39.4 at 256 tokens); in place of unsplit plans it
// lost about as often as it won.
template <bool kOverlap>
Sm90Plan plan_core(const W4A8Problem& p, const Sm90Choice& ch, bool allow_streamk, bool allow_small = true) {
  if (kOverlap && allow_small && small_plan(p, ch)) return plan_small(p, ch);
  const TileCosts& costs = !kOverlap ? kSerialCosts : ch.one_producer ? kOverlapCosts : kSplitProducerCosts;
  if (ch.streamk) return {ch.tokens != 0 ? ch.tokens : (p.m <= 128 ? 128 : 256), 0, 0, true};
  const bool auto_sk = kOverlap && allow_streamk && !ch.no_streamk && ch.split == 0;
  if (auto_sk && ch.tokens != 256 && p.m <= 128) return {128, 0, 0, true};
  int s128[4], s256[4];
  slots_of<128, kOverlap>("gemm_w4a8", s128);
  slots_of<256, kOverlap>("gemm_w4a8", s256);
  const TilePlan t = pick_tile_split((p.n + kRows - 1) / kRows, p.m, (p.k + kBK - 1) / kBK, s128, s256,
                                     costs, ch.tokens, ch.split);
  if (auto_sk && t.split > 1 && t.head == 0) return {t.tokens, 0, 0, true};
  return {t.tokens, t.split, t.head, false};
}

//
// Multicast pairs ('sm90m[:T]', one unsplit pair launch at T tokens, T free: the model's tile for split 1) are opt-in.
// The rule written before their first run (pairs in place of every free one-launch unsplit plan) measured 0-4% slower
// with the same tile on every Llama-3-8B shape at M = 256 / 1024 (H200, fd20bfd, docs/benchmarks_gpu.md "W4A8:
// multicast pairs"), so the automatic plan keeps the unpaired launch; 'sm90x' (pairs off) is that plan.
template <bool kOverlap>
Sm90Plan plan_for(const W4A8Problem& p, const Sm90Choice& ch, bool allow_streamk = true) {
  if (ch.pair == 2) {
    Sm90Choice one = ch;
    one.pair = 1, one.split = 1, one.no_streamk = true;
    Sm90Plan plan = plan_core<kOverlap>(p, one, false, false);  // pairs have 128 / 256-token kernels only
    plan.pair = true;
    return plan;
  }
  return plan_core<kOverlap>(p, ch, allow_streamk);
}

// kSplitProducer false: the earlier one-thread producer ('sm90o...' names, overlapped mainloop only).
template <bool kOverlap, bool kSplitProducer>
void run(const W4A8Problem& p, const Sm90Choice& choice, cudaStream_t stream) {
  Sm90Plan plan = plan_for<kOverlap>(p, choice);
  if constexpr (kOverlap && kSplitProducer) {
    if (is_small_tile(plan.tokens)) {  // one launch of one tile per CTA (split-K clusters), no head
      using Go = void (*)(const W4A8Problem&, int, int, int, bool, cudaStream_t);
      const Go go = plan.tokens == 16 ? launch<16, true, true> : plan.tokens == 32 ? launch<32, true, true>
                                                                                  : launch<64, true, true>;
      const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * ((p.m + plan.tokens - 1) / plan.tokens);
      LOWBIT_CHECK(tiles <= INT32_MAX, "gemm_w4a8: m=", p.m, " x n=", p.n, " is too large for the sm90 kernel's grid");
      go(p, plan.split, 0, static_cast<int>(tiles), choice.pdl, stream);
      return;
    }
    if (plan.pair) {
      if (plan.tokens == 128)
        launch_pair<128>(p, stream);
      else
        launch_pair<256>(p, stream);
      return;
    }
  }
  // choice.prefetch: 'sm90q' 1, 'sm90r' 2 (stream-K runs 'sm90r' as 'sm90q': segments keep their k order).
  // Tuned launches find group rows by a shift: other groups (not 64 * 2^j) run untuned.
  const int tuned = chunk_group_shift(p) >= 0 ? choice.prefetch : 0;
  if (plan.streamk) {
    bool ran;
    if constexpr (kSplitProducer) {
      ran = tuned > 0 ? (plan.tokens == 128 ? launch_streamk<128, true, true>(p, choice.ctas, stream)
                                            : launch_streamk<256, true, true>(p, choice.ctas, stream))
                      : (plan.tokens == 128 ? launch_streamk<128, true>(p, choice.ctas, stream)
                                            : launch_streamk<256, true>(p, choice.ctas, stream));
    } else {
      ran = plan.tokens == 128 ? launch_streamk<128, false>(p, choice.ctas, stream)
                               : launch_streamk<256, false>(p, choice.ctas, stream);
    }
    if (ran) return;
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !choice.streamk, "gemm_w4a8: the stream-K workspace is allocated on "
                      "first use, which a graph capture forbids: run the op once before capturing");
    plan = plan_for<kOverlap>(p, choice, false);
  }
  const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * ((p.m + plan.tokens - 1) / plan.tokens);
  LOWBIT_CHECK(tiles <= INT32_MAX, "gemm_w4a8: m=", p.m, " x n=", p.n, " is too large for the sm90 kernel's grid");
  using Go = void (*)(const W4A8Problem&, int, int, int, bool, cudaStream_t);
  Go go = plan.tokens == 128 ? launch<128, kOverlap, kSplitProducer> : launch<256, kOverlap, kSplitProducer>;
  if constexpr (kOverlap && kSplitProducer) {
    // kTuneAutomaticPlan: the automatic plan (tile and split free) would run its unsplit one-launch tiles tuned. Off:
    // as these lean template instances, the tuned launch is 1-8% slower than the untuned one on every Llama-3-8B plan
    // at M = 256 / 1024 (H200, 674b897: qkv 256 21.5 vs 21.3 us, down 1024 80.0 vs 74.5; docs/benchmarks_gpu.md,
    // "W4A8: what the 128-token tile waits for"). 'sm90:S:T' pins the untuned launch for A/B.
    constexpr bool kTuneAutomaticPlan = false;
    const bool free = kTuneAutomaticPlan && choice.tokens == 0 && choice.split == 0 && !choice.streamk;
    const int tune = tuned > 0                                                           ? tuned
                     : free && plan.split == 1 && plan.head == 0 && chunk_group_shift(p) >= 0 ? 1
                                                                                              : 0;
    if (tune == 1) go = plan.tokens == 128 ? launch<128, true, true, 1> : launch<256, true, true, 1>;
    if (tune == 2) go = plan.tokens == 128 ? launch<128, true, true, 2> : launch<256, true, true, 2>;
  }
  if (plan.head > 0) go(p, 1, 0, plan.head, choice.pdl, stream);  // whole unsplit waves, then the rest split
  go(p, plan.split, plan.head, static_cast<int>(tiles) - plan.head, choice.pdl, stream);
}

// A pinned 16 / 32 / 64-token tile: only the launch that has those kernels.
void check_small_tile_choice(const Sm90Choice& choice) {
  LOWBIT_CHECK(!is_small_tile(choice.tokens) || (!choice.serial && !choice.one_producer && !choice.streamk &&
                                                 !choice.persistent && choice.pair != 2 && choice.prefetch == 0),
               "gemm_w4a8: the 16 / 32 / 64-token tiles run the overlapped mainloop with the split producer, one tile "
               "per CTA ('sm90:S:T'), not 'sm90s' / 'sm90o' / 'sm90k' / 'sm90p' / 'sm90m' / 'sm90q' / 'sm90r'");
}

}  // namespace

bool gemm_w4a8_sm90_usable(int device) {
  static std::atomic<int> cache[64] = {};
  return kernel_usable_on("gemm_w4a8", device, gemm_w4a8_sm90_kernel<256, true, true>, cache);
}

// Tile and split (or stream-K) by the cost model unless forced.
void gemm_w4a8_sm90(const W4A8Problem& p, const Sm90Choice& choice, cudaStream_t stream) {
  check_tile_split_choice("gemm_w4a8", choice.split, choice.tokens, true);
  check_small_tile_choice(choice);
  LOWBIT_CHECK(!choice.streamk || (!choice.serial && choice.split == 0), "gemm_w4a8: stream-K runs the overlapped "
               "mainloop without a split");
  LOWBIT_CHECK(!(choice.serial && choice.one_producer), "gemm_w4a8: the one-thread producer ('sm90o') runs the "
               "overlapped mainloop only");
  LOWBIT_CHECK(choice.prefetch == 0 || (!choice.serial && !choice.one_producer && !choice.persistent && choice.pair != 2),
               "gemm_w4a8: 'sm90q' / 'sm90r' (L2 prefetch, staged scales, rotated k) run the overlapped mainloop with the split producer, "
               "one-tile-per-CTA and stream-K launches only");
  LOWBIT_CHECK(choice.pair != 2 || (!choice.serial && !choice.one_producer && !choice.streamk && !choice.persistent &&
                                    choice.split <= 1),
               "gemm_w4a8: multicast pairs ('sm90m') run the overlapped mainloop, split producer, unsplit tiles only");
  if (choice.persistent) {
    LOWBIT_CHECK(!choice.serial && !choice.one_producer && !choice.streamk && choice.split == 0, "gemm_w4a8: the "
                 "persistent kernel ('sm90p') runs the overlapped mainloop, split producer, unsplit tiles only");
    const int tokens = choice.tokens != 0 ? choice.tokens : persistent_tokens(p);
    if (tokens == 128)
      launch_persistent<128>(p, choice.ctas, stream);
    else
      launch_persistent<256>(p, choice.ctas, stream);
    return;
  }
  if (choice.serial)
    run<false, true>(p, choice, stream);
  else if (choice.one_producer)
    run<true, false>(p, choice, stream);
  else
    run<true, true>(p, choice, stream);
}

Sm90Plan gemm_w4a8_sm90_plan(int m, int n, int k, const Sm90Choice& choice) {
  check_tile_split_choice("gemm_w4a8", choice.split, choice.tokens, true);
  check_small_tile_choice(choice);
  W4A8Problem p{};
  p.m = m, p.n = n, p.k = k;
  if (choice.persistent) return {choice.tokens != 0 ? choice.tokens : persistent_tokens(p), 1, 0, false};
  return choice.serial ? plan_for<false>(p, choice) : plan_for<true>(p, choice);
}

}  // namespace lowbit::cuda::detail
