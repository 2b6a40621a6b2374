// W4A16 decode GEMM for Hopper (sm_90a): 1-16 tokens per 128-row tile, the decode step's GEMVs.
//
// Why a Hopper kernel for decode: the sm80 small-M kernel (gemm_w4a16_sm80.cu) reaches ~2.0 TB/s of weight bytes
// on an H200 (ncu: 42% of DRAM bandwidth, 8.5 cycles per issued instruction, ~148 warp instructions per 512-byte
// weight chunk, more than the ~112 issue slots an SM has per chunk at 4.8 TB/s). Many of those are its cp.async
// address arithmetic (one 16-byte copy per thread per unit, a runtime division for the group row) and the per-stage
// __syncthreads, so here one producer thread moves every copy to the copy engine (TMA): per stage of four 64-k
// chunks, one 3-D box of the CTA's eight 16-row weight tiles (16 KB), one 1-D bulk copy per group row of
// scales and of zeros (or mins) and one per token row of x; the eight consumer warps only dequantize and multiply.
// Full/empty mbarriers replace the block barrier; four stages (three for 16 tokens) of two CTAs per SM keep up to
// ~100 KB per SM in flight. The producer expects a stage's bytes, issues its copies, and only then writes the
// stage's slot table (without divisions) and arrives, so the weight box leaves first.
//
// The math is the sm80 kernel's: a warp owns one 16-row tile, dequantizes each 16x16 fragment once
// (w4a16_common_sm80.cuh: w = q*s - z*s, or q*s + m, in f16: the same weights bit for bit) and multiplies it into its
// 8-token tiles with mma.sync m16n8k16 (for a few tokens the tensor cores idle either way), into four accumulators
// (one per k16 step of a chunk, independent mma chains) summed in a fixed order at the end.
//
// Measured (H200, docs/benchmarks_gpu.md): 1.14-1.18x the small kernel at one token and 1.10-1.11x at 16 on the
// 28672-row gate_up layers, where 224 unsplit CTAs cover the SMs; 0.72-1.05x on the 4096-8192-row layers, which
// need a split-K cluster. The registry and the op's automatic choice therefore take this kernel only on layers of
// 16384 rows or more. Timed inside the first version, a consumer stage took ~0.9 us, the producer ~0.6 us before its
// weight box left and the box ~2.3 us to land; moving the table after the copies and four mma chains gained 2-7%.
// Eight stages of one CTA per SM were slower (0.86x the small kernel on gate_up): 224 CTAs then need two waves.
//
// Split-K runs as a thread-block cluster along z (1, 2, 4, 8 CTAs) whose f32 partials meet in distributed shared
// memory in rank order (sm90_common.cuh's reduce_split_k): no partials buffer and no second kernel. Launched as a
// programmatic dependent, the producer issues the first stages' weights before it waits for the kernel that
// writes x.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "cuda/pdl.cuh"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm90/gemm_w4a16_decode_sm90.h"
#include "kernels/sm90/sm90_common.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda::detail {
namespace {

using namespace sm90;

constexpr int kRows = 128;                    // weight rows per CTA: one 16-row tile per consumer warp
constexpr int kTiles = kRows / 16;
constexpr int kConsumerWarps = kTiles;
constexpr int kThreads = 32 * (kConsumerWarps + 1);  // + one producer warp
constexpr int kChunks = 4;                    // 64-k chunks per stage
constexpr int kChunkK = w4a16::kChunkK, kChunkBytes = w4a16::kChunkBytes;
constexpr int kParamSlots = 2 * kChunks;      // distinct group rows one stage can touch (g32: two per chunk)

template <int BT>
struct Config {
  static constexpr int kTilesM = BT / 8;
  static constexpr int kR = BT / 2;                                  // accumulators per lane
  static constexpr int kWBytes = kTiles * kChunks * kChunkBytes;      // [tile][chunk][512]: the TMA box
  static constexpr int kPBytes = kParamSlots * 2 * kRows * 2;         // [slot][scale | zero][row] f16
  static constexpr int kXRow = kChunks * kChunkK + 8;                 // halves; +16 bytes: conflict-free ldmatrix
  static constexpr int kXBytes = BT * kXRow * 2;
  static constexpr int kTableBytes = 2 * kChunks;                     // slot of (chunk, k half)
  static constexpr int kStageBytes = (kWBytes + kPBytes + kXBytes + kTableBytes + 127) / 128 * 128;
  static constexpr int kStages = BT == 8 ? 4 : 3;                     // two CTAs per SM either way
  static constexpr int kSmemBytes = 128 + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kRows * BT * 4 <= kStages * kStageBytes, "split-K reduction must fit in the pipeline smem");
  static_assert(BT * (kRows + 8) * 2 <= kStages * kStageBytes, "the staged output tile must fit in the pipeline smem");
};

struct Args {
  W4A16Problem p;
  int k_chunks, per_split;  // chunks per split rank (the last may hold fewer, or none)
  bool vector_y, pdl;
};

#ifdef LOWBIT_SM90_DEVICE
// Adds `bytes` to the barrier's expected transaction count without arriving (the producer arrives once its stage's
// other stores are done).
__device__ inline void mbar_expect_tx_only(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// The producer thread: stage `it` of this CTA's k range [kc0, kc_end) as weights + parameters (+ the slot table)
// and, separately, x, so that under PDL the weights of the first stages go out before the wait for x.
template <int BT>
struct Producer {
  using C = Config<BT>;
  const Args& a;
  const CUtensorMap* map_w;
  uint8_t* smem;
  uint64_t* full;
  int n0, m0, kc0, kc_end, rows_x;

  __device__ uint8_t* stage(int it) const { return smem + (it % C::kStages) * C::kStageBytes; }
  __device__ int chunks_of(int it) const { return min(kChunks, kc_end - (kc0 + it * kChunks)); }

  __device__ void weights(int it) const {
    const W4A16Problem& p = a.p;
    uint8_t* st = stage(it);
    uint64_t* bar = &full[it % C::kStages];
    const int kc = kc0 + it * kChunks, chunks = chunks_of(it);
    // Group rows in half chunks (groups are multiples of 32): half chunk h0 + i reads row (h0 + i) / halves.
    const int halves = p.group / 32, h0 = 2 * kc;
    const int first = h0 / halves;
    const int slots = (h0 + 2 * chunks - 1) / halves - first + 1;  // <= kParamSlots
    const int prow = min(kRows, p.npad - n0);  // parameter rows to copy: a multiple of 16
    // Every byte of the stage, x included (x may be issued later: the phase completes only when all of them have
    // landed), is expected before any copy; the copies go out first, the slot table after them (it is not on the
    // copies' path), and the producer's one arrival comes last, ordering the table's stores before the consumers.
    mbar_expect_tx_only(bar, C::kWBytes + slots * 2 * prow * 2 + rows_x * chunks * kChunkK * 2);
    tma_load_3d(st, map_w, 0, kc, n0 / 16, bar);  // tiles past n and chunks past k read as zeros
    uint8_t* ps = st + C::kWBytes;
    for (int r = 0; r < slots; ++r) {
      const int64_t row0 = static_cast<int64_t>(first + r) * p.npad + n0;
      bulk_load(ps + r * 2 * kRows * 2, p.scales + row0, prow * 2, bar);
      bulk_load(ps + r * 2 * kRows * 2 + kRows * 2, p.zeros + row0, prow * 2, bar);
    }
    uint8_t* table = st + C::kWBytes + C::kPBytes + C::kXBytes;
    int slot = 0, into = h0 - first * halves;  // half chunks already into the current group
    for (int i = 0; i < 2 * kChunks; ++i) {
      table[i] = static_cast<uint8_t>(i < 2 * chunks ? slot : 0);
      if (++into == halves) into = 0, ++slot;
    }
    mbar_arrive(bar);
  }

  __device__ void activations(int it) const {
    const W4A16Problem& p = a.p;
    uint8_t* xs = stage(it) + C::kWBytes + C::kPBytes;
    const int kc = kc0 + it * kChunks, bytes = chunks_of(it) * kChunkK * 2;
    for (int t = 0; t < rows_x; ++t)
      bulk_load(xs + t * C::kXRow * 2, p.x + static_cast<int64_t>(m0 + t) * p.ldx + kc * kChunkK, bytes,
                &full[it % C::kStages]);
  }

  __device__ void run(int stages, uint64_t* empty) const {
    const int prologue = min(stages, C::kStages);  // fresh slots: no wait for the consumers
    for (int it = 0; it < prologue; ++it) weights(it);
    if (a.pdl) pdl_wait_for_producers();  // x comes from the kernel before this one
    for (int it = 0; it < prologue; ++it) activations(it);
    for (int it = prologue; it < stages; ++it) {
      mbar_wait(&empty[it % C::kStages], ((it / C::kStages) & 1) ^ 1);
      weights(it);
      activations(it);
    }
  }
};

struct Params {
  __half2 s_lo, nzs_lo, s_hi, nzs_hi;
};

// The scale and zero (or min) of rows g and g + 8 of warp gw's tile from parameter slot `slot` of a stage.
template <bool kMins>
__device__ inline Params load_params(const __half* ps, int slot, int row) {
  const __half* h = ps + slot * 2 * kRows;
  const __half s0 = h[row], s8 = h[row + 8], z0 = h[kRows + row], z8 = h[kRows + row + 8];
  return {__half2half2(s0), w4a16::addend_of(z0, s0, kMins), __half2half2(s8), w4a16::addend_of(z8, s8, kMins)};
}

// One consumer warp's share of a stage: per chunk, each k16 step's weight fragment dequantized once and
// multiplied into each 8-token tile. Step s of every chunk accumulates into acc[s]: four independent mma chains
// instead of one, because a warp's dependent mma.sync chain (16 per stage) was most of its time per stage (timed
// in the kernel on an H200: ~0.9 us per 16 KB stage with one chain); they are summed once at the end. kMins: the second
// parameter is a min (GGUF Q4_1), a compile-time choice so that neither kind issues the other's instructions.
template <class C, bool kMins>
__device__ __forceinline__ void compute_stage(const uint8_t* st, int chunks, int gw, int lane,
                                              float (&acc)[4][C::kTilesM][4]) {
  const uint4* ws = reinterpret_cast<const uint4*>(st);
  const __half* ps = reinterpret_cast<const __half*>(st + C::kWBytes);
  const __half* xs = reinterpret_cast<const __half*>(st + C::kWBytes + C::kPBytes);
  const uint8_t* table = st + C::kWBytes + C::kPBytes + C::kXBytes;
  const int row = gw * 16 + (lane >> 2);
  int slot = -1;
  Params prm{};
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c >= chunks) break;
    const uint4 wv = ws[(gw * kChunks + c) * 32 + lane];
    const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      if (step == 0 || step == 2) {  // k 0-31 and 32-63 of the chunk may lie in different groups (g32)
        const int s = table[2 * c + step / 2];
        if (s != slot) prm = load_params<kMins>(ps, s, row), slot = s;
      }
      uint32_t a[4];
      w4a16::dequant_word(words[step], prm.s_lo, prm.nzs_lo, prm.s_hi, prm.nzs_hi, a);
#pragma unroll
      for (int j = 0; j < C::kTilesM; ++j) {
        const int r = j * 8 + (lane & 7);
        uint32_t b0, b1;
        w4a16::ldmatrix_x2(w4a16::smem_addr(xs + r * C::kXRow + c * kChunkK + 16 * step + 8 * ((lane >> 3) & 1)), b0,
                           b1);
        w4a16::mma_16816(acc[step][j], a, b0, b1);
      }
    }
  }
}

// Accumulator v of lane `lane` in consumer warp gw: weight row gw*16 + lane/4 (+8 when v%4 >= 2), token
// (v/4)*8 + 2*(lane%4) + v%2 (mma.sync's layout per 8-token tile, the same as wgmma's).
__device__ inline void store_acc(const W4A16Problem& p, int n0, int m0, int gw, int lane, int v, float acc) {
  const int n = n0 + gw * 16 + (lane >> 2) + ((v >> 1) & 1) * 8;
  const int m = m0 + (v >> 2) * 8 + (lane & 3) * 2 + (v & 1);
  if (n < p.n && m < p.m) p.y[static_cast<int64_t>(m) * p.ldy + n] = __float2half_rn(acc);
}
#endif  // LOWBIT_SM90_DEVICE

// Grid: x = token tiles of BT, y = 128-row weight tiles, z = split-K rank (one cluster along z).
template <int BT, bool kMins>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_w4a16_decode_sm90_kernel(const __grid_constant__ CUtensorMap map_w, const Args args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = Config<BT>;
  const W4A16Problem& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((128 - (smem_u32(smem_raw) & 127)) & 127);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kStages * C::kStageBytes);
  uint64_t* empty = full + C::kStages;

  const int split = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
  const int m0 = static_cast<int>(blockIdx.x) * BT, n0 = static_cast<int>(blockIdx.y) * kRows;
  const int kc0 = min(rank * args.per_split, args.k_chunks);
  const int kc_end = min(kc0 + args.per_split, args.k_chunks);
  const int stages = (kc_end - kc0 + kChunks - 1) / kChunks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps * 32);  // every consumer thread releases
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      const Producer<BT> producer{args, &map_w, smem, full, n0, m0, kc0, kc_end, min(BT, p.m - m0)};
      producer.run(stages, empty);
    }
    __syncwarp();
    if (split > 1) {  // the two cluster barriers of the consumers' split-K reduction
      cooperative_groups::this_cluster().sync();
      cooperative_groups::this_cluster().sync();
    }
    return;
  }

  float acc[4][C::kTilesM][4] = {};  // one per k16 step of a chunk: four independent mma chains
  for (int it = 0; it < stages; ++it) {
    const int s = it % C::kStages;
    mbar_wait(&full[s], (it / C::kStages) & 1);
    compute_stage<C, kMins>(smem + s * C::kStageBytes, min(kChunks, kc_end - (kc0 + it * kChunks)), warp, lane, acc);
    mbar_arrive(&empty[s]);  // this thread's reads of the stage are done (their values fed the mma above)
  }
  float flat[C::kR];
#pragma unroll
  for (int v = 0; v < C::kR; ++v)
    flat[v] = (acc[0][v / 4][v % 4] + acc[1][v / 4][v % 4]) + (acc[2][v / 4][v % 4] + acc[3][v / 4][v % 4]);
  if (split == 1) {
    store_rows_through_smem<kRows, BT, kConsumerWarps>(smem, p.y, p.ldy, p.m, p.n, m0, n0, warp, lane, args.vector_y,
                                                       [&](int v, int) { return __float2half_rn(flat[v]); });
  } else {
    reduce_split_k<kConsumerWarps, float4>(smem, warp, lane, rank, split, flat, [&](int w, int ln, int v, float4 s) {
      store_acc(p, n0, m0, w, ln, v, s.x);
      store_acc(p, n0, m0, w, ln, v + 1, s.y);
      store_acc(p, n0, m0, w, ln, v + 2, s.z);
      store_acc(p, n0, m0, w, ln, v + 3, s.w);
    });
  }
#endif
}

// Resident CTAs per split (1, 2, 4, 8) of the BT-token kernel, measured once.
template <int BT>
void slots_of(int (&slots)[4]) {
  static DeviceSlots cache = {};
  resident_slots("gemm_w4a16", gemm_w4a16_decode_sm90_kernel<BT, false>, kThreads, Config<BT>::kSmemBytes, cache,
                 slots);
}

// Split-K cluster size: the smallest of 1, 2, 4, 8 whose CTAs cover every SM in one wave, keeping at least two
// stages per CTA (a decode GEMV is bound by the weight bytes in flight, so idle SMs are lost bandwidth and a second
// wave is a second pipeline fill).
template <int BT>
int pick_split(int tiles, int k_chunks, int sms) {
  int slots[4];
  slots_of<BT>(slots);
  int best = 1;
  for (int i = 0, s = 1; i < 4; ++i, s *= 2) {
    if (s > 1 && (k_chunks / s < 2 * kChunks || tiles * s > slots[i])) break;
    best = s;
    if (tiles * s >= sms) break;
  }
  return best;
}

int sm_count() {
  int device = 0, sms = 0;
  LOWBIT_CUDA_CHECK("gemm_w4a16", cudaGetDevice(&device));
  LOWBIT_CUDA_CHECK("gemm_w4a16", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

template <int BT>
void launch(const W4A16Problem& p, int split, bool pdl, cudaStream_t stream) {
  const char* op = "gemm_w4a16";
  auto kernel = p.mins ? gemm_w4a16_decode_sm90_kernel<BT, true> : gemm_w4a16_decode_sm90_kernel<BT, false>;
  constexpr int kSmem = Config<BT>::kSmemBytes;
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int tiles_n = (p.n + kRows - 1) / kRows, tiles_m = (p.m + BT - 1) / BT, k_chunks = p.k / kChunkK;
  LOWBIT_CHECK(tiles_n <= 65535, op, ": n=", p.n, " is too large for the decode kernel's grid");
  const int per = (k_chunks + split - 1) / split;
  const bool vector_y = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  const Args args{p, k_chunks, per, vector_y, pdl};
  const CUtensorMap map_w = make_packed_weight_map(op, p.w, (p.n + 15) / 16, k_chunks, kChunkBytes, kTiles, kChunks);

  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = static_cast<unsigned>(split);
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n), static_cast<unsigned>(split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  LOWBIT_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, map_w, args));
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

bool gemm_w4a16_decode_sm90_usable(int device) {
  static std::atomic<int> cache[64] = {};
  return kernel_usable_on("gemm_w4a16", device, gemm_w4a16_decode_sm90_kernel<16, false>, cache);
}

int gemm_w4a16_decode_sm90_split(int m, int n, int k, int split) {
  LOWBIT_CHECK(split == 0 || split == 1 || split == 2 || split == 4 || split == 8,
               "gemm_w4a16: the decode kernel's split-K cluster must be 0 (automatic), 1, 2, 4 or 8, got ", split);
  if (split != 0) return split;
  const int tiles = (n + kRows - 1) / kRows * ((m + 15) / 16), k_chunks = k / kChunkK;
  return m <= 8 ? pick_split<8>(tiles, k_chunks, sm_count()) : pick_split<16>(tiles, k_chunks, sm_count());
}

void gemm_w4a16_decode_sm90(const W4A16Problem& p, int split, bool pdl, cudaStream_t stream) {
  const int s = gemm_w4a16_decode_sm90_split(p.m, p.n, p.k, split);
  if (p.m <= 8)
    launch<8>(p, s, pdl, stream);
  else
    launch<16>(p, s, pdl, stream);
}

}  // namespace lowbit::cuda::detail
