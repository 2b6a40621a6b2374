// COMET W4Ax GEMM for Hopper (sm_90a): gemm_w4a8_sm90.cu's wgmma pipeline (the u4 weight dequantized in
// registers as the wgmma A operand, (q*s + a) ^ 0x80 per byte; the s8 activations by TMA as the B operand;
// one producer thread; two consumer warpgroups of 64 weight rows; stages of 128 k) over FMPQ activations.
// A stage is exactly one 128-channel FMPQ block, whose exact int32 sums are flushed into f32 accumulators with
// each token's block scale: facc = fma(float(acc), scale, facc), blocks in order. Int4 blocks are s8 values in
// [-7, 7]: on sm_90 they run on the s8 tensor cores like the int8 blocks (no fast s4 MMA here).
// Two mainloops. Serial (kernel name 'sm90s', kept for A/B timing): each consumer waits for its stage's wgmmas,
// then flushes them with the block scales it loaded from global memory meanwhile; the tensor cores idle during
// the flush. Overlapped (the default, about 2x faster at 256-1024 tokens on an H200): each consumer warpgroup keeps two int32 accumulator
// sets and alternates them by block, so block b+1's wgmmas run while block b's set is flushed (one fragment set:
// block b+1 is dequantized once block b's wgmmas are done, while the other warpgroup's run); a second producer
// warp copies each stage's 128 token scales (one column of the [m, blocks] scales) into the stage by 4-byte
// cp.async, completing on the stage's full barrier, so the flush reads them from shared memory. Both flush the
// same values in the same order: their outputs are bit-identical. 128-token tiles only: the f32 tile beside the
// int32 set(s) fills the consumers' registers. Split-K runs as a cluster along k (whole blocks per CTA) whose
// f32 partials are summed in rank order through distributed shared memory.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "kernels/sm90/gemm_fmpq_sm90.h"
#include "kernels/sm90/sm90_common.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda::detail {
namespace {

using namespace sm90;

constexpr int kRows = 128;          // weight rows per CTA: two consumer warpgroups of 64
constexpr int kTiles = kRows / 16;  // packed 16-row tiles per CTA
constexpr int kBK = 128;            // k per stage: two 64-k chunks = one FMPQ block
constexpr int kBT = 128;            // tokens per CTA (the wgmma n)
constexpr int kR = kBT / 2;         // accumulators per consumer lane
constexpr int kChunkBytes = 512;    // one packed 16-row x 64-k tile
constexpr int kThreads = 384;       // warpgroup 0: producer (one thread issues the copies), 1-2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kSmemBudget = 215040;

struct Config {
  static constexpr int kXBytes = kBT * kBK;                 // activation tile (swizzled, 1024-aligned)
  static constexpr int kWBytes = kTiles * 2 * kChunkBytes;  // [tile][chunk][lane] 16-byte units
  static constexpr int kPBytes = 2 * 2 * kRows;             // [chunk][step | offset][row] u8
  static constexpr int kSBytes = kBT * 4;                   // the stage's block scale of each tile token (f32)
  static constexpr int kSOffset = kXBytes + kWBytes + kPBytes;
  static constexpr int kStageBytes = (kSOffset + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kStages = std::min(8, kSmemBudget / kStageBytes);
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kRows * kBT * 4 <= kStages * kStageBytes, "split-K reduction must fit in the pipeline smem");
  static_assert(kBT * (kRows + 8) * 2 <= kStages * kStageBytes, "the staged output tile must fit in the pipeline smem");
};

struct Args {
  FmpqProblem p;
  int k_blocks, k_chunks, split;
  bool vector_y;  // f16 y rows 16-byte aligned: the staged epilogue stores 8 halves at a time
};

#ifdef LOWBIT_SM90_DEVICE
// D += A · Bᵀ for one k32 step.
__device__ inline void wgmma_rs(int (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " LOWBIT_REGS64 ", {%64, %65, %66, %67}, %68, p;\n}\n"
      : LOWBIT_ACC64("+r", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// D = A · Bᵀ (a block's first k32 step): D's earlier values are dead, which frees their registers until here.
__device__ inline void wgmma_rs_first(int (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " LOWBIT_REGS64 ", {%64, %65, %66, %67}, %68, 0;\n"
      : LOWBIT_ACC64("=r", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// 4-byte async copy (zero fill when `valid` is false: nothing is read) and the arrival on `bar` when this thread's
// earlier copies land (noinc: the barrier's count includes it).
__device__ inline void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ inline void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ inline uint32_t dequant_bytes(uint32_t codes, uint32_t step, uint32_t offset4) {
  return (codes * step + offset4) ^ 0x80808080u;
}
// An int32 |v| < 2^22 as an exact float without the quarter-rate I2F (a block's |sum| < 2^21).
__device__ inline float exact_float(int v) { return __int_as_float(0x4B400000 + v) - 12582912.f; }

// gemm_w4a8_sm90.cu's: a stage's packed weights of consumer warp gw's 16-row tile as wgmma A fragments.
__device__ __forceinline__ void dequant_stage(const uint8_t* st, int gw, int lane, int chunks, uint32_t (&a)[16]) {
  const uint4* ws = reinterpret_cast<const uint4*>(st + Config::kXBytes);
  const uint8_t* ps = st + Config::kXBytes + Config::kWBytes;
  const int row = gw * 16 + (lane >> 2);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    if (c >= chunks) {  // a one-chunk tail stage: chunk 1 was not loaded; zero weights add nothing
#pragma unroll
      for (int r = 8; r < 16; ++r) a[r] = 0;
      break;
    }
    const uint4 wv = ws[(gw * 2 + c) * 32 + lane];
    const uint8_t* pc = ps + c * 2 * kRows;
    const uint32_t s_g = pc[row], s_g8 = pc[row + 8];
    const uint32_t a_g = pc[kRows + row] * 0x01010101u, a_g8 = pc[kRows + row + 8] * 0x01010101u;
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

// Stage `it` (FMPQ block kb) of one consumer warpgroup: issue its wgmmas from `cur`, load the block scales of
// this lane's 32 tokens and dequantize stage it+1 into `next` meanwhile, wait for the wgmmas, release the stage,
// then flush: facc += acc * scale, acc = 0. Lane tokens: (q)*8 + 2*(lane%4) + e, accumulator v = 4q + 2h + e.
template <class StageAt, class ChunksAt>
__device__ __forceinline__ void consumer_step(int (&acc)[kR], float (&facc)[kR], const uint32_t (&cur)[16],
                                              uint32_t (&next)[16], int it, int nk, int kb, const FmpqProblem& p,
                                              int m0, const StageAt& stage_at, const ChunksAt& chunks_at,
                                              uint64_t* full, uint64_t* empty, int gw, int lane) {
  constexpr int kStages = Config::kStages;
  const uint64_t db = smem_desc(smem_u32(stage_at(it)));
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t f[4] = {cur[4 * i], cur[4 * i + 1], cur[4 * i + 2], cur[4 * i + 3]};
    wgmma_rs(acc, f, db + 2 * i);  // k32 step i of the stage: +32 bytes of k in the swizzled row
  }
  wgmma_commit();
  float xs[kBT / 4];
#pragma unroll
  for (int q = 0; q < kBT / 8; ++q)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int token = m0 + q * 8 + (lane & 3) * 2 + e;
      xs[2 * q + e] = token < p.m ? __ldg(p.x_scale + static_cast<int64_t>(token) * p.blocks + kb) : 0.f;
    }
  if (it + 1 < nk) {
    mbar_wait(&full[(it + 1) % kStages], ((it + 1) / kStages) & 1);
    dequant_stage(stage_at(it + 1), gw, lane, chunks_at(it + 1), next);
  }
  wgmma_wait<0>();
  fence_regs(acc);
  mbar_arrive(&empty[it % kStages]);
#pragma unroll
  for (int v = 0; v < kR; ++v) {
    facc[v] = fmaf(exact_float(acc[v]), xs[2 * (v >> 2) + (v & 1)], facc[v]);
    acc[v] = 0;
  }
  fence_regs(acc);
}

// Issues stage `it`'s four wgmmas from fragments `f` into `acc`, overwriting it (each block starts from zero).
template <class StageAt>
__device__ __forceinline__ void issue_block(int (&acc)[kR], const uint32_t (&f)[16], int it, const StageAt& stage_at) {
  const uint64_t db = smem_desc(smem_u32(stage_at(it)));
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a[4] = {f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3]};
    if (i == 0)
      wgmma_rs_first(acc, a, db);
    else
      wgmma_rs(acc, a, db + 2 * i);
  }
  wgmma_commit();
}

// facc += acc * scale for the finished block of stage `it` (scales from the stage), then releases the stage.
template <class StageAt>
__device__ __forceinline__ void flush_block(const int (&acc)[kR], float (&facc)[kR], int it, const StageAt& stage_at,
                                            uint64_t* empty, int lane) {
  const float* xs = reinterpret_cast<const float*>(stage_at(it) + Config::kSOffset) + (lane & 3) * 2;
#pragma unroll
  for (int q = 0; q < kR / 4; ++q) {
    const float2 sc = *reinterpret_cast<const float2*>(xs + q * 8);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      facc[4 * q + 2 * h] = fmaf(exact_float(acc[4 * q + 2 * h]), sc.x, facc[4 * q + 2 * h]);
      facc[4 * q + 2 * h + 1] = fmaf(exact_float(acc[4 * q + 2 * h + 1]), sc.y, facc[4 * q + 2 * h + 1]);
    }
  }
  mbar_arrive(&empty[it % Config::kStages]);
}

// Overlapped stage `it` (it >= 1) of one consumer warpgroup: once block it-1 (in `acc_prev`) is complete, dequantize
// stage it into the fragments `f` (one set: the registers go to the two accumulator sets), issue block it into
// `acc_it`, and flush block it-1 while block it's wgmmas run. The other consumer warpgroup's wgmmas keep the tensor
// cores busy during this one's dequantization.
template <class StageAt, class ChunksAt>
__device__ __forceinline__ void overlap_step(int (&acc_it)[kR], int (&acc_prev)[kR], uint32_t (&f)[16],
                                             float (&facc)[kR], int it, const StageAt& stage_at,
                                             const ChunksAt& chunks_at, uint64_t* full, uint64_t* empty, int gw,
                                             int lane) {
  wgmma_wait<0>();
  fence_regs(acc_prev);
  mbar_wait(&full[it % Config::kStages], (it / Config::kStages) & 1);
  dequant_stage(stage_at(it), gw, lane, chunks_at(it), f);
  issue_block(acc_it, f, it, stage_at);
  flush_block(acc_prev, facc, it - 1, stage_at, empty, lane);
}

__device__ inline void store_value(const FmpqProblem& p, int n0, int m0, int gw, int lane, int v, float value) {
  const int n = n0 + gw * 16 + (lane >> 2) + ((v >> 1) & 1) * 8;
  const int m = m0 + (v >> 2) * 8 + (lane & 3) * 2 + (v & 1);
  if (n >= p.n || m >= p.m) return;
  const float y = value * p.channel_scale[n];
  if (p.f32_out)
    static_cast<float*>(p.y)[m * p.ldy + n] = y;
  else
    static_cast<__half*>(p.y)[m * p.ldy + n] = __float2half_rn(y);
}

__device__ inline void store_tile(const FmpqProblem& p, bool vector_y, uint8_t* smem, int n0, int m0, int gw, int lane,
                                  int rank, int split, const float (&facc)[kR]) {
  if (split == 1 && !p.f32_out) {
    const int r_lo = n0 + gw * 16 + (lane >> 2), r_hi = r_lo + 8;  // channel_scale holds npad rows
    const float cs_lo = r_lo < p.npad ? p.channel_scale[r_lo] : 0.f;
    const float cs_hi = r_hi < p.npad ? p.channel_scale[r_hi] : 0.f;
    store_rows_through_smem<kRows, kBT, kConsumerWarps>(
        smem, static_cast<__half*>(p.y), p.ldy, p.m, p.n, m0, n0, gw, lane, vector_y,
        [&](int v, int) { return __float2half_rn(facc[v] * (((v >> 1) & 1) ? cs_hi : cs_lo)); });
    return;
  }
  if (split == 1) {
#pragma unroll
    for (int v = 0; v < kR; ++v) store_value(p, n0, m0, gw, lane, v, facc[v]);
    return;
  }
  reduce_split_k<kConsumerWarps, float4>(smem, gw, lane, rank, split, facc, [&](int w, int ln, int v, float4 sum) {
    store_value(p, n0, m0, w, ln, v, sum.x);
    store_value(p, n0, m0, w, ln, v + 1, sum.y);
    store_value(p, n0, m0, w, ln, v + 2, sum.z);
    store_value(p, n0, m0, w, ln, v + 3, sum.w);
  });
}
#endif  // LOWBIT_SM90_DEVICE

// Grid: x = token tiles of 128, y = weight-row tiles of 128, z = split (one cluster along z).
template <bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fmpq_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                          const Args args) {
#ifdef LOWBIT_SM90_DEVICE
  using C = Config;
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes;
  const FmpqProblem& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  const int split = args.split, rank = static_cast<int>(blockIdx.z);
  const int m0 = static_cast<int>(blockIdx.x) * kBT, n0 = static_cast<int>(blockIdx.y) * kRows;
  const int kb0 = rank * args.k_blocks / split, nk = (rank + 1) * args.k_blocks / split - kb0;
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], kOverlap ? 1 + 32 : 1);  // the copies' arrival (+ the scale warp's 32 lanes)
      mbar_init(&empty[s], kConsumerWarps * 32);  // every consumer thread releases
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int gw = (wg - 1) * 4 + ((threadIdx.x >> 5) & 3);  // consumer warp = its 16-row weight tile
  if (wg == 0) {
    // The overlapped consumers need 240 registers (f32 tile + two int32 sets); the serial ones keep 232.
    if constexpr (kOverlap)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    else
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 0) {  // producer
      const int tile0 = n0 / 16;
      const int prow = min(kRows, p.npad - n0);  // param bytes per row range (a multiple of 16)
      for (int it = 0; it < nk; ++it) {
        const int s = it % kStages, kb = kb0 + it;
        const int chunks = min(2, args.k_chunks - 2 * kb);
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        uint8_t* st = smem + s * kStageBytes;
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
    } else if (kOverlap && threadIdx.x / 32 == 1) {  // the scale warp: column kb of the tile's [m, blocks] scales
      const int lane_token = m0 + lane;
      for (int it = 0; it < nk; ++it) {
        const int s = it % kStages, kb = kb0 + it;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        float* xs = reinterpret_cast<float*>(smem + s * kStageBytes + C::kSOffset);
#pragma unroll
        for (int j = 0; j < kBT / 32; ++j) {
          const int token = lane_token + 32 * j;
          const bool valid = token < p.m;  // tokens past m: zero (their activations are zero-filled too)
          cp_async4(xs + lane + 32 * j, p.x_scale + (valid ? static_cast<int64_t>(token) * p.blocks + kb : 0), valid);
        }
        cp_async_arrive(&full[s]);
      }
    }
    if (split > 1) {  // the two cluster barriers of the consumers' split-K reduction
      cooperative_groups::this_cluster().sync();
      cooperative_groups::this_cluster().sync();
    }
  } else {
    if constexpr (kOverlap)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    else
      asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int acc[kR];
    float facc[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) acc[i] = 0, facc[i] = 0.f;
    uint32_t fa[16], fb[16];
    const auto chunks_at = [&](int it) { return min(2, args.k_chunks - 2 * (kb0 + it)); };
    const auto stage_at = [&](int it) { return smem + (it % kStages) * kStageBytes; };
    fence_regs(acc);
    if (nk > 0) {
      mbar_wait(&full[0], 0);
      dequant_stage(stage_at(0), gw, lane, chunks_at(0), fa);
    }
    if constexpr (kOverlap) {
      // Blocks alternate between acc (even) and acc2 (odd).
      int acc2[kR];
      if (nk > 0) issue_block(acc, fa, 0, stage_at);
      for (int it = 1; it < nk; it += 2) {
        overlap_step(acc2, acc, fa, facc, it, stage_at, chunks_at, full, empty, gw, lane);
        if (it + 1 >= nk) break;
        overlap_step(acc, acc2, fa, facc, it + 1, stage_at, chunks_at, full, empty, gw, lane);
      }
      wgmma_wait<0>();
      if (nk > 0) {
        if ((nk - 1) & 1) {
          fence_regs(acc2);
          flush_block(acc2, facc, nk - 1, stage_at, empty, lane);
        } else {
          fence_regs(acc);
          flush_block(acc, facc, nk - 1, stage_at, empty, lane);
        }
      }
    } else {
      for (int it = 0; it < nk; it += 2) {
        consumer_step(acc, facc, fa, fb, it, nk, kb0 + it, p, m0, stage_at, chunks_at, full, empty, gw, lane);
        if (it + 1 >= nk) break;
        consumer_step(acc, facc, fb, fa, it + 1, nk, kb0 + it + 1, p, m0, stage_at, chunks_at, full, empty, gw, lane);
      }
    }
    store_tile(p, args.vector_y, smem, n0, m0, gw, lane, rank, split, facc);
  }
#endif
}

}  // namespace

bool gemm_fmpq_sm90_usable(int device) {
  static std::atomic<int> cache[64] = {};
  return kernel_usable_on("gemm_fmpq", device, gemm_fmpq_sm90_kernel<false>, cache);
}

namespace {

template <bool kOverlap>
void launch(const FmpqProblem& p, int forced_split, cudaStream_t stream) {
  const char* op = "gemm_fmpq";
  auto kernel = gemm_fmpq_sm90_kernel<kOverlap>;
  constexpr int kSmem = Config::kSmemBytes;
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int tiles_n = (p.n + kRows - 1) / kRows, tiles_m = (p.m + kBT - 1) / kBT;
  const int k_blocks = (p.k + kBK - 1) / kBK;

  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  static DeviceSlots slot_cache = {};
  int slots[4];
  resident_ctas_per_split(op, kernel, cfg, slot_cache, slots);
  int split = forced_split > 0 ? forced_split : pick_split(tiles_n * tiles_m, k_blocks, slots);
  while (split > k_blocks) split /= 2;  // each CTA needs a k block

  const bool vector_y = !p.f32_out && reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.ldy % 8 == 0;
  const Args args{p, k_blocks, p.k / 64, split, vector_y};
  const CUtensorMap map_x = make_map(op, p.x, p.m, p.k, p.ldx, kBT);
  const CUtensorMap map_w = make_packed_weight_map(op, p.w, (p.n + 15) / 16, p.k / 64, kChunkBytes, kTiles, 2);
  launch_split_clusters(op, cfg, kernel, p.n, tiles_m, tiles_n, split, false, map_x, map_w, args);
}

}  // namespace

void gemm_fmpq_sm90(const FmpqProblem& p, int forced_split, bool overlap, cudaStream_t stream) {
  check_tile_split_choice("gemm_fmpq", forced_split, 0);
  if (overlap)
    launch<true>(p, forced_split, stream);
  else
    launch<false>(p, forced_split, stream);
}

}  // namespace lowbit::cuda::detail
