// W8A8 GEMMs for Hopper (sm_90a): wgmma with both 8-bit operands in shared memory, loaded by TMA
// into a multi-stage mbarrier pipeline (one producer warp, two consumer warpgroups). One kernel
// template serves int8 (s8 x s8 -> s32, gemm_w8a8) and fp8 (e4m3 x e4m3 -> f32, gemm_fp8): both
// are K-major 8-bit operands with k32 per instruction, so tiles, swizzle, descriptors and the
// accumulator fragment layout are the same; only the instruction and the accumulator type differ.
//
// The kernel computes D = A · Bᵀ for two K-major 8-bit matrices: A tiles of 128 rows (64 per consumer
// warpgroup), B tiles of BN rows, k in blocks of 128 bytes (one 128-byte swizzled smem row, which is
// the layout TMA's SWIZZLE_128B writes and wgmma's descriptors read). For m > 64, A = xq and B = wq
// (128 x 256 tiles). For small m the roles swap (A = wq, B = xq with BN = 32/64 covering all m) so
// the 64-row wgmma side is filled with weight rows instead of mostly-empty activation rows.
// Split-K runs as a thread-block cluster along k: each CTA accumulates its k range, then the
// partial tiles are summed through distributed shared memory (no workspace), each CTA reducing and
// writing a slice of rows: exact in int32; in f32 the partials are added in split-rank order, so an
// fp8 result depends (in its last bits) on the split. Epilogue: the raw accumulators (s32 / f32), or
// f16 of acc * x_scale * w_scale (the same f32 expression as the sm80 kernel: identical int8 outputs;
// fp8 outputs differ only as far as the two kernels' f32 sums do).
// Rows past m/n and the k tail of a 128-byte block are zero-filled by TMA (byte 0 is +0 in e4m3 too).
#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap (the encode function is fetched through the runtime; no -lcuda)
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <cstdlib>
#include <cstring>

#include "kernels/sm90/sm90_common.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"

namespace lowbit::cuda::detail {
namespace {

using namespace sm90;  // mbarrier, TMA and wgmma primitives; TMA maps; the split-K pick

constexpr int kBM = 128;  // A rows per CTA: two consumer warpgroups of 64
constexpr int kBK = 128;  // k bytes per stage (one swizzled 128-byte row)
constexpr int kThreads = 384;  // warpgroup 0: producer (one thread issues TMA), 1-2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kSmemBudget = 196608;  // pipeline bytes (the split-K reduction reuses them)

template <int BN>
struct Config {
  static constexpr int kStageBytes = kBM * kBK + BN * kBK;
  static constexpr int kStages = std::min(8, kSmemBudget / kStageBytes);
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kStageBytes % 1024 == 0, "stages must stay 1024-byte aligned for the 128B swizzle");
  static_assert(kBM * BN * 4 <= kStages * kStageBytes, "split-K reduction must fit in the pipeline smem");
};

struct Sm90Args {
  const float* x_scale;  // [m]
  const float* w_scale;  // [n]
  void* y;               // [m, n] f16 or s32
  int64_t ldy;
  int rows_a, rows_b;    // rows of the A and B operands (m/n, or n/m when swapped)
  int k_blocks, split;
  bool vec_ok;           // y pairs (n, n+1) may be stored as one 4/8-byte vector
};

#ifdef LOWBIT_SM90_DEVICE

// D = A · Bᵀ + (scale_d ? D : 0) for one k32 step (operand S becomes the scale-d predicate p).
// s8 x s8 -> s32 takes no operand scales. e4m3 x e4m3 -> f32 also takes imm-scale-a/b (1: no
// negation); it has no .satfinite and no transpose immediates (8-bit operands are K-major only).
#define LOWBIT_WGMMA_S8(SHAPE, REGS, DA, DB, S)                                       \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\n"                                      \
  "wgmma.mma_async.sync.aligned." SHAPE ".s32.s8.s8 " REGS ", " DA ", " DB ", p;\n}\n"
#define LOWBIT_WGMMA_E4M3(SHAPE, REGS, DA, DB, S)                                             \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\n"                                            \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32.e4m3.e4m3 " REGS ", " DA ", " DB ", p, 1, 1;\n}\n"

__device__ inline void wgmma_n32(int (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(LOWBIT_WGMMA_S8("m64n32k32", LOWBIT_REGS16, "%16", "%17", "%18")
               : LOWBIT_ACC16("+r", d, 0) : "l"(da), "l"(db), "r"(scale_d));
}
__device__ inline void wgmma_n32(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(LOWBIT_WGMMA_E4M3("m64n32k32", LOWBIT_REGS16, "%16", "%17", "%18")
               : LOWBIT_ACC16("+f", d, 0) : "l"(da), "l"(db), "r"(scale_d));
}
__device__ inline void wgmma_n64(int (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(LOWBIT_WGMMA_S8("m64n64k32", LOWBIT_REGS32, "%32", "%33", "%34")
               : LOWBIT_ACC32("+r", d, 0) : "l"(da), "l"(db), "r"(scale_d));
}
__device__ inline void wgmma_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(LOWBIT_WGMMA_E4M3("m64n64k32", LOWBIT_REGS32, "%32", "%33", "%34")
               : LOWBIT_ACC32("+f", d, 0) : "l"(da), "l"(db), "r"(scale_d));
}
// (n128 only for the promoted fp8 tiles; int8 uses n256 for m > 64.)
__device__ inline void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(LOWBIT_WGMMA_E4M3("m64n128k32", LOWBIT_REGS64, "%64", "%65", "%66")
               : LOWBIT_ACC64("+f", d) : "l"(da), "l"(db), "r"(scale_d));
}
__device__ inline void wgmma_n256(int (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(LOWBIT_WGMMA_S8("m64n256k32", LOWBIT_REGS128, "%128", "%129", "%130")
               : LOWBIT_ACC128("+r", d) : "l"(da), "l"(db), "r"(scale_d));
}
__device__ inline void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(LOWBIT_WGMMA_E4M3("m64n256k32", LOWBIT_REGS128, "%128", "%129", "%130")
               : LOWBIT_ACC128("+f", d) : "l"(da), "l"(db), "r"(scale_d));
}
#undef LOWBIT_WGMMA_E4M3
#undef LOWBIT_WGMMA_S8

// Acc int: s8 operands; Acc float: e4m3 operands (both 8-bit, K-major, same descriptors).
template <int BN, typename Acc>
__device__ inline void wgmma_tile(Acc (&d)[BN / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (BN == 256) wgmma_n256(d, da, db, scale_d);
  else if constexpr (BN == 128) wgmma_n128(d, da, db, scale_d);
  else if constexpr (BN == 64) wgmma_n64(d, da, db, scale_d);
  else wgmma_n32(d, da, db, scale_d);
}

// Four accumulators as one 16-byte value (int4 / float4), for the split-K exchange and the stores.
template <typename Acc>
struct Quad;
template <>
struct Quad<int> {
  using T = int4;
  using Pair = int2;
};
template <>
struct Quad<float> {
  using T = float4;
  using Pair = float2;
};

// Stores the accumulator pair of A row `ar`, B rows `br`, `br + 1` into y (raw: Acc; else f16).
template <bool kSwap, bool kRaw, typename Acc>
__device__ inline void store_pair(const Sm90Args& p, int ar, int br, Acc c0, Acc c1) {
  if (ar >= p.rows_a || br >= p.rows_b) return;
  const bool has1 = br + 1 < p.rows_b;
  auto value = [&](Acc c, int m, int n) {  // the sm80 kernel's epilogue expression, term for term
    return __float2half_rn(static_cast<float>(c) * p.x_scale[m] * p.w_scale[n]);
  };
  if constexpr (!kSwap) {  // y[ar, br..br+1]: contiguous
    const int64_t off = ar * p.ldy + br;
    if constexpr (kRaw) {
      Acc* y = static_cast<Acc*>(p.y) + off;
      if (has1 && p.vec_ok) {
        *reinterpret_cast<typename Quad<Acc>::Pair*>(y) = {c0, c1};
      } else {
        y[0] = c0;
        if (has1) y[1] = c1;
      }
    } else {
      __half* y = static_cast<__half*>(p.y) + off;
      const __half h0 = value(c0, ar, br);
      if (has1 && p.vec_ok) {
        *reinterpret_cast<__half2*>(y) = __halves2half2(h0, value(c1, ar, br + 1));
      } else {
        y[0] = h0;
        if (has1) y[1] = value(c1, ar, br + 1);
      }
    }
  } else {  // swapped: A rows are n, B rows are m
    if constexpr (kRaw) {
      Acc* y = static_cast<Acc*>(p.y);
      y[br * p.ldy + ar] = c0;
      if (has1) y[(br + 1) * p.ldy + ar] = c1;
    } else {
      __half* y = static_cast<__half*>(p.y);
      y[br * p.ldy + ar] = value(c0, br, ar);
      if (has1) y[(br + 1) * p.ldy + ar] = value(c1, br + 1, ar);
    }
  }
}

// Accumulator element v of lane `lane` in consumer warp gw (0..7, 16 A rows each): A row
// gw*16 + lane/4 (+8 for v%4 >= 2), B row (v/4)*8 + 2*(lane%4) + v%2.
// (The s32 and f32 wgmma accumulator layouts are the same.)
template <bool kSwap, bool kRaw, typename Q>
__device__ inline void store_quad(const Sm90Args& p, int a0, int b0, int gw, int lane, int v, Q c) {
  const int ar = a0 + gw * 16 + (lane >> 2), br = b0 + (v >> 2) * 8 + (lane & 3) * 2;
  store_pair<kSwap, kRaw>(p, ar, br, c.x, c.y);
  store_pair<kSwap, kRaw>(p, ar + 8, br, c.z, c.w);
}
#endif  // LOWBIT_SM90_DEVICE

// Grid: x = A tiles (rounded up to pairs when kMC), y = B tiles, z = split. Cluster: (kMC ? 2 : 1, 1,
// split). With kMC the two CTAs of a pair share their B tile: each loads one half and multicasts it
// to both, a third less L2->SM traffic per CTA; a stage is refilled only once both CTAs released it.
// (Predicted faster if the mainloop were L2-bandwidth bound; measured slower, so it is opt-in.)
// Acc int: s8 x s8 -> s32 (exact). Acc float: e4m3 x e4m3 -> f32 (products exact; the sums round,
// and split-K adds the f32 partials of the cluster's CTAs in rank order, so results differ from
// split 1 in the last bits).
// kPromote (fp8 only): the tensor cores' fp8 accumulation is reported to keep about 14 significant
// bits, not f32's 24, and its error grows with k. With kPromote each 128-k stage is summed by wgmma
// into a fresh register set (first instruction with scale-d 0), which is then added into the f32
// accumulators by ordinary FADDs, so the long sum is a true f32 one. It costs a second accumulator
// set (BN 256 would not fit in registers: the caller uses 128) and a wait for each stage's wgmmas.
template <typename Acc, int BN, bool kSwap, bool kRaw, bool kMC, bool kPromote>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_w8a8_sm90_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          const Sm90Args p) {
#ifdef LOWBIT_SM90_DEVICE
  using C = Config<BN>;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kR = BN / 2;
  using Q = typename Quad<Acc>::T;
  static_assert(!kPromote || BN <= 128, "a promoted 64 x 256 tile needs 256 accumulator registers");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  constexpr int kCX = kMC ? 2 : 1;  // cluster CTAs along x; cluster rank = x + kCX * z
  const int split = p.split, rank = static_cast<int>(blockIdx.z), mc = kMC ? static_cast<int>(blockIdx.x) & 1 : 0;
  const int a0 = static_cast<int>(blockIdx.x) * kBM, b0 = static_cast<int>(blockIdx.y) * BN;
  const int kb0 = rank * p.k_blocks / split, nk = (rank + 1) * p.k_blocks / split - kb0;
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps * kCX);  // with kMC both CTAs' consumers release a stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if constexpr (kMC) {
    cluster.sync();  // the partner's barriers exist before any multicast signals them
  } else {
    __syncthreads();
  }

  Acc acc[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) acc[i] = Acc(0);
  const int gw = (wg - 1) * 4 + ((threadIdx.x >> 5) & 3);  // consumer warp index in the tile

  if (wg == 0) {
    if (threadIdx.x == 0) {  // producer: refill a stage once all consumer warps released it
      for (int it = 0; it < nk; ++it) {
        const int s = it % kStages;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        uint8_t* sa = smem + s * kStageBytes;
        mbar_expect_tx(&full[s], kStageBytes);
        const int kc = (kb0 + it) * kBK;
        tma_load_2d(sa, &map_a, kc, a0, &full[s]);
        if constexpr (kMC) {
          tma_load_2d_multicast(sa + kBM * kBK + mc * (BN / 2) * kBK, &map_b, kc, b0 + mc * (BN / 2), &full[s],
                                static_cast<uint16_t>(3u << (kCX * rank)));
        } else {
          tma_load_2d(sa + kBM * kBK, &map_b, kc, b0, &full[s]);
        }
      }
    }
  } else {
    const uint32_t a_base = smem_u32(smem) + (wg - 1) * 64 * kBK, b_base = smem_u32(smem) + kBM * kBK;
    fence_regs(acc);
    for (int it = 0; it < nk; ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const uint64_t da = smem_desc(a_base + s * kStageBytes), db = smem_desc(b_base + s * kStageBytes);
      wgmma_fence();
      if constexpr (kPromote) {
        Acc part[kR];  // this stage's sum: the first wgmma overwrites it
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) wgmma_tile<BN>(part, da + 2 * kk, db + 2 * kk, kk > 0 ? 1 : 0);
        wgmma_commit();
        wgmma_wait<0>();  // this stage's wgmmas are done: hand it back, then fold the sum in
        fence_regs(part);
        if (lane == 0) {
          mbar_arrive(&empty[s]);
          if constexpr (kMC) mbar_arrive_cluster(&empty[s], (mc ^ 1) + kCX * rank);
        }
#pragma unroll
        for (int i = 0; i < kR; ++i) acc[i] += part[i];
      } else {
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) wgmma_tile<BN>(acc, da + 2 * kk, db + 2 * kk, 1);  // +32 bytes of k
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's wgmmas are done: hand it back to the producer
        if (it > 0 && lane == 0) {
          mbar_arrive(&empty[(it - 1) % kStages]);
          if constexpr (kMC) mbar_arrive_cluster(&empty[(it - 1) % kStages], (mc ^ 1) + kCX * rank);
        }
      }
    }
    wgmma_wait<0>();
    fence_regs(acc);
  }

  if (split == 1) {
    if (wg > 0) {
#pragma unroll
      for (int v = 0; v < kR; v += 4)
        store_quad<kSwap, kRaw>(p, a0, b0, gw, lane, v, Q{acc[v], acc[v + 1], acc[v + 2], acc[v + 3]});
    }
    if constexpr (kMC) cluster.sync();  // the partner may still arrive on our barriers until here
    return;
  }
  // Split-K: split rank j reduces rows [j, j+1) * 128/split of the tile. Slot r of CTA j holds
  // split rank r's partial of that slice as [warp in slice][v/4][lane] Q (int4 / float4). (With kMC
  // the pair partner's arrivals on our barriers also precede the first cluster.sync below.)
  const int slice_warps = kConsumerWarps / split;
  constexpr int kWarpAccs = kR * 32;
  Q* slots = reinterpret_cast<Q*>(smem);
  cluster.sync();  // every CTA's pipeline smem is idle
  if (wg > 0) {
    const int j = gw / slice_warps, lw = gw % slice_warps;
    Q* dst = cluster.map_shared_rank(slots, mc + kCX * j) + ((rank * slice_warps + lw) * kWarpAccs) / 4 + lane;
#pragma unroll
    for (int v = 0; v < kR; v += 4) dst[(v / 4) * 32] = Q{acc[v], acc[v + 1], acc[v + 2], acc[v + 3]};
  }
  cluster.sync();  // all partials have landed
  const int slice_quads = slice_warps * kWarpAccs / 4;
  for (int u = threadIdx.x; u < slice_quads; u += kThreads) {
    Q sum = slots[u];
    for (int r = 1; r < split; ++r) {
      const Q c = slots[r * slice_quads + u];
      sum.x += c.x, sum.y += c.y, sum.z += c.z, sum.w += c.w;
    }
    const int lw = u / (kWarpAccs / 4), v = ((u % (kWarpAccs / 4)) / 32) * 4, ln = u % 32;
    store_quad<kSwap, kRaw>(p, a0, b0, rank * slice_warps + lw, ln, v, sum);
  }
#endif
}


template <typename Acc, int BN, bool kSwap, bool kRaw, bool kMC, bool kPromote>
void launch(const char* op, const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y,
            int64_t ldy, int m, int n, int k, int forced_split, cudaStream_t stream) {
  auto kernel = gemm_w8a8_sm90_kernel<Acc, BN, kSwap, kRaw, kMC, kPromote>;
  constexpr int kCX = kMC ? 2 : 1;
  constexpr int kSmem = Config<BN>::kSmemBytes;
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int rows_a = kSwap ? n : m, rows_b = kSwap ? m : n;
  const int tiles_a = ((rows_a + kBM - 1) / kBM + kCX - 1) / kCX * kCX;  // whole pairs (a spare tile is all OOB)
  const int tiles_b = (rows_b + BN - 1) / BN;
  const int k_blocks = (k + kBK - 1) / kBK;

  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // CTAs resident at once for split 1, 2, 4, 8 (clusters of kCX * split must fit in one GPC; at most 8).
  static DeviceSlots slot_cache = {};
  const int device = current_device(op);
  std::atomic<int> uncached[4] = {};
  std::atomic<int>* row = device < kCachedDevices ? slot_cache[device] : uncached;
  int slots[4];
  for (int i = 0, s = 1; i < 4; ++i, s *= 2) {
    slots[i] = row[i].load();
    if (slots[i] == 0 && kCX * s <= 8) {
      cfg.gridDim = dim3(kCX * 8, 1, s);
      attr[0].val.clusterDim.x = kCX, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = s;
      int clusters = 0;
      LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
      slots[i] = std::max(1, clusters) * kCX * s;
      row[i].store(slots[i]);
    }
  }
  int split = forced_split > 0 ? forced_split : pick_split(tiles_a * tiles_b, k_blocks, slots);
  while (split > k_blocks || kCX * split > 8) split /= 2;  // each CTA needs a k block; portable cluster size

  const CUtensorMap map_a = kSwap ? make_map(op, wq, n, k, k, kBM) : make_map(op, xq, m, k, k, kBM);
  const CUtensorMap map_b = kSwap ? make_map(op, xq, m, k, k, BN) : make_map(op, wq, n, k, k, kMC ? BN / 2 : BN);
  const size_t esize = kRaw ? sizeof(Acc) : 2;
  Sm90Args args{xs, ws, y, ldy, rows_a, rows_b, k_blocks, split,
                reinterpret_cast<uintptr_t>(y) % (2 * esize) == 0 && ldy % 2 == 0};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles_a), static_cast<unsigned>(tiles_b), static_cast<unsigned>(split));
  attr[0].val.clusterDim.x = kCX, attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = static_cast<unsigned>(split);
  LOWBIT_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, map_a, map_b, args));
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

template <typename Acc, bool kRaw, bool kPromote>
void dispatch_m(const char* op, const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y,
                int64_t ldy, int m, int n, int k, int forced_split, bool pairs, cudaStream_t stream) {
  constexpr int kWide = kPromote ? 128 : 256;  // B tile for m > 64 (see kPromote)
  // Multicast pairs only when asked (Gemm8Options::sm90_pairs): measured slower on the H100 (int8
  // gate_up m=1024 351 vs 260 us, m=256 111 vs 87 us), kept for further work and tested.
  const bool no_pairs = !pairs;
  if (m <= 32) {
    launch<Acc, 32, true, kRaw, false, kPromote>(op, xq, wq, xs, ws, y, ldy, m, n, k, forced_split, stream);
  } else if (m <= 64) {
    launch<Acc, 64, true, kRaw, false, kPromote>(op, xq, wq, xs, ws, y, ldy, m, n, k, forced_split, stream);
  } else if (m <= kBM || no_pairs) {
    launch<Acc, kWide, false, kRaw, false, kPromote>(op, xq, wq, xs, ws, y, ldy, m, n, k, forced_split, stream);
  } else {  // at least two A tiles: pairs share (multicast) their weight tile (opt-in, see above)
    launch<Acc, kWide, false, kRaw, true, kPromote>(op, xq, wq, xs, ws, y, ldy, m, n, k, forced_split, stream);
  }
}

template <typename Acc, bool kRaw>
void dispatch(const char* op, const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y,
              int64_t ldy, int m, int n, int k, const Gemm8Options& o, cudaStream_t stream) {
  if constexpr (std::is_same_v<Acc, float>) {
    // fp8 promotes its sums to f32 every stage unless fp8_fast_accum (the tensor cores' own
    // accumulation throughout, 128 x 256 tiles like int8: for measuring what promotion costs).
    if (!o.fp8_fast_accum) {
      dispatch_m<Acc, kRaw, true>(op, xq, wq, xs, ws, y, ldy, m, n, k, o.sm90_split, o.sm90_pairs, stream);
      return;
    }
  }
  dispatch_m<Acc, kRaw, false>(op, xq, wq, xs, ws, y, ldy, m, n, k, o.sm90_split, o.sm90_pairs, stream);
}

// y[m, n] = xq · wqᵀ (raw accumulators, else f16 scaled); arguments already checked by the caller.
// o.sm90_split = 0 picks the cluster split itself; 1, 2, 4 or 8 forces it (tests).
template <typename Acc>
void run(const char* op, const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y, int64_t ldy,
         bool raw, int m, int n, int k, const Gemm8Options& o, cudaStream_t stream) {
  const int split_k = o.sm90_split;
  LOWBIT_CHECK(split_k == 0 || split_k == 1 || split_k == 2 || split_k == 4 || split_k == 8, op,
               ": split must be 0, 1, 2, 4 or 8, got ", split_k);
  if (raw) {
    dispatch<Acc, true>(op, xq, wq, xs, ws, y, ldy, m, n, k, o, stream);
  } else {
    dispatch<Acc, false>(op, xq, wq, xs, ws, y, ldy, m, n, k, o, stream);
  }
}

}  // namespace

// True when this device is sm_90 and the 90a kernels were built into this library (the s8 and
// e4m3 instantiations live in the same image).
bool gemm_w8a8_sm90_usable(const char* op, int device) {
  static std::atomic<int> cache[64] = {};
  return kernel_usable_on(op, device, gemm_w8a8_sm90_kernel<int, 256, false, false, false, false>, cache);
}

// s8 x s8: y s32 when raw.
void gemm_w8a8_sm90(const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y, int64_t ldy,
                    bool raw, int m, int n, int k, const Gemm8Options& o, cudaStream_t stream) {
  run<int>("gemm_w8a8", xq, wq, xs, ws, y, ldy, raw, m, n, k, o, stream);
}

// e4m3 x e4m3 (xq, wq are the e4m3 bytes): y f32 when raw.
void gemm_fp8_sm90(const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y, int64_t ldy,
                   bool raw, int m, int n, int k, const Gemm8Options& o, cudaStream_t stream) {
  run<float>("gemm_fp8", xq, wq, xs, ws, y, ldy, raw, m, n, k, o, stream);
}

}  // namespace lowbit::cuda::detail
