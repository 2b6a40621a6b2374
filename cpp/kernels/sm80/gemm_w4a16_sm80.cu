// W4A16 GEMM for the sm80 family (mma.sync m16n8k16, f16 in, f32 accumulate), weights packed
// offline by pack_sm80 (cpp/quant/pack_sm80.cpp documents the layout).
//
// Yᵀ = W · Xᵀ: the weight is the A operand (16 rows x 16 k per mma) and 8 tokens form the B operand,
// so decode (M = 1..16) wastes no tensor-core rows on padding tokens. One kernel template serves
// M < kLargeMinTokens (and any M when W4A16Kernel::small is named); larger M goes to the large-M
// kernel (gemm_w4a16_large_sm80.cu). A block owns kBlockN weight rows x kBlockM tokens x a k-range
// (split-K across blocks).
//
// Everything a block reads streams through a multi-stage cp.async shared-memory ring (Ampere-style
// pipeline): per stage kChunks 64-k chunks of the packed weight tiles (512 bytes per 16-row tile and
// chunk, already in fragment order), their scales and zeros, and the activation rows. So the loads
// of kStages - 1 stages are in flight while a stage is computed, without holding registers, and no
// warp ever waits on a dependent global load (the previous kernel read activations and scales from
// global memory one chunk ahead and stalled on them: 12 cycles per instruction, ~1.4 TB/s).
// A warp dequantizes each 16x16 weight fragment once (lop3 magic-number u4 -> f16, TurboMind §4.1;
// w = q*s - z*s as one f16x2 fma) and reuses it for all its 8-token tiles, and reads each lane's
// activations with ldmatrix (row stride padded by 16 bytes: conflict-free).
// Split-K blocks write f32 partials that a small kernel sums in a fixed order (deterministic).
// On sm_90 the GEMM is launched as a programmatic dependent of the kernel before it (cuda/pdl.cuh):
// its blocks start while that kernel (a norm, SiLU·mul or the attention that produces x) is still
// running, prefetch their first stages of weights into L2, and only then wait for x.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda/pdl.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/kernels/desc.h"
#include "kernels/sm80/gemm_w4a16_gemv_sm80.h"
#include "kernels/sm80/gemm_w4a16_large_sm80.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm90/gemm_w4a16_decode_sm90.h"
#include "kernels/sm90/gemm_w4a16_sm90.h"

namespace lowbit::cuda {
namespace {

using namespace w4a16;

struct GemmArgs {
  const __half* x;
  int64_t ldx;
  const uint8_t* w;  // packed tiles
  const __half* scales;
  const __half* zeros;  // [G, npad]: zero points, or the mins of w = q*s + m when `mins`
  __half* y;
  int64_t ldy;
  float* partial;  // [split, m, n] when split > 1
  int m, n, k, group, npad, chunks_per_split;
  bool pdl;   // launched as a programmatic dependent: prefetch weights, then wait for x
  bool mins;  // `zeros` holds mins
};

// Block shape: kWarpsN x kWarpsM warps, each owning kTilesN 16-row weight tiles x kTilesM 8-token
// tiles; kChunks 64-k chunks per pipeline stage, kStages stages; kMinBlocks for __launch_bounds__.
template <int kWarpsN_, int kWarpsM_, int kTilesN_, int kTilesM_, int kChunks_, int kStages_, int kMinBlocks_>
struct Cfg {
  static constexpr int kWarpsN = kWarpsN_, kWarpsM = kWarpsM_, kTilesN = kTilesN_, kTilesM = kTilesM_;
  static constexpr int kChunks = kChunks_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsM;
  static constexpr int kBlockN = kTileN * kTilesN * kWarpsN, kBlockM = 8 * kTilesM * kWarpsM;
  static constexpr int kBlockTiles = kBlockN / kTileN;
  static constexpr int kXRow = kChunks * kChunkK + 8;  // halves; +16 bytes spreads rows over banks
  static constexpr int kWBytes = kBlockTiles * kChunks * kChunkBytes;
  static constexpr int kSBytes = kChunks * 2 * 2 * kBlockN * 2;  // [chunk][k half][scale|zero][kBlockN] f16
  static constexpr int kXBytes = kBlockM * kXRow * 2;
  static constexpr int kStageBytes = kWBytes + kSBytes + kXBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
};

// Issues the cp.async copies of the stage that starts at chunk kc0 (chunks past kc_end, tiles past
// n and tokens past m are skipped: the values read for them only reach outputs that are not stored).
template <class C>
__device__ inline void load_stage(const GemmArgs& p, uint8_t* stage, int kc0, int kc_end, int n0, int m0) {
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
  constexpr int kRowUnits = C::kBlockN / 8;  // 16-byte units per scale row segment
  constexpr int kSUnits = C::kChunks * 4 * kRowUnits;
  const bool two_halves = halves_differ(p.group);  // else half 1 reuses half 0's rows and is not copied
  uint8_t* s_base = stage + C::kWBytes;
#pragma unroll
  for (int u0 = 0; u0 < kSUnits; u0 += C::kThreads) {
    const int u = u0 + tid;
    if (u >= kSUnits) break;
    const int c = u / (4 * kRowUnits), half = (u / (2 * kRowUnits)) % 2, which = (u / kRowUnits) % 2;
    const int off = (u % kRowUnits) * 8, kc = kc0 + c;
    if (kc < kc_end && n0 + off < p.npad && (half == 0 || two_halves)) {
      const __half* src =
          (which ? p.zeros : p.scales) + static_cast<int64_t>(param_row(kc, half, p.group)) * p.npad + n0 + off;
      cp_async16(s_base + u * 16, src);
    }
  }
  constexpr int kXUnitsPerRow = C::kChunks * 8;
  constexpr int kXUnits = C::kBlockM * kXUnitsPerRow;
  uint8_t* x_base = stage + C::kWBytes + C::kSBytes;
#pragma unroll
  for (int u0 = 0; u0 < kXUnits; u0 += C::kThreads) {
    const int u = u0 + tid;
    if (kXUnits % C::kThreads != 0 && u >= kXUnits) break;
    const int r = u / kXUnitsPerRow, q = u % kXUnitsPerRow;
    if (m0 + r < p.m && kc0 + q / 8 < kc_end)
      cp_async16(x_base + (r * C::kXRow + q * 8) * 2, p.x + (m0 + r) * p.ldx + kc0 * kChunkK + q * 8);
  }
}

// One warp's share of a stage: per chunk, dequantize each of its weight tiles once per k16 step and
// multiply it into all of its 8-token tiles. kMins: the second parameter is a min (GGUF Q4_1), a compile-time
// choice because a runtime flag costs the decode configs their last registers (spills on sm_90).
template <class C, bool kMins>
__device__ inline void compute_stage(const uint8_t* stage, int chunks, int warp_n, int warp_m, bool two_halves,
                                     float (&acc)[C::kTilesN][C::kTilesM][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const uint4* ws = reinterpret_cast<const uint4*>(stage);
  const __half* ss = reinterpret_cast<const __half*>(stage + C::kWBytes);
  const __half* xs = reinterpret_cast<const __half*>(stage + C::kWBytes + C::kSBytes);
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c) {
    if (c >= chunks) break;
    uint4 wv[C::kTilesN];
    __half2 s_lo[C::kTilesN], nzs_lo[C::kTilesN], s_hi[C::kTilesN], nzs_hi[C::kTilesN];
    auto load_params = [&](int half) {
#pragma unroll
      for (int i = 0; i < C::kTilesN; ++i) {
        const int row = (warp_n * C::kTilesN + i) * kTileN + g;
        const __half* sc = ss + (c * 2 + half) * 2 * C::kBlockN;
        const __half s0 = sc[row], s8 = sc[row + 8], z0 = sc[C::kBlockN + row], z8 = sc[C::kBlockN + row + 8];
        s_lo[i] = __half2half2(s0);
        s_hi[i] = __half2half2(s8);
        nzs_lo[i] = addend_of(z0, s0, kMins);
        nzs_hi[i] = addend_of(z8, s8, kMins);
      }
    };
#pragma unroll
    for (int i = 0; i < C::kTilesN; ++i) wv[i] = ws[((warp_n * C::kTilesN + i) * C::kChunks + c) * 32 + lane];
    load_params(0);
    // Per k16 step: dequantize each weight tile once, then per 8-token tile one ldmatrix.x2 of its B
    // fragment (lanes 0-7 address k 16*step + 0..7 of the tokens, lanes 8-15 k + 8..15: pack_sm80's
    // fragment k order is the natural one) feeding all of the warp's weight tiles. Loading B right
    // before its mma keeps two registers live per token tile instead of a whole chunk's.
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      if (step == 2 && two_halves) load_params(1);  // g32 (or an odd multiple): k 32-63 is the next group
      uint32_t a[C::kTilesN][4];
#pragma unroll
      for (int i = 0; i < C::kTilesN; ++i) {
        const uint32_t word = step == 0 ? wv[i].x : step == 1 ? wv[i].y : step == 2 ? wv[i].z : wv[i].w;
        dequant_word(word, s_lo[i], nzs_lo[i], s_hi[i], nzs_hi[i], a[i]);
      }
#pragma unroll
      for (int j = 0; j < C::kTilesM; ++j) {
        const int r = (warp_m * C::kTilesM + j) * 8 + (lane & 7);
        uint32_t b0, b1;
        ldmatrix_x2(smem_addr(xs + r * C::kXRow + c * kChunkK + 16 * step + 8 * ((lane >> 3) & 1)), b0, b1);
#pragma unroll
        for (int i = 0; i < C::kTilesN; ++i) mma_16816(acc[i][j], a[i], b0, b1);
      }
    }
  }
}

template <class C, bool kMins>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) gemm_w4a16_kernel(GemmArgs p) {
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp_n = warp % C::kWarpsN, warp_m = warp / C::kWarpsN;
  const int m0 = blockIdx.x * C::kBlockM, n0 = blockIdx.y * C::kBlockN;
  const int k_chunks = p.k / kChunkK;
  const int kc_begin = blockIdx.z * p.chunks_per_split;
  const int kc_end = min(kc_begin + p.chunks_per_split, k_chunks);
  const int iters = kc_end > kc_begin ? (kc_end - kc_begin + C::kChunks - 1) / C::kChunks : 0;
  // Warps whose tiles lie wholly past n or m only help with the copies.
  const bool active = n0 + warp_n * C::kTilesN * kTileN < p.n && m0 + warp_m * C::kTilesM * 8 < p.m;
  if (p.pdl) {
    // The packed weights do not depend on the kernel before this one: pull this block's first stages
    // into L2 (each tile's chunks are contiguous) while that kernel finishes, then wait for x.
    const int chunks = min((C::kStages - 1) * C::kChunks, kc_end - kc_begin);
    const int lines = chunks * (kChunkBytes / 128), n_tiles = (p.n + kTileN - 1) / kTileN;
    for (int u = threadIdx.x; u < C::kBlockTiles * lines; u += C::kThreads) {
      const int nt = n0 / kTileN + u / lines;
      if (nt < n_tiles) {
        const uint8_t* line = p.w + (static_cast<int64_t>(nt) * k_chunks + kc_begin) * kChunkBytes + (u % lines) * 128;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
      }
    }
    pdl_wait_for_producers();
  }

  float acc[C::kTilesN][C::kTilesM][4] = {};
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < iters) load_stage<C>(p, smem + s * C::kStageBytes, kc_begin + s * C::kChunks, kc_end, n0, m0);
    cp_async_commit();  // one group per stage, empty or not, so the wait count below is uniform
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<C::kStages - 2>();  // stage `it` has landed (for this thread) ...
    __syncthreads();                  // ... for all threads, and stage it-1 is free again
    const int next = it + C::kStages - 1;
    if (next < iters)
      load_stage<C>(p, smem + (next % C::kStages) * C::kStageBytes, kc_begin + next * C::kChunks, kc_end, n0, m0);
    cp_async_commit();
    const int kc0 = kc_begin + it * C::kChunks;
    if (active)
      compute_stage<C, kMins>(smem + (it % C::kStages) * C::kStageBytes, kc_end - kc0, warp_n, warp_m,
                              halves_differ(p.group), acc);
  }
  cp_async_wait<0>();

  // acc[i][j]: c0,c1 = weight row g, tokens 2t, 2t+1; c2,c3 = weight row g+8, same tokens.
#pragma unroll
  for (int i = 0; i < C::kTilesN; ++i)
#pragma unroll
    for (int j = 0; j < C::kTilesM; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int token = m0 + (warp_m * C::kTilesM + j) * 8 + 2 * t + (c & 1);
        const int col = n0 + (warp_n * C::kTilesN + i) * kTileN + g + (c >> 1) * 8;
        if (token >= p.m || col >= p.n) continue;
        if (gridDim.z == 1)
          p.y[token * p.ldy + col] = __float2half_rn(acc[i][j][c]);
        else
          p.partial[(static_cast<int64_t>(blockIdx.z) * p.m + token) * p.n + col] = acc[i][j][c];
      }
}

// Shapes by token count. Decode (<= 16 tokens): 8 warps x one 16-row tile, 128 weight rows per
// block, two chunks per stage. 17..64 tokens: the same with up to 8 token tiles per warp (each
// dequantized fragment feeds 4-8 mma). More tokens: 128 x 128 blocks of 2 x 8 tiles per warp.
using CfgM8 = Cfg<8, 1, 1, 1, 2, 4, 4>;
using CfgM16 = Cfg<8, 1, 1, 2, 2, 4, 4>;
using CfgM32 = Cfg<8, 1, 1, 4, 2, 4, 2>;
using CfgM64 = Cfg<8, 1, 1, 8, 2, 4, 2>;
using CfgLarge = Cfg<4, 2, 2, 8, 1, 4, 2>;

enum class Shape { m8, m16, m32, m64, large };
Shape shape_for(int64_t m) {
  return m <= 8 ? Shape::m8 : m <= 16 ? Shape::m16 : m <= 32 ? Shape::m32 : m <= 64 ? Shape::m64 : Shape::large;
}

struct ShapeInfo {
  int block_n, block_m, chunks, blocks_per_sm;
};

// Raises the kernel's dynamic shared-memory limit (once per device) and reports its occupancy.
template <class C>
ShapeInfo prepare(int device) {
  static std::mutex mu;
  static std::vector<int> cache;  // blocks per SM, 0 = not yet prepared
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    const char* op = "gemm_w4a16";
    int previous = 0;
    LOWBIT_CUDA_CHECK(op, cudaGetDevice(&previous));
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
    for (auto* kernel : {gemm_w4a16_kernel<C, false>, gemm_w4a16_kernel<C, true>})
      LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    int blocks = 0;
    LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemm_w4a16_kernel<C, false>,
                                                                        C::kThreads, C::kSmemBytes));
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(previous));
    LOWBIT_CHECK(blocks > 0, op, ": the kernel for this token count does not fit on device ", device);
    cache[device] = blocks;
  }
  return {C::kBlockN, C::kBlockM, C::kChunks, cache[device]};
}

ShapeInfo prepare(Shape s, int device) {
  switch (s) {
    case Shape::m8: return prepare<CfgM8>(device);
    case Shape::m16: return prepare<CfgM16>(device);
    case Shape::m32: return prepare<CfgM32>(device);
    case Shape::m64: return prepare<CfgM64>(device);
    default: return prepare<CfgLarge>(device);
  }
}

template <class C>
void launch(const GemmArgs& p, int split, cudaStream_t stream) {
  const dim3 grid((p.m + C::kBlockM - 1) / C::kBlockM, (p.n + C::kBlockN - 1) / C::kBlockN, split);
  launch_maybe_pdl("gemm_w4a16", p.pdl, p.mins ? gemm_w4a16_kernel<C, true> : gemm_w4a16_kernel<C, false>, grid,
                   dim3(C::kThreads), C::kSmemBytes, stream, p);
}

// From this many tokens the large-M kernel (gemm_w4a16_large_sm80.cu) runs: it dequantizes each
// weight chunk once per block instead of once per warp and its mma covers 16 tokens, not 8. Below,
// the tiles of this kernel plus split-K fill the SMs better than 64-token blocks without split-K.
constexpr int64_t kLargeMinTokens = 128;

// Up to this many tokens, on layers of at least this many rows, the Hopper decode kernel
// (gemm_w4a16_decode_sm90.cu) runs on sm_90 when the caller leaves both the kernel and the split to the op: there
// its unsplit CTAs cover the SMs and it was measured 1.03-1.15x faster than this kernel (H200); on narrower layers
// it was slower (docs/benchmarks_gpu.md).
constexpr int64_t kDecodeMaxTokens = 16;
constexpr int64_t kDecodeMinRows = 16384;

struct KernelChoice {
  bool large, sm90, decode, gemv;
  W4A16LargeTile tile;
};

// The kernel the caller named (a plan names it; the op-level API may leave it automatic: at one token on sm_90 (k up
// to kGemvMaxK, no pinned split), the register-direct GEMV; otherwise up to kDecodeMaxTokens
// tokens on layers of kDecodeMinRows rows or more, without a pinned split, the Hopper decode kernel; on sm_90 the
// wgmma kernel from kLargeMinTokens tokens, and from 17 without a pinned split (kernels::w4a16_wgmma_preferred); else
// from kLargeMinTokens tokens the large mma.sync kernel) and the large kernel's tile
// (W4A16Options::large_tile). The decode kernel splits in clusters (W4A16Options::sm90_split), not by split_k.
KernelChoice pick_kernel(int64_t m, int64_t n, int64_t k, int split_k, const W4A16Options& o, int device) {
  const bool automatic = o.kernel == W4A16Kernel::automatic;
  const bool gemv = o.kernel == W4A16Kernel::gemv ||
                    (automatic && m == 1 && k <= detail::kGemvMaxK && split_k <= 0 &&
                     compute_capability_major(device) == 9);
  const bool decode = o.kernel == W4A16Kernel::decode_sm90 ||
                      (automatic && !gemv && m <= kDecodeMaxTokens && n >= kDecodeMinRows && split_k <= 0 &&
                       detail::gemm_w4a16_decode_sm90_usable(device));
  const bool wgmma_bucket = split_k <= 0 && kernels::w4a16_wgmma_preferred(kernels::m_bucket_of(m));
  const bool sm90 = o.kernel == W4A16Kernel::sm90 ||
                    (automatic && (m >= kLargeMinTokens || wgmma_bucket) &&
                     detail::gemm_w4a16_sm90_usable(device));
  const bool large = !sm90 && (automatic ? m >= kLargeMinTokens : o.kernel == W4A16Kernel::large);
  W4A16LargeTile tile = W4A16LargeTile::automatic;
  switch (o.large_tile) {
    case 0: break;
    case 64128: tile = W4A16LargeTile::m64n128; break;
    case 128128: tile = W4A16LargeTile::m128n128; break;
    case 128256: tile = W4A16LargeTile::m128n256; break;
    default:
      LOWBIT_CHECK(false, "gemm_w4a16: large_tile must be 0, 64128, 128128 or 128256, got ", o.large_tile);
  }
  return {large, sm90, decode, gemv, tile};
}

}  // namespace

// Split-K: fill one wave of resident blocks when the (n, m) tiles alone do not (every block is then
// resident from the start and they finish together), with at least 4 chunks per split and the f32
// partials (8 bytes per split and output, written then read) below the weight bytes n*k/2.
// The large-M kernel has its own rule (split only below one block per SM); the sm90 and decode kernels split
// inside a thread-block cluster and need no partials (1).
int gemm_w4a16_pick_split(int64_t m, int64_t n, int64_t k, int device, const W4A16Options& options) {
  const KernelChoice choice = pick_kernel(m, n, k, 0, options, device);
  if (choice.sm90 || choice.decode) return 1;
  if (choice.gemv)
    return m <= detail::kGemvMaxTokens
               ? detail::gemm_w4a16_gemv_plan(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                              options.gemv_tiles, options.gemv_ring, options.gemv_blocks)
                     .split
               : 1;
  if (choice.large)
    return gemm_w4a16_large_pick_split(m, n, k, gemm_w4a16_large_tile(m, n, choice.tile, device), device);
  const ShapeInfo info = prepare(shape_for(m), device);
  const int64_t k_chunks = k / kChunkK;
  const int64_t tiles = ((n + info.block_n - 1) / info.block_n) * ((m + info.block_m - 1) / info.block_m);
  const int64_t slots = static_cast<int64_t>(info.blocks_per_sm) * multiprocessor_count(device);
  int64_t split = std::max<int64_t>(1, slots / std::max<int64_t>(tiles, 1));
  split = std::min<int64_t>(split, std::max<int64_t>(1, k / (16 * std::max<int64_t>(m, 1))));
  split = std::min<int64_t>(split, std::max<int64_t>(1, k_chunks / 4));
  split = std::min<int64_t>(split, 64);
  const int64_t per = (k_chunks + split - 1) / split;  // even chunk counts, no empty split
  return static_cast<int>(std::max<int64_t>(1, (k_chunks + per - 1) / per));
}

namespace {
// The checks of the Hopper kernels' plan queries: the kernel exists on `device`, the shape is one the op takes; then
// `device` is made current (the plans read its SM count and occupancy).
void check_plan_query(const char* op, bool usable, const char* kernel, int64_t m, int64_t n, int64_t k, int device) {
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, usable, op, ": the ", kernel,
                    " kernel needs an sm_90 device and a library built with sm_90a kernels");
  LOWBIT_CHECK(m > 0 && m <= (1LL << 30) && n > 0 && n <= (1LL << 22) && k > 0 && k % kChunkK == 0, op,
               ": bad shape m=", m, " n=", n, " k=", k);
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
}
}  // namespace

std::tuple<int, int, int> gemm_w4a16_sm90_plan(int64_t m, int64_t n, int64_t k, int device,
                                               const W4A16Options& options) {
  check_plan_query("gemm_w4a16_sm90_plan", detail::gemm_w4a16_sm90_usable(device), "sm90", m, n, k, device);
  const detail::Sm90Plan plan = detail::gemm_w4a16_sm90_plan(
      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
      {options.sm90_split, options.sm90_tokens, options.sm90_serial, options.sm90_streamk, options.sm90_ctas, options.sm90_no_streamk,
       options.sm90_rows, options.sm90_reduce, options.sm90_one_producer});
  return {plan.tokens, plan.streamk ? 0 : plan.split, plan.head};
}

int gemm_w4a16_sm90_plan_rows(int64_t m, int64_t n, int64_t k, int device, const W4A16Options& options) {
  check_plan_query("gemm_w4a16_sm90_plan_rows", detail::gemm_w4a16_sm90_usable(device), "sm90", m, n, k, device);
  return detail::gemm_w4a16_sm90_plan(
             static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
             {options.sm90_split, options.sm90_tokens, options.sm90_serial, options.sm90_streamk, options.sm90_ctas,
              options.sm90_no_streamk, options.sm90_rows, options.sm90_reduce, options.sm90_one_producer})
      .rows;
}

int gemm_w4a16_decode_sm90_split(int64_t m, int64_t n, int64_t k, int device) {
  check_plan_query("gemm_w4a16_decode_sm90_split", detail::gemm_w4a16_decode_sm90_usable(device), "decode", m, n, k,
                   device);
  return detail::gemm_w4a16_decode_sm90_split(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 0);
}

std::pair<int, int> gemm_w4a16_gemv_plan(int64_t m, int64_t n, int64_t k, int device, int tiles, int ring,
                                         int blocks) {
  LOWBIT_CHECK(m > 0 && m <= detail::kGemvMaxTokens && n > 0 && n <= (1LL << 22) && k > 0 && k % kChunkK == 0,
               "gemm_w4a16_gemv_plan: bad shape m=", m, " n=", n, " k=", k, " (1-", detail::kGemvMaxTokens,
               " tokens, k a multiple of 64)");
  LOWBIT_CUDA_CHECK("gemm_w4a16_gemv_plan", cudaSetDevice(device));
  const detail::GemvPlan plan =
      detail::gemm_w4a16_gemv_plan(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), tiles, ring, blocks);
  return {plan.tiles, plan.split};
}

int64_t gemm_w4a16_workspace_elems(int64_t m, int64_t n, int split_k) { return split_k > 1 ? split_k * m * n : 0; }

void gemm_w4a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                cudaStream_t stream, const W4A16Options& options) {
  const char* op = "gemm_w4a16";
  LOWBIT_CHECK(w.format == WeightFormat::w4 && w.target == PackTarget::sm80, op,
               ": argument 'w' must be a w4 weight packed for sm80 (pack_sm80)");
  check_cuda_tensor(x, op, "x");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, x.dtype() == ScalarType::f16, op,
                    ": argument 'x' must be f16 (bf16 activations have no W4A16 kernel yet), got ",
                    name_of(x.dtype()));
  check_dim(x, 2, op, "x");
  const int64_t m = x.size(0), n = w.n, k = w.k;
  LOWBIT_CHECK(x.size(1) == k, op, ": argument 'x' has ", x.size(1), " features but the weight expects k=", k);
  LOWBIT_CHECK(x.stride(1) == 1 && x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0, op,
               ": argument 'x' needs unit stride in the last dim, a row stride divisible by 8 and a 16-byte aligned "
               "start, got strides ", shape_str(x.strides()));
  LOWBIT_CHECK(k % kChunkK == 0 && w.group % (kChunkK / 2) == 0, op, ": the packed weight needs k a multiple of ",
               kChunkK, " and the group a multiple of ", kChunkK / 2, ", got k=", k, " group=", w.group);
  // The second parameter per group: zero points, or the mins of w = q*s + m (pack_sm80 keeps exactly one).
  const bool mins = w.mins.defined();
  const Tensor& zeros = mins ? w.mins : w.zeros;
  const char* zeros_name = mins ? "w.mins" : "w.zeros";
  check_same_device(w.data, x, op, "w.data");
  check_same_device(w.scales, x, op, "w.scales");
  check_same_device(zeros, x, op, zeros_name);
  check_shape(w.data, {(n + kTileN - 1) / kTileN, (k / kChunkK) * kChunkBytes}, op, "w.data");
  const int64_t groups = (k + w.group - 1) / w.group, npad = (n + kTileN - 1) / kTileN * kTileN;
  check_shape(w.scales, {groups, npad}, op, "w.scales");
  check_shape(zeros, {groups, npad}, op, zeros_name);
  for (const Tensor* t : {&w.data, &w.scales, &zeros})
    LOWBIT_CHECK(t->is_contiguous() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, op,
                 ": the packed weight's data, scales and zeros/mins must be contiguous with 16-byte aligned starts");
  check_same_device(y, x, op, "y");
  check_dtype(y, ScalarType::f16, op, "y");
  check_shape(y, {m, n}, op, "y");
  LOWBIT_CHECK(y.stride(1) == 1, op, ": argument 'y' needs unit stride in the last dim");
  LOWBIT_CHECK(m <= (1LL << 30) && n * k < (1LL << 40) && n <= (1LL << 22), op, ": problem too large");
  if (m == 0 || n == 0) return;

  const int dev = x.device().index;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(dev));
  const KernelChoice choice = pick_kernel(m, n, k, split_k, options, dev);
  if (choice.decode) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, detail::gemm_w4a16_decode_sm90_usable(dev), op,
                      ": the decode kernel needs an sm_90 device and a library built with sm_90a kernels (device ", dev,
                      " does not qualify); name 'small' instead");
    const detail::W4A16Problem problem{x.data<__half>(), x.stride(0), w.data.data<uint8_t>(), w.scales.data<__half>(),
                                       zeros.data<__half>(), y.data<__half>(), y.stride(0), static_cast<int>(m),
                                       static_cast<int>(n), static_cast<int>(k), w.group, static_cast<int>(npad),
                                       mins};
    detail::gemm_w4a16_decode_sm90(problem, options.sm90_split, options.pdl && pdl_supported(dev), stream);
    return;
  }
  if (choice.gemv) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, m <= detail::kGemvMaxTokens, op, ": the gemv kernel takes 1-",
                      detail::kGemvMaxTokens, " tokens, got m=", m, "; name 'small' instead");
    const detail::GemvPlan plan = detail::gemm_w4a16_gemv_plan(static_cast<int>(m), static_cast<int>(n),
                                                               static_cast<int>(k), options.gemv_tiles,
                                                               options.gemv_ring, options.gemv_blocks);
    Tensor ws = workspace;
    if (plan.split > 1) {
      const int64_t need = gemm_w4a16_workspace_elems(m, n, plan.split);
      if (!ws.defined() || ws.numel() < need) ws = Tensor::empty({need}, ScalarType::f32, x.device());
      check_same_device(ws, x, op, "workspace");
      check_dtype(ws, ScalarType::f32, op, "workspace");
      LOWBIT_CHECK(ws.is_contiguous(), op, ": argument 'workspace' must be contiguous");
    }
    const detail::W4A16Problem problem{x.data<__half>(), x.stride(0), w.data.data<uint8_t>(), w.scales.data<__half>(),
                                       zeros.data<__half>(), y.data<__half>(), y.stride(0), static_cast<int>(m),
                                       static_cast<int>(n), static_cast<int>(k), w.group, static_cast<int>(npad),
                                       mins};
    float* partial = plan.split > 1 ? ws.data<float>() : nullptr;
    detail::gemm_w4a16_gemv(problem, partial, plan, options.pdl && pdl_supported(dev), stream);
    if (plan.split > 1) {
      sum_split_partials(partial, plan.split, static_cast<int>(m), static_cast<int>(n), y.data<__half>(), y.stride(0),
                         stream);
      LOWBIT_CUDA_CHECK_LAUNCH(op);
    }
    return;
  }
  if (choice.sm90) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, detail::gemm_w4a16_sm90_usable(dev), op,
                      ": the sm90 kernel needs an sm_90 device and a library built with sm_90a kernels (device ", dev,
                      " does not qualify); name 'small' or 'large' instead");
    const int64_t npad_sm90 = (n + kTileN - 1) / kTileN * kTileN;
    const detail::W4A16Problem problem{x.data<__half>(), x.stride(0), w.data.data<uint8_t>(), w.scales.data<__half>(),
                                       zeros.data<__half>(), y.data<__half>(), y.stride(0), static_cast<int>(m),
                                       static_cast<int>(n), static_cast<int>(k), w.group, static_cast<int>(npad_sm90),
                                       mins};
    detail::Sm90Choice sm90_choice{options.sm90_split, options.sm90_tokens, options.sm90_serial,
                                   options.sm90_streamk, options.sm90_ctas, options.sm90_no_streamk,
                                   options.sm90_rows, options.sm90_reduce, options.sm90_one_producer};
    sm90_choice.pdl = options.pdl && pdl_supported(dev);
    detail::gemm_w4a16_sm90(problem, sm90_choice, stream);
    return;
  }
  const W4A16LargeTile large_tile =
      choice.large ? gemm_w4a16_large_tile(m, n, choice.tile, dev) : W4A16LargeTile::automatic;
  const Shape shape = shape_for(m);
  if (!choice.large) prepare(shape, dev);
  const int k_chunks = static_cast<int>(k / kChunkK);
  int split = split_k > 0            ? std::min(split_k, k_chunks)
              : choice.large         ? gemm_w4a16_large_pick_split(m, n, k, large_tile, dev)
                                     : gemm_w4a16_pick_split(m, n, k, dev, options);
  const int per = (k_chunks + split - 1) / split;
  split = (k_chunks + per - 1) / per;
  LOWBIT_CHECK(split <= 65535, op, ": split_k too large");

  Tensor ws = workspace;
  if (split > 1) {
    const int64_t need = gemm_w4a16_workspace_elems(m, n, split);
    if (!ws.defined()) ws = Tensor::empty({need}, ScalarType::f32, x.device());
    check_same_device(ws, x, op, "workspace");
    check_dtype(ws, ScalarType::f32, op, "workspace");
    LOWBIT_CHECK(ws.is_contiguous() && ws.numel() >= need, op, ": argument 'workspace' needs ", need,
                 " contiguous f32 elements, got ", ws.str());
  }
  if (choice.large) {
    const W4A16LargeArgs p{x.data<__half>(), x.stride(0), w.data.data<uint8_t>(), w.scales.data<__half>(),
                           zeros.data<__half>(), y.data<__half>(), y.stride(0),
                           split > 1 ? ws.data<float>() : nullptr, static_cast<int>(m), static_cast<int>(n),
                           static_cast<int>(k), w.group, static_cast<int>(npad), per, mins};
    gemm_w4a16_large(p, large_tile, split, stream);
    return;
  }
  GemmArgs p{x.data<__half>(), x.stride(0), w.data.data<uint8_t>(), w.scales.data<__half>(), zeros.data<__half>(),
             y.data<__half>(), y.stride(0), split > 1 ? ws.data<float>() : nullptr, static_cast<int>(m),
             static_cast<int>(n), static_cast<int>(k), w.group, static_cast<int>(npad), per,
             options.pdl && pdl_supported(dev), mins};
  switch (shape) {
    case Shape::m8: launch<CfgM8>(p, split, stream); break;
    case Shape::m16: launch<CfgM16>(p, split, stream); break;
    case Shape::m32: launch<CfgM32>(p, split, stream); break;
    case Shape::m64: launch<CfgM64>(p, split, stream); break;
    default: launch<CfgLarge>(p, split, stream); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (split > 1) {
    sum_split_partials(ws.data<float>(), split, p.m, p.n, p.y, p.ldy, stream);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda
