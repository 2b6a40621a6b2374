// Large-M W4A16 GEMM for the sm80 family (mma.sync m16n8k16, f16 in, f32 accumulate), weights packed
// by pack_sm80 (cpp/quant/pack_sm80.cpp documents the layout).
//
// The decode kernel (gemm_w4a16_sm80.cu) computes Yᵀ = W·Xᵀ and every warp dequantizes its own weight
// fragments, so at large M each weight element is dequantized once per 64-token warp tile, and the
// 8-token B operand gives few tokens per mma. Here, classic orientation Y = X·Wᵀ: tokens are the mma
// M side (A from the x tile via ldmatrix), weight rows the N side. Per 64-k chunk a block (8 warps,
// 2 x 4 warp grid) dequantizes its packed weight chunk ONCE into smem as ready-made B fragments
// (each lane: one 16-byte packed load -> four 16-byte fragment stores, with the decode kernel's f16
// formula w = q*s - z*s, so both kernels use bit-identical weights), and the warps read them back
// with 16-byte loads.
//
// Pipeline: kStages-deep (4) cp.async ring of {x tile, packed chunk, scales|zeros}; per chunk: wait,
// block barrier (chunk landed; previous chunk's slot and dq free), issue the copy of chunk
// kc + kStages - 1, dequant, pair barrier (the two warps sharing dq rows), mma. x rows past m and
// weight tiles past n are zero-filled in smem. x rows padded by 16 bytes (144-byte stride): ldmatrix
// hits 8 distinct 4-bank groups per 8-lane phase; the fragment stores/loads are lane-contiguous
// (both conflict-free).
//
// Tiles (tokens x weight rows, warp tile, dynamic smem, ptxas sm_90 registers, no spills):
//   128 x 128 (64 x 32 per warp): 108,544 B, 127 regs -> 2 blocks/SM on sm_90 (default from 128 tokens)
//    64 x 128 (32 x 32):           71,680 B, 100 regs (when 128-token blocks would not fill the SMs)
//   128 x 256 (64 x 64):          143,360 B, 234 regs, 1 block/SM (kernel_overrides w4a16_large_tile=128x256)
//
// Prediction (H100 SXM, not measured: written without a GPU). The old kernel already runs M=1024 at
// ~290 TFLOPS (gate_up: 240 GFLOP in 809 us); cuBLAS's 309 us is ~780 TFLOPS, i.e. wgmma, which
// mma.sync cannot reach on sm_90 (its practical ceiling is ~400-450). Per 128x128 block and chunk
// the warps read 96 KB of smem with ldmatrix and the dequant moves ~21 KB (~920 smem cycles) for
// 512 mma (~800 cycles): smem/issue bound at ~330-420 TFLOPS. So M=1024: gate_up ~600-730 us, down
// ~300-360, o ~90-105, qkv ~150-175 (1.1-1.3x faster than before, still ~2x cuBLAS). M=256, where
// the old kernel's 128-token tiles and split-K partials hurt most: o ~27 us and qkv ~35 (64x128
// tiles, 2.2-2.8x faster, ~1.4x cuBLAS), down ~65-75 (64x128 tiles, split 2), gate_up ~170-200
// (1.7 waves of 128x128). The 128x256 tile halves smem reads per mma and may do better at
// M >= 1024 if 8 warps per SM hide the latency (the bench times each tile). Closing the rest of the
// gap on Hopper needs a wgmma (sm_90a) W4A16 kernel.
// Measured (H100, eb5d682, bench/results/h100-2026-11-23-w4a16-large.json): M=1024 gate_up 786 us,
// down 389, o 116, qkv 183 (128x128); M=256 o 55.7 (64x128), qkv 76.2, down 145.5, gate_up 240.1: the
// smem-bound estimate was optimistic, and only o at M=256 gained much over the decode kernel (75.6).
// The 128x256 tile was slower everywhere.
//
// Split-K (f32 partials summed in a fixed order) only where the (m, n) blocks leave SMs idle.
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/sm80/gemm_w4a16_large_sm80.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

using namespace w4a16;

constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kStages = 4;
constexpr int kRow = kChunkK + 8;  // halves per padded smem row: 144 bytes

// kTilesM m16 token tiles and kTilesN n8 weight-row tiles per warp (kTilesN a multiple of 4: a warp
// pair's rows are whole packed tiles, one or more per warp).
template <int kTilesM_, int kTilesN_>
struct LargeCfg {
  static constexpr int kTilesM = kTilesM_, kTilesN = kTilesN_;
  static constexpr int kBlockM = 16 * kTilesM * kWarpsM, kBlockN = 8 * kTilesN * kWarpsN;
  static constexpr int kPackedTiles = kBlockN / kTileN;
  static constexpr int kXBytes = kBlockM * kRow * 2;
  static constexpr int kWBytes = kPackedTiles * kChunkBytes;
  static constexpr int kSBytes = 2 * 2 * kBlockN * 2;  // [k half][scale | zero][kBlockN] f16 (param_row)
  static constexpr int kStageBytes = kXBytes + kWBytes + kSBytes;
  static constexpr int kDqBytes = kPackedTiles * 4 * 32 * 16;  // dequantized fragments [tile][step][lane]
  static constexpr int kSmemBytes = kStages * kStageBytes + kDqBytes;
  static_assert(kTilesN % 4 == 0 && kWarpsM == 2 && (kBlockM * 8) % kThreads == 0 &&
                    4 * kBlockN / 8 <= kThreads && kStageBytes % 16 == 0,
                "tile shape");
};

// Copies (or zero-fills) the x tile, packed chunk kc and its scales|zeros into one stage.
template <class C>
__device__ inline void load_stage(const W4A16LargeArgs& p, uint8_t* st, int kc, int m0, int n0) {
  const int tid = threadIdx.x, k_chunks = p.k / kChunkK, n_tiles = p.npad / kTileN;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int u0 = 0; u0 < C::kBlockM * 8; u0 += kThreads) {  // 8 16-byte units per 64-k row
    const int u = u0 + tid, r = u / 8, q = u % 8;
    uint8_t* dst = st + (r * kRow + q * 8) * 2;
    if (m0 + r < p.m)
      cp_async16(dst, p.x + static_cast<int64_t>(m0 + r) * p.ldx + static_cast<int64_t>(kc) * kChunkK + q * 8);
    else
      *reinterpret_cast<uint4*>(dst) = zero;
  }
  uint8_t* w_dst = st + C::kXBytes;
#pragma unroll
  for (int u0 = 0; u0 < C::kPackedTiles * 32; u0 += kThreads) {  // 32 units per 16-row tile and chunk
    const int u = u0 + tid, nt = n0 / kTileN + u / 32;
    if (nt < n_tiles)
      cp_async16(w_dst + u * 16, p.w + (static_cast<int64_t>(nt) * k_chunks + kc) * kChunkBytes + (u % 32) * 16);
    else
      *reinterpret_cast<uint4*>(w_dst + u * 16) = zero;
  }
  constexpr int kRowUnits = C::kBlockN / 8;
  const int half = tid / (2 * kRowUnits);  // half 1 only where it has its own group (halves_differ)
  if (tid < 4 * kRowUnits && (half == 0 || halves_differ(p.group))) {
    const int which = (tid / kRowUnits) % 2, off = (tid % kRowUnits) * 8;
    uint8_t* dst = st + C::kXBytes + C::kWBytes + tid * 16;  // = ((half * 2 + which) * kBlockN + off) * 2
    if (n0 + off < p.npad)
      cp_async16(dst, (which ? p.zeros : p.scales) +
                          static_cast<int64_t>(param_row(kc, half, p.group)) * p.npad + n0 + off);
    else
      *reinterpret_cast<uint4*>(dst) = zero;
  }
}

// Packed chunk -> dequantized f16 A fragments in smem, dq[tile][step][lane] (16 bytes each). Warps
// (0, wn) and (1, wn) read the same 16-row tiles, so they dequantize exactly those (kTilesN/4 packed
// tiles each) and then sync as a pair. pack_sm80's k order is the fragment's, so lane (g, t)'s four
// registers of step j (rows g, g+8 at k 16j + 2t + {0, 1} and + {8, 9}) are already the mma B
// fragments of this kernel's orientation for the tile's two n8 halves; each is stored and read back
// by the same lane position with 16-byte accesses (conflict-free), no ldmatrix needed.
template <class C>
__device__ inline void dequant_chunk(const uint8_t* st, uint4* dq, int warp_m, int warp_n, bool two_halves,
                                     bool mins) {
  const uint4* packed = reinterpret_cast<const uint4*>(st + C::kXBytes);
  const __half* sc = reinterpret_cast<const __half*>(st + C::kXBytes + C::kWBytes);
  const int lane = threadIdx.x & 31, g = lane / 4;
#pragma unroll
  for (int v = 0; v < C::kTilesN / 4; ++v) {
    const int tile = (warp_n * 2 + warp_m) * (C::kTilesN / 4) + v, row = tile * kTileN + g;
    const uint4 wv = packed[tile * 32 + lane];
    __half2 s_lo, s_hi, nzs_lo, nzs_hi;
    auto load_params = [&](int half) {
      const __half* h = sc + half * 2 * C::kBlockN;
      const __half s0 = h[row], s8 = h[row + 8], z0 = h[C::kBlockN + row], z8 = h[C::kBlockN + row + 8];
      s_lo = __half2half2(s0), s_hi = __half2half2(s8);
      nzs_lo = addend_of(z0, s0, mins), nzs_hi = addend_of(z8, s8, mins);
    };
    load_params(0);
    const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j == 2 && two_halves) load_params(1);  // k 32-63 belongs to the next group
      uint32_t a[4];  // a0 = row g (k lo pair), a1 = row g+8, a2/a3 the same at k hi (+8)
      dequant_word(words[j], s_lo, nzs_lo, s_hi, nzs_hi, a);
      dq[(tile * 4 + j) * 32 + lane] = make_uint4(a[0], a[1], a[2], a[3]);
    }
  }
}

// Barrier of the two warps (0, warp_n) and (1, warp_n): ids 1..kWarpsN (0 is __syncthreads'),
// immediate so that the kernel reserves only the barriers it uses.
template <int kId>
__device__ inline void named_barrier() {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(32 * kWarpsM) : "memory");
}
__device__ inline void pair_barrier(int warp_n) {
  static_assert(kWarpsN == 4, "one case per warp column");
  switch (warp_n) {  // warp-uniform
    case 0: named_barrier<1>(); break;
    case 1: named_barrier<2>(); break;
    case 2: named_barrier<3>(); break;
    default: named_barrier<4>(); break;
  }
}

// One warp's 64-k chunk: 4 k16 steps of kTilesM x kTilesN mma.
template <class C>
__device__ inline void compute_chunk(const __half* xs, const uint4* dq, int warp_m, int warp_n,
                                     float (&acc)[C::kTilesM][C::kTilesN][4]) {
  const int lane = threadIdx.x & 31;
  // A (x, [token][k]): lanes 0-15 address rows 0-15 at k 0, lanes 16-31 rows 0-15 at k 8, so the
  // four 8x8 matrices are a0 (rows 0-7, k 0-7), a1 (rows 8-15), a2 (k 8-15), a3 (both).
  const uint32_t a_base = smem_addr(xs + (warp_m * C::kTilesM * 16 + (lane & 15)) * kRow + (lane >> 4) * 8);
  // B: 16-row tile warp_n * kTilesN/2 + jb holds n8 tiles 2jb (rows g: .x = b0, .z = b1) and 2jb + 1
  // (rows g + 8: .y, .w).
  const uint4* b_frag = dq + (warp_n * C::kTilesN / 2) * 4 * 32 + lane;
#pragma unroll
  for (int ks = 0; ks < kChunkK / 16; ++ks) {
    uint32_t b[C::kTilesN][2];
#pragma unroll
    for (int jb = 0; jb < C::kTilesN / 2; ++jb) {
      const uint4 f = b_frag[(jb * 4 + ks) * 32];
      b[2 * jb][0] = f.x, b[2 * jb][1] = f.z, b[2 * jb + 1][0] = f.y, b[2 * jb + 1][1] = f.w;
    }
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
__global__ void __launch_bounds__(kThreads, C::kSmemBytes <= 113 * 1024 ? 2 : 1)
    gemm_w4a16_large_kernel(W4A16LargeArgs p) {
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  uint4* dq = reinterpret_cast<uint4*>(smem + kStages * C::kStageBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  // Token blocks vary fastest: blocks resident together share weight chunks in L2 and the whole
  // activation stays in L2, so the weight streams from DRAM about once.
  const int m0 = blockIdx.x * C::kBlockM, n0 = blockIdx.y * C::kBlockN;
  const int kc_begin = blockIdx.z * p.chunks_per_split;
  const int iters = max(0, min(p.chunks_per_split, p.k / kChunkK - kc_begin));

  float acc[C::kTilesM][C::kTilesN][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < iters) load_stage<C>(p, smem + s * C::kStageBytes, kc_begin + s, m0, n0);
    cp_async_commit();  // one group per stage, empty or not: uniform wait counts
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<kStages - 2>();  // chunk it has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's; and all warps are done with chunk it-1 (slot, dq)
    const int next = it + kStages - 1;
    if (next < iters) load_stage<C>(p, smem + (next % kStages) * C::kStageBytes, kc_begin + next, m0, n0);
    cp_async_commit();
    const uint8_t* st = smem + (it % kStages) * C::kStageBytes;
    dequant_chunk<C>(st, dq, warp_m, warp_n, halves_differ(p.group), p.mins);
    pair_barrier(warp_n);  // the pair's dq rows are complete
    compute_chunk<C>(reinterpret_cast<const __half*>(st), dq, warp_m, warp_n, acc);
  }
  cp_async_wait<0>();

  // acc[i][j]: c0, c1 = token g, weight rows 2t, 2t+1; c2, c3 = token g+8, same rows.
  const bool pairs = (p.n % 2 == 0) && (p.ldy % 2 == 0) && (reinterpret_cast<uintptr_t>(p.y) % 4 == 0);
#pragma unroll
  for (int i = 0; i < C::kTilesM; ++i)
#pragma unroll
    for (int j = 0; j < C::kTilesN; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int token = m0 + (warp_m * C::kTilesM + i) * 16 + g + 8 * h;
        const int col = n0 + (warp_n * C::kTilesN + j) * 8 + 2 * t;
        if (token >= p.m || col >= p.n) continue;
        if (gridDim.z > 1) {
          float* part = p.partial + (static_cast<int64_t>(blockIdx.z) * p.m + token) * p.n + col;
          part[0] = acc[i][j][2 * h];
          if (col + 1 < p.n) part[1] = acc[i][j][2 * h + 1];
          continue;
        }
        __half* out = p.y + static_cast<int64_t>(token) * p.ldy + col;
        if (pairs) {
          *reinterpret_cast<__half2*>(out) = __floats2half2_rn(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else {
          out[0] = __float2half_rn(acc[i][j][2 * h]);
          if (col + 1 < p.n) out[1] = __float2half_rn(acc[i][j][2 * h + 1]);
        }
      }
}

// Raises the dynamic shared-memory limit once per device.
template <class C>
void prepare(int device) {
  static std::mutex mu;
  static std::vector<char> done;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(done.size())) done.resize(device + 1, 0);
  if (!done[device]) {
    LOWBIT_CUDA_CHECK("gemm_w4a16", cudaFuncSetAttribute(gemm_w4a16_large_kernel<C>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    done[device] = 1;
  }
}

template <class C>
void launch(const W4A16LargeArgs& p, int split, cudaStream_t stream) {
  int device = 0;
  LOWBIT_CUDA_CHECK("gemm_w4a16", cudaGetDevice(&device));
  prepare<C>(device);
  const dim3 grid((p.m + C::kBlockM - 1) / C::kBlockM, (p.n + C::kBlockN - 1) / C::kBlockN, split);
  gemm_w4a16_large_kernel<C><<<grid, kThreads, C::kSmemBytes, stream>>>(p);
  LOWBIT_CUDA_CHECK_LAUNCH("gemm_w4a16");
}

struct TileShape {
  int block_m, block_n, smem_bytes;
};
template <class C>
constexpr TileShape shape_of() {
  return {C::kBlockM, C::kBlockN, C::kSmemBytes};
}

using Cfg128x128 = LargeCfg<4, 4>;  // warp 64 x 32, 110.6 KB smem: 2 blocks per SM on sm_90
using Cfg64x128 = LargeCfg<2, 4>;   // warp 32 x 32, 73.7 KB
using Cfg128x256 = LargeCfg<4, 8>;  // warp 64 x 64, 147.5 KB, 1 block per SM: less smem traffic per mma

TileShape tile_shape(W4A16LargeTile tile) {
  switch (tile) {
    case W4A16LargeTile::m64n128: return shape_of<Cfg64x128>();
    case W4A16LargeTile::m128n256: return shape_of<Cfg128x256>();
    default: return shape_of<Cfg128x128>();
  }
}

int64_t block_count(int64_t m, int64_t n, TileShape s) {
  return (m + s.block_m - 1) / s.block_m * ((n + s.block_n - 1) / s.block_n);
}

}  // namespace

W4A16LargeTile gemm_w4a16_large_tile(int64_t m, int64_t n, W4A16LargeTile tile, int device) {
  int smem_optin = 0;  // 227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86/89
  LOWBIT_CUDA_CHECK("gemm_w4a16",
                    cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (tile == W4A16LargeTile::automatic) {
    // 128-token blocks unless they leave SMs idle (o/qkv/down at M=256: 64-96 blocks on 132 SMs) or
    // do not fit (sm_86/89).
    const TileShape big = tile_shape(W4A16LargeTile::m128n128);
    tile = block_count(m, n, big) >= multiprocessor_count(device) && big.smem_bytes <= smem_optin
               ? W4A16LargeTile::m128n128
               : W4A16LargeTile::m64n128;
  }
  const int need = tile_shape(tile).smem_bytes;
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, need <= smem_optin, "gemm_w4a16: the large-M tile needs ", need,
                    " bytes of shared memory per block, device ", device, " allows ", smem_optin);
  return tile;
}

int gemm_w4a16_large_pick_split(int64_t m, int64_t n, int64_t k, W4A16LargeTile tile, int device) {
  // Up to 2 blocks per SM (1 for 128x256); split only below one block per SM, keeping >= 8 chunks
  // (512 k) per split, at most 4 splits, and the f32 partials (8 bytes per output and split, written
  // then read) below the weight bytes n*k/2: split <= k / (16 m). down_proj at 256 tokens: 2.
  const int64_t blocks = block_count(m, n, tile_shape(tile)), sms = multiprocessor_count(device);
  const int64_t k_chunks = k / kChunkK;
  if (blocks >= sms) return 1;
  const int64_t slots = (tile == W4A16LargeTile::m128n256 ? 1 : 2) * sms;
  int64_t split = std::min<int64_t>(
      {slots / std::max<int64_t>(blocks, 1), k_chunks / 8, 4, k / (16 * std::max<int64_t>(m, 1))});
  split = std::max<int64_t>(split, 1);
  const int64_t per = (k_chunks + split - 1) / split;  // no empty split
  return static_cast<int>((k_chunks + per - 1) / per);
}

void gemm_w4a16_large(const W4A16LargeArgs& p, W4A16LargeTile tile, int split, cudaStream_t stream) {
  switch (tile) {
    case W4A16LargeTile::m64n128: launch<Cfg64x128>(p, split, stream); break;
    case W4A16LargeTile::m128n256: launch<Cfg128x256>(p, split, stream); break;
    default: launch<Cfg128x128>(p, split, stream); break;
  }
  if (split > 1) {
    sum_split_partials(p.partial, split, p.m, p.n, p.y, p.ldy, stream);
    LOWBIT_CUDA_CHECK_LAUNCH("gemm_w4a16");
  }
}

}  // namespace lowbit::cuda
