// f16 GEMM on mma.sync for the sm80 family: y[m, n] = x[m, k] · w[n, k]ᵀ (+ f16 bias), f32 accumulation.
//
// The design of the large-M W4A16 GEMM (gemm_w4a16_large_sm80.cu) with f16 weights: tokens are the mma
// M side (A from the x tile via ldmatrix.x4), weight rows the N side (B via ldmatrix.x4 from the
// weight tile, whose [n][k] rows are the col-major B operand as they are). 8 warps in a 2 x 4 grid, a
// cp.async ring of {x tile, weight tile} per 64-k chunk: both tiles are copied straight from global
// memory into padded f16 smem rows (72 halves = 144 bytes: ldmatrix's 8 row addresses per phase hit
// 8 distinct 4-bank groups), so there is no dequant step and one block barrier per chunk. Rows past m
// and n and the k tail (k % 64) are zero-filled by cp.async's src-size form, so any m, n and k work;
// the caller guarantees 16-byte aligned row starts (ld % 8 == 0, aligned base), and gemm_f16 falls
// back to the wmma kernel otherwise.
//
// Tiles (tokens x weight rows, warp tile, stages, dynamic smem, ptxas registers sm_90 / sm_80, no spills;
// all fit 2 blocks per SM on sm_80/sm_90; sm_86/89 (99 KB per block) take only the 32-token tile and
// gemm_f16 falls back to wmma for the others):
//    32 x 128 (16 x 32), 4 stages,  92,160 B,  70 / 68 regs   m <= 32: weight streams once, little waste
//    64 x 128 (32 x 32), 4 stages, 110,592 B,  93 / 93 regs   m <= 64, and larger m when 128-token
//                                                              blocks are fewer than the SMs
//   128 x 128 (64 x 32), 3 stages, 110,592 B, 125 / 128 regs  large m
// For m <= 64 the kernel is bandwidth-bound and n / 128 blocks are too few (Llama-3-8B o/down:
// 32 blocks on 132 SMs), so split-K raises the block count to about one per SM: f32 partials, summed
// (with the bias) in a fixed order by a second kernel, deterministic. The partials (8 bytes per
// output and split, written then read) are kept below a quarter of the weight bytes (split <= k/(16m)).
//
// Prediction (H100 SXM, not measured: written without a GPU). Decode at batch 2..64 streams each
// weight once per step with >= ~130 blocks of 3 chunks (>= 45 KB) in flight each, which is well past
// what 3.35 TB/s needs to hide latency; so the 8B w16a16 step should cost about what batch 1 costs
// (weights ~15 GB of f16: ~7.5-8.5 ms at batch 16, ~8.5-10 ms at batch 64, against 41.8 and 62.8 ms
// with the GEMV / wmma kernels and cuBLAS's 7.2 / 9.0), the split-K partials adding < 10%. Prefill at
// M = 1024 is compute-bound: mma.sync on sm_90 tops out near 400-450 TFLOPS and this kernel has the
// same smem traffic per mma as the W4A16 128x128 tile minus the dequant (W4A16 gate_up M=1024: 786 us
// = ~300 TFLOPS), so ~330-400 TFLOPS: gate_up (240 GFLOP) ~600-730 us, ~2x cuBLAS's wgmma instead of
// 4x. Closing that needs a wgmma (sm_90a) kernel.
// Measured (H100, 9b7d9e6, docs/benchmarks_gpu.md): the 8B w16a16 step at batch 16 / 64 takes 8.65 /
// 11.21 ms (from 41.8 / 62.8); prefill 14-17k tok/s against torch's 15-32k. The GEMM alone is untimed.
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/sm80/gemm_f16_mma_sm80.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

using w4a16::cp_async16_zfill;
using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::ldmatrix_x4;
using w4a16::mma_16816;
using w4a16::smem_addr;

constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kChunkK = 64;
constexpr int kRow = kChunkK + 8;  // halves per padded smem row: 144 bytes

// kTilesM m16 token tiles and kTilesN n8 weight-row tiles per warp.
template <int kTilesM_, int kTilesN_, int kStages_>
struct Cfg {
  static constexpr int kTilesM = kTilesM_, kTilesN = kTilesN_, kStages = kStages_;
  static constexpr int kBlockM = 16 * kTilesM * kWarpsM, kBlockN = 8 * kTilesN * kWarpsN;
  static constexpr int kXBytes = kBlockM * kRow * 2, kWBytes = kBlockN * kRow * 2;
  static constexpr int kStageBytes = kXBytes + kWBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kTilesN % 2 == 0 && (kBlockM * 8) % kThreads == 0 && (kBlockN * 8) % kThreads == 0, "tile shape");
};

using Cfg32x128 = Cfg<1, 4, 4>;
using Cfg64x128 = Cfg<2, 4, 4>;
using Cfg128x128 = Cfg<4, 4, 3>;

// kRows x 64-k rows of a row-major matrix into padded smem rows: 8 16-byte units per row, each reading
// only what lies inside [rows, k) and zero-filling the rest.
template <int kRows>
__device__ inline void load_rows(uint8_t* dst, const __half* src, int64_t ld, int row0, int rows, int k0, int k) {
#pragma unroll
  for (int u0 = 0; u0 < kRows * 8; u0 += kThreads) {
    const int u = u0 + static_cast<int>(threadIdx.x), r = u / 8, q = u % 8;
    const int gk = k0 + q * 8;
    const int bytes = row0 + r < rows ? 2 * min(max(k - gk, 0), 8) : 0;
    const __half* s = bytes > 0 ? src + static_cast<int64_t>(row0 + r) * ld + gk : src;
    cp_async16_zfill(dst + (r * kRow + q * 8) * 2, s, bytes);
  }
}

template <class C>
__device__ inline void load_stage(const F16MmaArgs& p, uint8_t* st, int kc, int m0, int n0) {
  load_rows<C::kBlockM>(st, p.x, p.ldx, m0, p.m, kc * kChunkK, p.k);
  load_rows<C::kBlockN>(st + C::kXBytes, p.w, p.ldw, n0, p.n, kc * kChunkK, p.k);
}

// One warp's 64-k chunk: 4 k16 steps of kTilesM x kTilesN mma (fragment addressing as in the W4A16
// large kernel: A lanes 0-15 rows 0-15 at k 0, lanes 16-31 at k 8; B matrix q = lane / 8 covers n
// 8*(q/2) + 0..7 at k 8*(q%2), so one x4 gives b0, b1 of two n8 tiles).
template <class C>
__device__ inline void compute_chunk(const uint8_t* st, int warp_m, int warp_n,
                                     float (&acc)[C::kTilesM][C::kTilesN][4]) {
  const int lane = threadIdx.x & 31;
  const __half* xs = reinterpret_cast<const __half*>(st);
  const __half* ws = reinterpret_cast<const __half*>(st + C::kXBytes);
  const uint32_t a_base = smem_addr(xs + (warp_m * C::kTilesM * 16 + (lane & 15)) * kRow + (lane >> 4) * 8);
  const uint32_t b_base =
      smem_addr(ws + (warp_n * C::kTilesN * 8 + (lane & 7) + ((lane >> 4) << 3)) * kRow + ((lane >> 3) & 1) * 8);
#pragma unroll
  for (int ks = 0; ks < kChunkK / 16; ++ks) {
    uint32_t b[C::kTilesN][2];
#pragma unroll
    for (int jb = 0; jb < C::kTilesN / 2; ++jb)
      ldmatrix_x4(b_base + (jb * 16 * kRow + ks * 16) * 2, b[2 * jb][0], b[2 * jb][1], b[2 * jb + 1][0],
                  b[2 * jb + 1][1]);
#pragma unroll
    for (int i = 0; i < C::kTilesM; ++i) {
      uint32_t a[4];
      ldmatrix_x4(a_base + (i * 16 * kRow + ks * 16) * 2, a[0], a[1], a[2], a[3]);
#pragma unroll
      for (int j = 0; j < C::kTilesN; ++j) mma_16816(acc[i][j], a, b[j][0], b[j][1]);
    }
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads, 2) gemm_f16_mma_kernel(F16MmaArgs p) {
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  // Token blocks vary fastest: blocks resident together share weight tiles in L2, so the weight
  // streams from DRAM about once.
  const int m0 = blockIdx.x * C::kBlockM, n0 = blockIdx.y * C::kBlockN;
  const int k_chunks = (p.k + kChunkK - 1) / kChunkK;
  const int kc_begin = blockIdx.z * p.chunks_per_split;
  const int iters = max(0, min(p.chunks_per_split, k_chunks - kc_begin));

  float acc[C::kTilesM][C::kTilesN][4] = {};
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < iters) load_stage<C>(p, smem + s * C::kStageBytes, kc_begin + s, m0, n0);
    cp_async_commit();  // one group per stage, empty or not: uniform wait counts
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<C::kStages - 2>();  // chunk it has landed (this thread's copies) ...
    __syncthreads();                  // ... everyone's; and all warps are done with chunk it-1's slot
    const int next = it + C::kStages - 1;
    if (next < iters) load_stage<C>(p, smem + (next % C::kStages) * C::kStageBytes, kc_begin + next, m0, n0);
    cp_async_commit();
    compute_chunk<C>(smem + (it % C::kStages) * C::kStageBytes, warp_m, warp_n, acc);
  }
  cp_async_wait<0>();

  // acc[i][j]: c0, c1 = token g, weight rows 2t, 2t+1; c2, c3 = token g+8, same rows.
  const bool split = gridDim.z > 1;
  const bool pairs = (p.n % 2 == 0) && (p.ldy % 2 == 0) && (reinterpret_cast<uintptr_t>(p.y) % 4 == 0);
#pragma unroll
  for (int j = 0; j < C::kTilesN; ++j) {
    const int col = n0 + (warp_n * C::kTilesN + j) * 8 + 2 * t;
    if (col >= p.n) continue;
    float b0 = 0.f, b1 = 0.f;
    if (p.bias && !split) {
      b0 = __half2float(p.bias[col]);
      if (col + 1 < p.n) b1 = __half2float(p.bias[col + 1]);
    }
#pragma unroll
    for (int i = 0; i < C::kTilesM; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int token = m0 + (warp_m * C::kTilesM + i) * 16 + g + 8 * h;
        if (token >= p.m) continue;
        const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if (split) {
          float* part = p.partial + (static_cast<int64_t>(blockIdx.z) * p.m + token) * p.n + col;
          part[0] = v0;
          if (col + 1 < p.n) part[1] = v1;
          continue;
        }
        __half* out = p.y + static_cast<int64_t>(token) * p.ldy + col;
        if (pairs) {
          *reinterpret_cast<__half2*>(out) = __floats2half2_rn(v0 + b0, v1 + b1);
        } else {
          out[0] = __float2half_rn(v0 + b0);
          if (col + 1 < p.n) out[1] = __float2half_rn(v1 + b1);
        }
      }
  }
}

__global__ void sum_splits_bias_kernel(const float* __restrict__ partial, int split, int m, int n,
                                       const __half* __restrict__ bias, __half* y, int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t mn = static_cast<int64_t>(m) * n;
  if (i >= mn) return;
  const int col = static_cast<int>(i % n);
  float s = 0.f;
  for (int z = 0; z < split; ++z) s += partial[z * mn + i];  // fixed order: deterministic
  if (bias) s += __half2float(bias[col]);
  y[(i / n) * ldy + col] = __float2half_rn(s);
}

// Raises the dynamic shared-memory limit once per device.
template <class C>
void prepare(int device) {
  static std::mutex mu;
  static std::vector<char> done;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(done.size())) done.resize(device + 1, 0);
  if (!done[device]) {
    LOWBIT_CUDA_CHECK("gemm_f16", cudaFuncSetAttribute(gemm_f16_mma_kernel<C>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    done[device] = 1;
  }
}

template <class C>
void launch(const F16MmaArgs& p, int split, cudaStream_t stream) {
  int device = 0;
  LOWBIT_CUDA_CHECK("gemm_f16", cudaGetDevice(&device));
  prepare<C>(device);
  const dim3 grid((p.m + C::kBlockM - 1) / C::kBlockM, (p.n + C::kBlockN - 1) / C::kBlockN, split);
  gemm_f16_mma_kernel<C><<<grid, kThreads, C::kSmemBytes, stream>>>(p);
  LOWBIT_CUDA_CHECK_LAUNCH("gemm_f16");
}

struct TileShape {
  int block_m, block_n, smem_bytes;
};
template <class C>
constexpr TileShape shape_of() {
  return {C::kBlockM, C::kBlockN, C::kSmemBytes};
}
TileShape tile_shape(F16MmaTile tile) {
  switch (tile) {
    case F16MmaTile::m32n128: return shape_of<Cfg32x128>();
    case F16MmaTile::m64n128: return shape_of<Cfg64x128>();
    default: return shape_of<Cfg128x128>();
  }
}
int64_t block_count(int64_t m, int64_t n, TileShape s) {
  return (m + s.block_m - 1) / s.block_m * ((n + s.block_n - 1) / s.block_n);
}

}  // namespace

F16MmaPlan gemm_f16_mma_plan(int64_t m, int64_t n, int64_t k, int device) {
  int smem_optin = 0;  // 227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86/89
  LOWBIT_CUDA_CHECK("gemm_f16", cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t sms = multiprocessor_count(device);
  F16MmaPlan plan{};
  if (m <= 32) {
    plan.tile = F16MmaTile::m32n128;
  } else if (m <= 64) {
    plan.tile = F16MmaTile::m64n128;
  } else {
    // 128-token blocks unless they leave SMs idle (o/qkv/down at a few hundred tokens).
    plan.tile = block_count(m, n, tile_shape(F16MmaTile::m128n128)) >= sms ? F16MmaTile::m128n128
                                                                           : F16MmaTile::m64n128;
  }
  plan.ok = tile_shape(plan.tile).smem_bytes <= smem_optin;
  // Split-K up to about one block per SM, >= 4 chunks (256 k) per split, at most 8 splits, and the f32
  // partials under a quarter of the weight bytes: 8 m n split <= 2 n k / 4.
  const int64_t k_chunks = (k + kChunkK - 1) / kChunkK, blocks = block_count(m, n, tile_shape(plan.tile));
  int64_t split = 1;
  if (blocks < sms)
    split = std::min<int64_t>({(sms + blocks - 1) / blocks, k_chunks / 4, 8, k / (16 * std::max<int64_t>(m, 1))});
  split = std::max<int64_t>(split, 1);
  const int64_t per = std::max<int64_t>(1, (k_chunks + split - 1) / split);  // no empty split
  plan.chunks_per_split = static_cast<int>(per);
  plan.split = static_cast<int>(std::max<int64_t>(1, (k_chunks + per - 1) / per));  // k = 0: one (empty) split
  return plan;
}

void gemm_f16_mma(const F16MmaArgs& p, const F16MmaPlan& plan, cudaStream_t stream) {
  switch (plan.tile) {
    case F16MmaTile::m32n128: launch<Cfg32x128>(p, plan.split, stream); break;
    case F16MmaTile::m64n128: launch<Cfg64x128>(p, plan.split, stream); break;
    default: launch<Cfg128x128>(p, plan.split, stream); break;
  }
  if (plan.split > 1) {
    const int64_t total = static_cast<int64_t>(p.m) * p.n;
    sum_splits_bias_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
        p.partial, plan.split, p.m, p.n, p.bias, p.y, p.ldy);
    LOWBIT_CUDA_CHECK_LAUNCH("gemm_f16");
  }
}

}  // namespace lowbit::cuda
