// W4A16 GEMM for Hopper (sm_90a): f16 wgmma with the u4 weight dequantized in registers as the A
// operand and the f16 activations as the shared-memory B operand (gemm_w4a8_sm90.cu's pipeline with
// the u4 -> f16 dequant of the mma.sync kernels, TurboMind §4.1).
//
// Yᵀ = W · Xᵀ: a CTA owns 128 weight rows (two consumer warpgroups of 64, one wgmma m64 each) x BT
// tokens (the wgmma n: 128 or 256) x its k range, in stages of one 64-k chunk. Three producer threads
// (lane 0 of warps 0-2) fill each stage, one copy kind each (produce_part): the activation tile by TMA
// (64 f16 = one 128-byte swizzled row per token, zero fill past m: the layout wgmma's descriptor reads),
// the chunk's eight packed 16-row weight tiles by one 3-D TMA box over pack_sm80's [tile][chunk] layout,
// its group's f16 scales and zeros (or mins) by 1-D bulk copies (two per stage; four for g32, whose chunk
// spans two groups). One thread issuing all of them bound the W4A8 twin's stage (gemm_w4a8_sm90.cu); 'sm90o'
// names keep that one-thread producer here for A/B timing.
// pack_sm80's k order is the A fragment's, so a consumer lane turns its 16 bytes per chunk into the
// four k16 steps' fragment registers with the magic-number dequant (w = q*s - z*s, or q*s + m, in
// f16, bit-identical to the mma.sync kernels' weights), issues
// the stage's four m64nBTk16 wgmmas and dequantizes the next stage into a second fragment set while
// they run, keeping one stage's wgmmas in flight across the next issue (wait_group 1). The tile (128 or 256
// tokens) and split come from a cost model (sm90_common.cuh's pick_tile_split): at M = 256 on 4096-wide
// layers the 128-token tile with split 2 fills 128 SMs where 256 tokens left 64; past a whole wave the plan may be two
// launches over one linear tile range (whole unsplit waves, then the rest split), or one stream-K launch (every
// resident CTA an equal range of tile x k blocks: sm90_streamk.cuh). Accumulation is f32; split-K runs
// as a thread-block cluster along k whose f32 partial
// tiles are summed through distributed shared memory in a fixed order (deterministic). Without split,
// the tile leaves through shared memory as 16-byte row segments (coalesced stores). Token tiles vary
// fastest in the grid, so the CTAs resident together share weight tiles in L2 and every weight byte
// comes from DRAM about once.
//
// The wide tile (W = 2, names 'sm90w...'): 256 weight rows x 128 tokens per CTA, each consumer warpgroup two m64
// wgmmas per k16 step on one activation tile; the automatic plan takes it unsplit where one token tile's 256-row
// tiles fill a wave (gate_up at 128 tokens). Split-K may also reduce through L2 ('sm90g...', store_tile_l2; measured
// slower than the DSMEM reduction, which stays the default). docs/gpu_notes.md, "the wide tile".
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "cuda/pdl.cuh"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm90/gemm_w4a16_sm90.h"
#include "kernels/sm90/sm90_common.cuh"
#include "kernels/sm90/sm90_producer.cuh"
#include "kernels/sm90/sm90_streamk.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda::detail {
namespace {

using namespace sm90;

constexpr int kRows = 128;          // weight rows per CTA: two consumer warpgroups of 64 (W = 1)
constexpr int kBK = 64;             // k per stage: one packed chunk, one or two quantization groups
constexpr int kChunkBytes = 512;    // one packed 16-row x 64-k tile
constexpr int kThreads = 384;       // warpgroup 0: producers (lane 0 of warps 0-2 issue the copies), 1-2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kSmemBudget = 215040;
constexpr int kSmallSmemBudget = 112640;  // two CTAs per SM: each under half of 228 KB with its 1 KB reserve

// W: m64 weight tiles per consumer warpgroup (1: 128 weight rows per CTA; 2: the wide tile, 256 rows, each
// activation tile feeding twice the weights: half the activation bytes through L2 per weight row).
// Small token tiles (16, 32, 64 tokens: decode batches, where the weight's bytes bound the time) run two CTAs per SM as
// the W4A8 kernel's do (gemm_w4a8_sm90.cu): half the shared memory (up to 16 stages) and registers (launch bounds of
// 2 x 384 threads: 80 a thread at entry; the consumers take 96, the producers keep 40).
template <int BT, int W = 1>
struct Config {
  static constexpr bool kSmall = BT < 128;
  static constexpr int kCtasPerSm = kSmall ? 2 : 1;
  static constexpr int kProducerRegs = 40, kConsumerRegs = kSmall ? 96 : 232;
  static constexpr int kRows = 128 * W;                 // weight rows per CTA
  static constexpr int kTiles = kRows / 16;             // packed 16-row tiles per CTA
  static constexpr int kXBytes = BT * kBK * 2;         // activation tile (swizzled, 1024-aligned)
  static constexpr int kWBytes = kTiles * kChunkBytes;  // [tile][lane] 16-byte units
  static constexpr int kPBytes = 2 * 2 * kRows * 2;     // [k half][scale | zero][row] f16 (param_row)
  static constexpr int kStageBytes = (kXBytes + kWBytes + kPBytes + 1023) / 1024 * 1024;
  static constexpr int kStages =
      kSmall ? std::min(16, kSmallSmemBudget / kStageBytes) : std::min(8, kSmemBudget / kStageBytes);
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kRows * BT * 4 <= kStages * kStageBytes, "split-K reduction must fit in the pipeline smem");
  static_assert(W == 1 || BT == 128, "the wide tile holds 2 x 64 accumulators per thread: 128 tokens only");
  static_assert(BT * (kRows + 8) * 2 <= kStages * kStageBytes, "the staged output tile must fit in the pipeline smem");
  static_assert(!kSmall || 2 * (kSmemBytes + 1024) <= 233472, "two small-tile CTAs must fit one SM's shared memory");
  static_assert(!kSmall || 128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 80, "the register split must fit the "
                "80 registers a thread that two CTAs per SM start with");
};

struct Args {
  W4A16Problem p;
  int k_chunks, split;
  int tile_base, tiles_m;  // this launch's first tile; token tiles per weight-row tile
  bool vector_y;  // y rows 16-byte aligned: the staged epilogue stores 8 halves at a time
  float* l2_partials;  // split-K through L2: kSlotFloats per CTA of this launch ([x * split + z]); nullptr: DSMEM
  // Launched as a programmatic dependent (small tiles): the activation producer waits for the kernel before; the weight
  // and parameter producers do not (the weights are constant).
  bool pdl = false;
};
constexpr int kSlotFloats = 128 * 256;  // the largest partial tile (128 x 256 or, wide, 256 x 128 f32)

#ifdef LOWBIT_SM90_DEVICE
// D += A · Bᵀ for one k16 step: A (64 weight rows x 16 k, f16) from the four fragment registers, B
// (BT tokens x 16 k, f16) from shared memory through descriptor db (K-major, no transpose).
// (n16 / n32 / n64: the small token tiles.)
__device__ inline void wgmma_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, "
      "p, 1, 1, 0;\n}\n"
      : LOWBIT_ACC8("+f", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " LOWBIT_REGS16
      ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : LOWBIT_ACC16("+f", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " LOWBIT_REGS32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : LOWBIT_ACC32("+f", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " LOWBIT_REGS64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : LOWBIT_ACC64("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ inline void wgmma_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " LOWBIT_REGS128
      ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : LOWBIT_ACC128("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// Writes accumulator v of lane `lane` in consumer warp gw: weight row gw*16 + lane/4 (+8 when
// v%4 >= 2), token (v/4)*8 + 2*(lane%4) + v%2 (the wgmma accumulator layout).
__device__ inline void store_acc(const W4A16Problem& p, int n0, int m0, int gw, int lane, int v, float acc) {
  const int n = n0 + gw * 16 + (lane >> 2) + ((v >> 1) & 1) * 8;
  const int m = m0 + (v >> 2) * 8 + (lane & 3) * 2 + (v & 1);
  if (n < p.n && m < p.m) p.y[static_cast<int64_t>(m) * p.ldy + n] = __float2half_rn(acc);
}

// Turns a stage's packed weights of consumer warp gw's 16-row tile into wgmma A fragments:
// a[4j + r] is register r of k16 step j.
template <class C>
__device__ __forceinline__ void dequant_stage(const uint8_t* st, int gw, int lane, bool two_halves, bool mins,
                                              uint32_t (&a)[16]) {
  const uint4 wv = reinterpret_cast<const uint4*>(st + C::kXBytes)[gw * 32 + lane];
  const __half* ps = reinterpret_cast<const __half*>(st + C::kXBytes + C::kWBytes);
  const int row = gw * 16 + (lane >> 2);
  __half2 s_lo, s_hi, nzs_lo, nzs_hi;
  auto load_params = [&](int half) {
    const __half* h = ps + half * 2 * C::kRows;
    const __half s0 = h[row], s8 = h[row + 8], z0 = h[C::kRows + row], z8 = h[C::kRows + row + 8];
    s_lo = __half2half2(s0), s_hi = __half2half2(s8);
    nzs_lo = w4a16::addend_of(z0, s0, mins), nzs_hi = w4a16::addend_of(z8, s8, mins);
  };
  load_params(0);
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j == 2 && two_halves) load_params(1);  // k 32-63 belongs to the next group
    uint32_t f[4];
    w4a16::dequant_word(words[j], s_lo, nzs_lo, s_hi, nzs_hi, f);
#pragma unroll
    for (int r = 0; r < 4; ++r) a[4 * j + r] = f[r];
  }
}

template <int N>
__device__ __forceinline__ void wgmma_frag(float (&acc)[N], const uint32_t (&a)[16], int i, uint64_t db) {
  const uint32_t f[4] = {a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]};
  wgmma_rs(acc, f, db + 2 * i);  // k16 step i of the stage: +32 bytes of k in the swizzled row
}

// Part h of a register array of W equal parts (the wide tile's two m64 accumulator / fragment sets).
template <int P, int W, class T>
__device__ __forceinline__ T (&part(T (&a)[P * W], int h))[P] {
  return *reinterpret_cast<T(*)[P]>(a + h * P);
}

// Dequantizes consumer warp gw's W 16-row tiles of a stage (tile gw + 4h for part h) into the W fragment sets.
template <class C, int W>
__device__ __forceinline__ void dequant_parts(const uint8_t* st, int gw, int lane, bool two_halves, bool mins,
                                              uint32_t (&a)[16 * W]) {
#pragma unroll
  for (int h = 0; h < W; ++h) dequant_stage<C>(st, gw + 4 * h, lane, two_halves, mins, part<16, W>(a, h));
}

// Stage `it` of one consumer warpgroup: issue its wgmmas from `cur` and dequantize stage it+1 into `next`
// while they run. Serial (kOverlap false): then wait for them and release the stage, so the warpgroup's tensor
// work stops between stages. Overlapped: wait only for stage it-1's wgmmas (at most one group pending), which read
// `next` and stage it-1, release that stage, then dequantize: stage it's wgmmas stay in flight into the next
// stage's issue (the same accumulators; same-shape wgmmas on them are ordered by the hardware). Every consumer
// thread arrives on the empty barrier: each one's shared-memory reads of the stage are ordered before it.
// W = 2 (the wide tile): each k16 step issues one wgmma per m64 part, both reading the same activation rows.
template <bool kOverlap, class C, int W, int N, class StageAt>
__device__ __forceinline__ void consumer_step(float (&acc)[N], const uint32_t (&cur)[16 * W],
                                              uint32_t (&next)[16 * W], int it, int nk, const StageAt& stage_at,
                                              uint64_t* full, uint64_t* empty, int gw, int lane, bool two_halves,
                                              bool mins, int first = 0) {
  constexpr int kStages = C::kStages, kR = N / W;
  const uint64_t db = smem_desc(smem_u32(stage_at(it)));
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < W; ++h)
      wgmma_frag(part<kR, W>(acc, h), part<16, W>(cur, h), i, db);
  }
  wgmma_commit();
  if constexpr (kOverlap) {
    wgmma_wait<1>();
    if (it > first) mbar_arrive(&empty[(it - 1) % kStages]);  // first: the segment's first stage (stream-K)
  }
  if (it + 1 < nk) {
    mbar_wait(&full[(it + 1) % kStages], ((it + 1) / kStages) & 1);
    dequant_parts<C, W>(stage_at(it + 1), gw, lane, two_halves, mins, next);
  }
  if constexpr (!kOverlap) {
    wgmma_wait<0>();
    fence_regs(acc);
    mbar_arrive(&empty[it % kStages]);
  }
}

// Part `part` of chunk kc's stage copies (sm90_producer.cuh): 64 k of x, the chunk's packed tiles, then the f16 scales
// and zeros (or mins) of its `halves` group rows (2 for g32: the chunk spans two groups), prow of each.
template <class C>
__device__ __forceinline__ void produce_part(int part, uint8_t* st, uint64_t* bar, const CUtensorMap* map_x,
                                             const CUtensorMap* map_w, const W4A16Problem& p, int kc, int m0, int n0,
                                             int prow, int halves) {
  produce_stage_part<C>(part, st, bar, map_x, map_w, kc * kBK, m0, kc, n0, [&] {
    mbar_expect_tx(bar, halves * 2 * prow * 2);
    for (int h = 0; h < halves; ++h) {
      uint8_t* ps = st + C::kXBytes + C::kWBytes + h * 2 * C::kRows * 2;
      const int64_t row0 = static_cast<int64_t>(w4a16::param_row(kc, h, p.group)) * p.npad + n0;
      bulk_load(ps, p.scales + row0, prow * 2, bar);
      bulk_load(ps + C::kRows * 2, p.zeros + row0, prow * 2, bar);
    }
  });
}

// The consumers' epilogue. Split 1: each lane stores its accumulators. Split-K: split rank j reduces
// rows [j, j+1) * 128/split of the tile; slot r of CTA j holds split rank r's partial of that slice as
// [warp in slice][v/4][lane] float4 (the pipeline smem is idle by then; the producer warpgroup joins
// the two cluster barriers).
// Split 1: the f16 tile leaves through shared memory as 16-byte row segments. gw: the warp's first 16-row tile (part
// h holds tile gw + 4h), cw: its consumer warp (0-7).
template <int BT, int W>
__device__ inline void store_tile_staged(const W4A16Problem& p, bool vector_y, uint8_t* smem, int n0, int m0, int gw,
                                         int lane, const float (&acc)[BT / 2 * W]) {
  if constexpr (W == 1) {
    store_rows_through_smem<kRows, BT, kConsumerWarps>(smem, p.y, p.ldy, p.m, p.n, m0, n0, gw, lane, vector_y,
                                                       [&](int v, int) { return __float2half_rn(acc[v]); });
  } else {
    // store_rows_through_smem's layout for 256 rows, both parts written before the copy-out.
    constexpr int kRowsW = kRows * W, kOutRow = kRowsW + 8, kR = BT / 2;
    __half* out = reinterpret_cast<__half*>(smem);
    consumer_sync();  // both warpgroups' wgmmas have completed: the pipeline smem is free
#pragma unroll
    for (int h = 0; h < W; ++h)
#pragma unroll
      for (int v = 0; v < kR; ++v) {
        const int row = (gw + 4 * h) * 16 + (lane >> 2) + ((v >> 1) & 1) * 8;
        const int token = (v >> 2) * 8 + (lane & 3) * 2 + (v & 1);
        out[token * kOutRow + row] = __float2half_rn(acc[h * kR + v]);
      }
    consumer_sync();
    for (int u = (gw / (4 * W) * 4 + gw % 4) * 32 + lane; u < BT * (kRowsW / 8); u += kConsumerWarps * 32) {
      const int token = u / (kRowsW / 8), col = (u % (kRowsW / 8)) * 8;
      const int mi = m0 + token, ni = n0 + col;
      if (mi >= p.m || ni >= p.n) continue;
      const __half* src = out + token * kOutRow + col;
      __half* dst = p.y + static_cast<int64_t>(mi) * p.ldy + ni;
      if (vector_y && ni + 8 <= p.n) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else {
        for (int e = 0; e < 8 && ni + e < p.n; ++e) dst[e] = src[e];
      }
    }
  }
}

template <int BT, int W>
__device__ inline void store_tile(const W4A16Problem& p, bool vector_y, uint8_t* smem, int n0, int m0, int gw, int cw,
                                  int lane, int rank, int split, const float (&acc)[BT / 2 * W]) {
  if (split == 1) {
    store_tile_staged<BT, W>(p, vector_y, smem, n0, m0, gw, lane, acc);
    return;
  }
  constexpr int kR = BT / 2;
  // reduce_split_k sees consumer warp w's kR * W values; value v belongs to part v / kR, tile (w/4)*4W + 4(v/kR) + w%4.
  reduce_split_k<kConsumerWarps, float4>(smem, cw, lane, rank, split, acc, [&](int w, int ln, int v, float4 sum) {
    const int t16 = (w / 4) * 4 * W + (v / kR) * 4 + w % 4, vv = v % kR;
    store_acc(p, n0, m0, t16, ln, vv, sum.x);
    store_acc(p, n0, m0, t16, ln, vv + 1, sum.y);
    store_acc(p, n0, m0, t16, ln, vv + 2, sum.z);
    store_acc(p, n0, m0, t16, ln, vv + 3, sum.w);
  });
}
// Split-K through L2 instead of distributed shared memory (the same sums in the same order: bit-identical). Split rank
// j owns rows [j, j+1) * rows/split of the tile, i.e. consumer warps [j, j+1) * 8/split. Each CTA writes the
// quads of the warps it does not own to its slot ([warp][v/4][lane] float4, coalesced) in `part` (the cluster's
// `split` slots), a cluster barrier (release / acquire) publishes them, and the owning warps add the other ranks'
// quads (L2 only: __ldcg) to their registers in rank order, then the slice leaves through smem as 16-byte row
// segments. Why: the DSMEM exchange measured ~3.7 us per 64 KB partial (docs/gpu_notes.md, "the wide tile").
template <int BT, int W>
__device__ inline void store_tile_l2(const W4A16Problem& p, bool vector_y, uint8_t* smem, int n0, int m0, int gw,
                                     int cw, int lane, int rank, int split, float (&acc)[BT / 2 * W], float* part) {
  namespace cg = cooperative_groups;
  constexpr int kR = BT / 2 * W, kQuads = kR / 4, kRowsW = kRows * W, kOutRow = kRowsW + 8;
  const int slice_warps = kConsumerWarps / split, j = cw / slice_warps;
  float4* mine = reinterpret_cast<float4*>(part + static_cast<int64_t>(rank) * kSlotFloats) + cw * kQuads * 32 + lane;
  if (j != rank) {
#pragma unroll
    for (int q = 0; q < kQuads; ++q) mine[q * 32] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
  }
  cg::this_cluster().sync();  // the partials are in L2
  __half* out = reinterpret_cast<__half*>(smem);  // the pipeline smem is idle (every wgmma has completed)
  if (j == rank) {
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int r = 0; r < split; ++r) {
        const float4 c = r == rank ? make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3])
                                   : __ldcg(reinterpret_cast<const float4*>(part + static_cast<int64_t>(r) * kSlotFloats) +
                                            cw * kQuads * 32 + lane + q * 32);
        if (r == 0) sum = c;
        else sum.x += c.x, sum.y += c.y, sum.z += c.z, sum.w += c.w;
      }
      acc[4 * q] = sum.x, acc[4 * q + 1] = sum.y, acc[4 * q + 2] = sum.z, acc[4 * q + 3] = sum.w;
    }
    // [token][row] f16 tile of this slice's rows (store_rows_through_smem's layout)
#pragma unroll
    for (int h = 0; h < W; ++h)
#pragma unroll
      for (int v = 0; v < BT / 2; ++v) {
        const int row = (gw + 4 * h) * 16 + (lane >> 2) + ((v >> 1) & 1) * 8;
        const int token = (v >> 2) * 8 + (lane & 3) * 2 + (v & 1);
        out[token * kOutRow + row] = __float2half_rn(acc[h * (BT / 2) + v]);
      }
  }
  cg::this_cluster().sync();  // the slice is staged (the producer warpgroup joins both barriers)
  // The slice's rows: consumer warps [j0, j0 + slice_warps) hold tiles (w/4)*4W + 4h + w%4.
  const int j0 = rank * slice_warps;
  constexpr int kSegs = 2;  // 16-byte segments per 16-row tile
  const int tiles16 = slice_warps * W;
  for (int u = cw * 32 + lane; u < BT * tiles16 * kSegs; u += kConsumerWarps * 32) {
    const int token = u / (tiles16 * kSegs), s16 = u % (tiles16 * kSegs), t = s16 / kSegs;
    const int w = j0 + t % slice_warps, h = t / slice_warps;
    const int row = ((w / 4) * 4 * W + 4 * h + w % 4) * 16 + (s16 % kSegs) * 8;
    const int mi = m0 + token, ni = n0 + row;
    if (mi >= p.m || ni >= p.n) continue;
    const __half* src = out + token * kOutRow + row;
    __half* dst = p.y + static_cast<int64_t>(mi) * p.ldy + ni;
    if (vector_y && ni + 8 <= p.n) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && ni + e < p.n; ++e) dst[e] = src[e];
    }
  }
}
#endif  // LOWBIT_SM90_DEVICE

// Grid: x = tiles [tile_base, tile_base + gridDim.x) of BT tokens x 128 W weight rows (token tiles fastest),
// z = split (one cluster along z). kSplitProducer: three producer threads (produce_part), else the one thread of the
// earlier rounds (kept for A/B timing: kernel names 'sm90o...'); the consumers are the same (bit-identical results).
template <int BT, bool kOverlap, int W = 1, bool kSplitProducer = true>
__global__ void __launch_bounds__(kThreads, Config<BT, W>::kCtasPerSm)
    gemm_w4a16_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                           const Args args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = Config<BT, W>;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kR = BT / 2 * W, kRowsC = C::kRows;
  const W4A16Problem& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  const int split = args.split, rank = static_cast<int>(blockIdx.z);
  const int tile = args.tile_base + static_cast<int>(blockIdx.x);  // token tiles vary fastest
  const int m0 = tile % args.tiles_m * BT, n0 = tile / args.tiles_m * kRowsC;
  const int kc0 = rank * args.k_chunks / split, nk = (rank + 1) * args.k_chunks / split - kc0;
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  init_pipeline<kStages>(&map_x, &map_w, full, empty, kSplitProducer ? kProducerParts : 1, kConsumerWarps * 32);

  float acc[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) acc[i] = 0.f;
  const int cw = (wg - 1) * 4 + ((threadIdx.x >> 5) & 3);          // consumer warp
  const int gw = (wg - 1) * 4 * W + ((threadIdx.x >> 5) & 3);      // its first 16-row weight tile (W = 1: cw)

  // The producer warpgroup needs few registers; the consumers' 64 x BT f32 tile needs many.
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs) : "memory");
    const int part = threadIdx.x >> 5;
    if (kSplitProducer && lane == 0 && part < kProducerParts) {  // producers: one part of each stage
      const int prow = min(kRowsC, p.npad - n0);
      const int halves = w4a16::halves_differ(p.group) ? 2 : 1;
      if (args.pdl && part == 0) pdl_wait_for_producers();  // x comes from the kernel before
      for (int it = 0; it < nk; ++it) {
        const int s = it % kStages;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        produce_part<C>(part, smem + s * kStageBytes, &full[s], &map_x, &map_w, p, kc0 + it, m0, n0, prow, halves);
      }
    }
    if (!kSplitProducer && threadIdx.x == 0) {  // the one-thread producer
      if (args.pdl) pdl_wait_for_producers();
      const int tile0 = n0 / 16;
      const int prow = min(kRowsC, p.npad - n0);  // rows of parameters to copy (a multiple of 16)
      const int halves = w4a16::halves_differ(p.group) ? 2 : 1;  // parameter rows per stage (param_row)
      for (int it = 0; it < nk; ++it) {
        const int s = it % kStages, kc = kc0 + it;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        uint8_t* st = smem + s * kStageBytes;
        mbar_expect_tx(&full[s], C::kXBytes + C::kWBytes + halves * 2 * prow * 2);  // TMA boxes count in full
        tma_load_2d(st, &map_x, kc * kBK, m0, &full[s]);
        uint8_t* ws = st + C::kXBytes;
        tma_load_3d(ws, &map_w, 0, kc, tile0, &full[s]);
        for (int h = 0; h < halves; ++h) {
          uint8_t* ps = ws + C::kWBytes + h * 2 * kRowsC * 2;
          const int64_t row0 = static_cast<int64_t>(w4a16::param_row(kc, h, p.group)) * p.npad + n0;
          bulk_load(ps, p.scales + row0, prow * 2, &full[s]);
          bulk_load(ps + kRowsC * 2, p.zeros + row0, prow * 2, &full[s]);
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
    uint32_t fa[16 * W], fb[16 * W];
    const bool two_halves = w4a16::halves_differ(p.group);
    const auto stage_at = [&](int it) { return smem + (it % kStages) * kStageBytes; };
    fence_regs(acc);
    if (nk > 0) {
      mbar_wait(&full[0], 0);
      dequant_parts<C, W>(stage_at(0), gw, lane, two_halves, p.mins, fa);
    }
    for (int it = 0; it < nk; it += 2) {
      consumer_step<kOverlap, C, W>(acc, fa, fb, it, nk, stage_at, full, empty, gw, lane, two_halves, p.mins);
      if (it + 1 >= nk) break;
      consumer_step<kOverlap, C, W>(acc, fb, fa, it + 1, nk, stage_at, full, empty, gw, lane, two_halves, p.mins);
    }
    if constexpr (kOverlap) {  // the last stage's wgmmas
      wgmma_wait<0>();
      fence_regs(acc);
      if (nk > 0) mbar_arrive(&empty[(nk - 1) % kStages]);
    }
    pdl_allow_dependents();  // the next kernel may launch during the epilogue (it waits for this grid's end)
    if (split > 1 && args.l2_partials != nullptr)
      store_tile_l2<BT, W>(p, args.vector_y, smem, n0, m0, gw, cw, lane, rank, split, acc,
                           args.l2_partials + static_cast<int64_t>(blockIdx.x) * split * kSlotFloats);
    else
      store_tile<BT, W>(p, args.vector_y, smem, n0, m0, gw, cw, lane, rank, split, acc);
  }
#endif
}

// Resident CTAs per split (1, 2, 4, 8) of the BT-token kernel, measured once.
template <int BT, bool kOverlap, int W = 1>
void slots_of(const char* op, int (&slots)[4]) {
  static DeviceSlots slot_cache = {};
  resident_slots(op, gemm_w4a16_sm90_kernel<BT, kOverlap, W>, kThreads, Config<BT, W>::kSmemBytes, slot_cache,
                 slots);
}

// Split-K reduction of the one-launch plans: 1 through distributed shared memory (reduce_split_k), 2 through L2
// (store_tile_l2); both sum the same partials in the same order. The default unless a name pins one ('sm90c' / 'sm90g').
constexpr int kDefaultReduce = 1;
constexpr int kL2ReduceMaxCtas = 512;  // the L2 reduction's workspace: 128 KB per CTA of the launch, at most 64 MB

template <int BT, bool kOverlap, int W = 1, bool kSplitProducer = true>
void launch(const W4A16Problem& p, int split, int tile_base, int tiles, cudaStream_t stream, int reduce,
            bool pdl = false) {
  const char* op = "gemm_w4a16";
  auto kernel = gemm_w4a16_sm90_kernel<BT, kOverlap, W, kSplitProducer>;
  constexpr int kSmem = Config<BT, W>::kSmemBytes;
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int tiles_m = (p.m + BT - 1) / BT;
  const int k_chunks = p.k / kBK;
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;

  const bool vector_y = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  float* l2 = nullptr;
  if (split > 1 && (reduce == 0 ? kDefaultReduce : reduce) == 2 && static_cast<int64_t>(tiles) * split <= kL2ReduceMaxCtas) {
    int dev = 0;
    LOWBIT_CUDA_CHECK(op, cudaGetDevice(&dev));
    // the stream-K scratch (one per device and stream); inside a graph capture it may not grow: then DSMEM (same bits)
    l2 = streamk_workspace(op, dev, tiles * split, kSlotFloats, stream).partials;
  }
  const Args args{p, k_chunks, split, tile_base, tiles_m, vector_y, l2, pdl};
  const CUtensorMap map_x = make_map_2d(op, p.x, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, p.m, p.k, p.ldx * 2, BT);
  const CUtensorMap map_w =
      make_packed_weight_map(op, p.w, (p.n + 15) / 16, k_chunks, kChunkBytes, Config<BT, W>::kTiles, 1);
  launch_split_clusters(op, cfg, kernel, p.n, tiles, 1, split, pdl, map_x, map_w, args);
}

// ---- Stream-K (sm90_streamk.cuh): a persistent grid of the resident CTAs, equal k-block ranges ----

// Config<BT>'s stages, fewer where needed so the epilogue tile has smem of its own: the producer fills the next
// segment's stages while the consumers store this one's tile (BT 128: 8 stages; 256: 4; the wide tile W = 2: 6).
template <int BT, int W = 1>
struct SkConfig : Config<BT, W> {
  static constexpr int kOutBytes = BT * (Config<BT, W>::kRows + 8) * 2;
  static constexpr int kStages = std::min(8, (230400 - kOutBytes) / Config<BT, W>::kStageBytes);
  static constexpr int kSmemBytes = 1024 + kStages * Config<BT, W>::kStageBytes + kOutBytes + 2 * kStages * 8;
};

struct SkArgs {
  W4A16Problem p;
  StreamKSpace space;  // tiles x k blocks over gridDim.x CTAs
  int tiles_m;
  bool vector_y;
  StreamKWorkspace ws;  // partial slots of kRows x BT f32, flags
};

// One CTA's range of (tile, k block): the producer and the consumers walk the same segments with one running stage
// counter g (stage g % kStages, phase (g / kStages) & 1), so the pipeline runs on across segments. kSplitProducer as
// in gemm_w4a16_sm90_kernel: each of the three producer threads walks the same segments.
template <int BT, int W = 1, bool kSplitProducer = true>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_w4a16_sm90_streamk_kernel(const __grid_constant__ CUtensorMap map_x,
                                   const __grid_constant__ CUtensorMap map_w, const SkArgs args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = SkConfig<BT, W>;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kR = BT / 2 * W, kRowsC = C::kRows;
  const W4A16Problem& p = args.p;
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
    const int halves = w4a16::halves_differ(p.group) ? 2 : 1;
    int g = 0;
    for (int pe = end; pe > beg;) {  // segments last to first (sm90_streamk.cuh)
      int tile, ps;
      streamk_segment(sp, beg, pe, tile, ps);
      const int kb = ps - tile * kb_n, ke = pe - tile * kb_n;
      const int m0 = tile % args.tiles_m * BT, n0 = tile / args.tiles_m * kRowsC;
      const int tile0 = n0 / 16, prow = min(kRowsC, p.npad - n0);
      for (int kc = kb; kc < ke; ++kc, ++g) {
        const int s = g % kStages;
        mbar_wait(&empty[s], ((g / kStages) & 1) ^ 1);
        uint8_t* st = smem + s * kStageBytes;
        if constexpr (kSplitProducer) {
          produce_part<C>(part, st, &full[s], &map_x, &map_w, p, kc, m0, n0, prow, halves);
          continue;
        }
        mbar_expect_tx(&full[s], C::kXBytes + C::kWBytes + halves * 2 * prow * 2);
        tma_load_2d(st, &map_x, kc * kBK, m0, &full[s]);
        uint8_t* ws = st + C::kXBytes;
        tma_load_3d(ws, &map_w, 0, kc, tile0, &full[s]);
        for (int h = 0; h < halves; ++h) {
          uint8_t* ps = ws + C::kWBytes + h * 2 * kRowsC * 2;
          const int64_t row0 = static_cast<int64_t>(w4a16::param_row(kc, h, p.group)) * p.npad + n0;
          bulk_load(ps, p.scales + row0, prow * 2, &full[s]);
          bulk_load(ps + kRowsC * 2, p.zeros + row0, prow * 2, &full[s]);
        }
      }
      pe = ps;
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int t = threadIdx.x - 128;                          // consumer thread: its float4s in a partial slot
  const int gw = (wg - 1) * 4 * W + ((threadIdx.x >> 5) & 3);  // the warp's first 16-row weight tile
  const bool two_halves = w4a16::halves_differ(p.group);
  const auto stage_at = [&](int it) { return smem + (it % kStages) * kStageBytes; };
  uint32_t fa[16 * W], fb[16 * W];
  float acc[kR];
  int g = 0;
  for (int pe = end; pe > beg;) {  // segments last to first, as the producer loads them
    int tile, ps;
    streamk_segment(sp, beg, pe, tile, ps);
    const int g_end = g + (pe - ps);
#pragma unroll
    for (int i = 0; i < kR; ++i) acc[i] = 0.f;
    fence_regs(acc);
    mbar_wait(&full[g % kStages], (g / kStages) & 1);
    dequant_parts<C, W>(stage_at(g), gw, lane, two_halves, p.mins, fa);
    for (int it = g; it < g_end; it += 2) {
      consumer_step<true, C, W>(acc, fa, fb, it, g_end, stage_at, full, empty, gw, lane, two_halves, p.mins, g);
      if (it + 1 >= g_end) break;
      consumer_step<true, C, W>(acc, fb, fa, it + 1, g_end, stage_at, full, empty, gw, lane, two_halves, p.mins, g);
    }
    wgmma_wait<0>();
    fence_regs(acc);
    mbar_arrive(&empty[(g_end - 1) % kStages]);
    if (streamk_fixup<float4>(sp, args.ws, cta, t, tile, ps, pe, acc))
      store_tile_staged<BT, W>(p, args.vector_y, out, tile / args.tiles_m * kRowsC, tile % args.tiles_m * BT, gw,
                               lane, acc);
    pe = ps;
    g = g_end;
  }
#endif
}

// Resident CTAs of the stream-K kernel (one per SM: its smem), measured once per tile (both producers: same smem).
template <int BT, int W = 1>
int streamk_resident(const char* op) {
  static DeviceCounts cache = {};
  return resident_ctas(op, gemm_w4a16_sm90_streamk_kernel<BT, W, true>, kThreads, SkConfig<BT, W>::kSmemBytes, cache);
}

// Launches the stream-K kernel over `ctas` CTAs (0: every resident one); false when its workspace cannot be had
// (first use inside a graph capture: the caller takes the one-launch plans).
template <int BT, int W = 1, bool kSplitProducer = true>
bool launch_streamk(const W4A16Problem& p, int ctas, cudaStream_t stream) {
  const char* op = "gemm_w4a16";
  constexpr int kRowsC = Config<BT, W>::kRows;
  const int resident = streamk_resident<BT, W>(op);
  LOWBIT_CHECK(ctas >= 0 && ctas <= resident, op, ": stream-K over ", ctas, " CTAs; at most ", resident,
               " are resident at once");
  if (ctas == 0) ctas = resident;
  int dev = 0;
  LOWBIT_CUDA_CHECK(op, cudaGetDevice(&dev));
  // One size for every tile (the 256-token slot: 128 x 256 or, wide, 256 x 128 f32), so switching never regrows it.
  const int most = std::max({streamk_resident<128>(op), streamk_resident<256>(op), streamk_resident<128, 2>(op)});
  const StreamKWorkspace ws = streamk_workspace(op, dev, most, int64_t{kRows} * 256, stream);
  if (ws.partials == nullptr) return false;
  const int tiles_m = (p.m + BT - 1) / BT;
  const int k_chunks = p.k / kBK;
  const int64_t tiles = static_cast<int64_t>((p.n + kRowsC - 1) / kRowsC) * tiles_m;
  const bool vector_y = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  LOWBIT_CHECK(tiles * k_chunks <= INT32_MAX, op, ": m=", p.m, " n=", p.n, " k=", p.k, " is too large for stream-K");
  const SkArgs args{p, {static_cast<int>(tiles * k_chunks), ctas, k_chunks}, tiles_m, vector_y, ws};
  const CUtensorMap map_x = make_map_2d(op, p.x, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, p.m, p.k, p.ldx * 2, BT);
  const CUtensorMap map_w =
      make_packed_weight_map(op, p.w, (p.n + 15) / 16, k_chunks, kChunkBytes, Config<BT, W>::kTiles, 1);
  auto kernel = gemm_w4a16_sm90_streamk_kernel<BT, W, kSplitProducer>;
  if constexpr (!kSplitProducer)  // streamk_resident raised the split-producer instance's limit on this device only
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               SkConfig<BT, W>::kSmemBytes));
  kernel<<<ctas, kThreads, SkConfig<BT, W>::kSmemBytes, stream>>>(map_x, map_w, args);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  return true;
}

// Cost model constants (us per 64-k block at 128 / 256 tokens, fixed, reduction per 128-token partial;
// sm90_common.cuh's pick_tile_split), fitted to each mainloop's forced tile x split timings on an H200
// (bench/results/h200-2026-11-26-sm90-tiles-db5be10.json): the model's pick is the fastest measured pair on every
// Llama-3-8B shape at M = 256 and 1024.
constexpr TileCosts kSerialCosts{0.54, 0.68, 2.0, 3.7};
constexpr TileCosts kOverlapCosts{0.47, 0.68, 2.0, 3.7};
// The wide tile (256 rows x 128 tokens), for 'sm90w' (by name): 0.75-0.80 us per 64-k block unsplit (H200, qkv 256 /
// gate_up 128, bench/results/h200-2026-11-27-w4a16-wide-l2reduce-398940d.json), its split-K partial the size of a
// 256-token one (twice a 128-token one's reduction).
constexpr TileCosts kWideCosts{0.75, 0.75, 2.0, 7.4};

// ---- Small token tiles (16 / 32 / 64 tokens): decode-sized batches ----
//
// As in the W4A8 kernel (gemm_w4a8_sm90.cu; the model is sm90_common.cuh's pick_small_split): at 5-64 tokens a CTA's
// 64-k block is 4 KB of packed codes and 512 bytes of f16 scales and zeros read once from DRAM, against BT x 128
// bytes of activations re-read from L2, so the weight's bytes bound the launch. The tile is the smallest that holds m
// (unless pinned); the split is the cost model's. Its constants are the W4A8 kernel's scaled to a 64-k block (half
// the codes and stage time). Checked against forced splits on an H200
// (bench/results/h200-2026-11-29-w4a16-small-tiles-ef3fa3d.json, 8B and 70B/TP2 layers at 16 / 32 / 64 tokens): the
// fastest measured split on 21 of 24 shapes; on 8B down split 4 where 8 was 4-6% faster.
// one CTA's 64-k block alone on its SM (us), its bytes, the DRAM read rate the active CTAs share, fixed, reduction
constexpr SmallTileCosts kSmallCosts{0.30, kRows * kBK / 2 + 2 * 2 * kRows, 3.6e6, 3.0, 1.0};

// Whether the plan takes a small tile: pinned, or m <= kSmallAutoMaxTokens with the tile free, on the launches that
// have small-tile kernels (the overlapped mainloop with the split producer, one tile per CTA, 128 weight rows, the
// split-K reduction through cluster shared memory).
inline bool small_plan(const W4A16Problem& p, const Sm90Choice& ch) {
  if (is_small_tile(ch.tokens)) return true;
  return ch.tokens == 0 && p.m <= kSmallAutoMaxTokens && !ch.serial && !ch.one_producer && !ch.streamk &&
         ch.rows != 256 && ch.reduce != 2;
}

Sm90Plan plan_small(const W4A16Problem& p, const Sm90Choice& ch) {
  const int bt = ch.tokens != 0 ? ch.tokens : small_tile_for(p.m);
  int slots[4];
  if (bt == 16)
    slots_of<16, true>("gemm_w4a16", slots);
  else if (bt == 32)
    slots_of<32, true>("gemm_w4a16", slots);
  else
    slots_of<64, true>("gemm_w4a16", slots);
  const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * ((p.m + bt - 1) / bt);
  const int split = pick_small_split(tiles, p.k / kBK, slots, Config<16>::kCtasPerSm, kSmallCosts, ch.split);
  return {bt, split, 0, false};
}

// A pinned 16 / 32 / 64-token tile: only the launch that has those kernels.
void check_small_tile_choice(const Sm90Choice& choice) {
  LOWBIT_CHECK(!is_small_tile(choice.tokens) || (!choice.serial && !choice.one_producer && !choice.streamk &&
                                                 choice.rows != 256 && choice.reduce != 2),
               "gemm_w4a16: the 16 / 32 / 64-token tiles run the overlapped mainloop with the split producer, one tile "
               "per CTA of 128 weight rows ('sm90:S:T'), not 'sm90s' / 'sm90o' / 'sm90k' / 'sm90w' / 'sm90g'");
}

// The plan: pick_tile_split's tile x split (or two launches), or stream-K at 128 tokens when the tokens fit one
// 128-token tile (free choice, overlapped mainloop, allow_streamk), or where the caller forces it. Measured on an H200
// (docs/benchmarks_gpu.md, "Stream-K"): at M = 128 it won or tied on every Llama-3-8B layer (down 55.9 -> 36.4 us);
// from M = 256 it lost or tied on most (qkv 256: 29.7 -> 29.9 / 31.3): with every SM busy the 64-k block costs more
// than pick_tile_split's fit, each CTA re-reading its activation tile through L2.
template <bool kOverlap>
Sm90Plan plan_for(const W4A16Problem& p, const Sm90Choice& ch, bool allow_streamk = true) {
  if (kOverlap && small_plan(p, ch)) return plan_small(p, ch);
  if (ch.rows == 256) {  // the wide tile by name: stream-K, or its split (forced, else pick_tile_split's)
    if (ch.streamk) return {128, 0, 0, true, 256};
    int s[4];
    slots_of<128, true, 2>("gemm_w4a16", s);
    const TilePlan t = pick_tile_split((p.n + 255) / 256, p.m, p.k / kBK, s, s, kWideCosts, 128, ch.split);
    return {128, t.split, t.head, false, 256};
  }
  if (ch.streamk) return {ch.tokens != 0 ? ch.tokens : (p.m <= 128 ? 128 : 256), 0, 0, true};
  const bool free_sk = kOverlap && allow_streamk && !ch.no_streamk && ch.split == 0;
  // One token tile whose 256-row tiles fill 3/4 to all of one wave (gate_up at 128 tokens: 112 CTAs): the wide
  // tile unsplit, a 64-k block of twice the 128-row tile's work for ~1.5x its cost (docs/gpu_notes.md, "the wide
  // tile"); 'sm90n' / 'sm90nw' keep the plans before it.
  if (kOverlap && !ch.no_streamk && ch.split == 0 && ch.tokens == 0 && ch.rows == 0 && p.m <= 128) {
    int s[4];
    slots_of<128, true, 2>("gemm_w4a16", s);
    const int tiles_w = (p.n + 255) / 256;
    if (tiles_w <= s[0] && 4 * tiles_w >= 3 * s[0]) return {128, 1, 0, false, 256};
  }
  if (free_sk && ch.tokens != 256 && p.m <= 128) return {128, 0, 0, true};
  int s128[4], s256[4];
  slots_of<128, kOverlap>("gemm_w4a16", s128);
  slots_of<256, kOverlap>("gemm_w4a16", s256);
  const TilePlan t = pick_tile_split((p.n + kRows - 1) / kRows, p.m, p.k / kBK, s128, s256,
                                     kOverlap ? kOverlapCosts : kSerialCosts, ch.tokens, ch.split);
  return {t.tokens, t.split, t.head, false};
}

// kSplitProducer false: the earlier one-thread producer ('sm90o...' names, overlapped mainloop only), same plan.
template <bool kOverlap, bool kSplitProducer>
void run(const W4A16Problem& p, const Sm90Choice& choice, cudaStream_t stream) {
  Sm90Plan plan = plan_for<kOverlap>(p, choice);
  if constexpr (kOverlap && kSplitProducer) {
    if (is_small_tile(plan.tokens)) {  // one launch of one tile per CTA (split-K clusters), no head
      using Go = void (*)(const W4A16Problem&, int, int, int, cudaStream_t, int, bool);
      const Go go = plan.tokens == 16   ? launch<16, true, 1, true>
                    : plan.tokens == 32 ? launch<32, true, 1, true>
                                        : launch<64, true, 1, true>;
      const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * ((p.m + plan.tokens - 1) / plan.tokens);
      LOWBIT_CHECK(tiles <= INT32_MAX, "gemm_w4a16: m=", p.m, " x n=", p.n, " is too large for the sm90 kernel's grid");
      go(p, plan.split, 0, static_cast<int>(tiles), stream, choice.reduce, choice.pdl);
      return;
    }
  }
  if (plan.streamk) {
    bool ok = false;
    if constexpr (kOverlap) {
      if (plan.rows == 256) ok = launch_streamk<128, 2, kSplitProducer>(p, choice.ctas, stream);
    }
    if (plan.rows != 256)
      ok = plan.tokens == 128 ? launch_streamk<128, 1, kSplitProducer>(p, choice.ctas, stream)
                              : launch_streamk<256, 1, kSplitProducer>(p, choice.ctas, stream);
    if (ok) return;
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !choice.streamk, "gemm_w4a16: the stream-K workspace is allocated on "
                      "first use, which a graph capture forbids: run the op once before capturing");
    plan = plan_for<kOverlap>(p, choice, false);
  }
  if constexpr (kOverlap) {
    if (plan.rows == 256) {  // the wide tile's one-launch plan (overlapped mainloop only)
      const int64_t tiles = static_cast<int64_t>((p.n + 255) / 256) * ((p.m + 127) / 128);
      LOWBIT_CHECK(tiles <= INT32_MAX, "gemm_w4a16: m=", p.m, " x n=", p.n, " is too large for the sm90 kernel's grid");
      if (plan.head > 0) launch<128, true, 2, kSplitProducer>(p, 1, 0, plan.head, stream, choice.reduce);
      launch<128, true, 2, kSplitProducer>(p, plan.split, plan.head, static_cast<int>(tiles) - plan.head, stream,
                                           choice.reduce);
      return;
    }
  }
  const int64_t tiles = static_cast<int64_t>((p.n + kRows - 1) / kRows) * ((p.m + plan.tokens - 1) / plan.tokens);
  LOWBIT_CHECK(tiles <= INT32_MAX, "gemm_w4a16: m=", p.m, " x n=", p.n, " is too large for the sm90 kernel's grid");
  const auto go =
      plan.tokens == 128 ? launch<128, kOverlap, 1, kSplitProducer> : launch<256, kOverlap, 1, kSplitProducer>;
  if (plan.head > 0) go(p, 1, 0, plan.head, stream, choice.reduce, false);  // whole unsplit waves, then the rest split
  go(p, plan.split, plan.head, static_cast<int>(tiles) - plan.head, stream, choice.reduce, false);
}

}  // namespace

bool gemm_w4a16_sm90_usable(int device) {
  static std::atomic<int> cache[64] = {};
  return kernel_usable_on("gemm_w4a16", device, gemm_w4a16_sm90_kernel<256, true, 1, true>, cache);
}

// Tile and split (or stream-K) by the cost model unless forced.
void gemm_w4a16_sm90(const W4A16Problem& p, const Sm90Choice& choice, cudaStream_t stream) {
  check_tile_split_choice("gemm_w4a16", choice.split, choice.tokens, true);
  check_small_tile_choice(choice);
  LOWBIT_CHECK(!choice.streamk || (!choice.serial && choice.split == 0), "gemm_w4a16: stream-K runs the overlapped "
               "mainloop without a split");
  LOWBIT_CHECK(choice.rows != 256 || (!choice.serial && choice.tokens != 256), "gemm_w4a16: the wide tile (256 "
               "weight rows) runs the overlapped mainloop at 128 tokens");
  LOWBIT_CHECK(choice.reduce >= 0 && choice.reduce <= 2, "gemm_w4a16: the split-K reduction is 0, 1 or 2, got ",
               choice.reduce);
  LOWBIT_CHECK(!(choice.serial && choice.one_producer), "gemm_w4a16: the one-thread producer ('sm90o') runs the "
               "overlapped mainloop only");
  if (choice.serial)
    run<false, true>(p, choice, stream);
  else if (choice.one_producer)
    run<true, false>(p, choice, stream);
  else
    run<true, true>(p, choice, stream);
}

Sm90Plan gemm_w4a16_sm90_plan(int m, int n, int k, const Sm90Choice& choice) {
  check_tile_split_choice("gemm_w4a16", choice.split, choice.tokens, true);
  check_small_tile_choice(choice);
  W4A16Problem p{};
  p.m = m, p.n = n, p.k = k;
  return choice.serial ? plan_for<false>(p, choice) : plan_for<true>(p, choice);
}

}  // namespace lowbit::cuda::detail
