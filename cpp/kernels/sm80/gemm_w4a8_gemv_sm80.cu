// W4A8 GEMV for 1-16 tokens, register-direct (kernel name "gemv[:rDbB]" of gemm_w4a8): the W4A16 GEMV's design
// (gemm_w4a16_gemv_sm80.cu, which says why: the smem-ring kernels hold too few bytes in flight per SM at one token)
// over pack_sm80_w4a8's layout, which QoQ and LiquidQuant weights share.
//
// Shape of the work: a CTA owns one 16-row weight tile; its 8 warps split the tile's 64-k chunks into 8 contiguous
// runs (k slices). pack_sm80_w4a8 stores a tile's chunks back to back, one 16-byte word per lane per chunk that is
// already the lane's four A-fragment words for the chunk's two k32 steps, so a warp streams its run with 16-byte
// ld.global.nc.L1::no_allocate loads D chunks ahead into a register ring (no shared-memory staging, no barrier). The
// step and offset bytes ride the ring beside each chunk: lanes 0-15 load the steps of rows 0-15, lanes 16-31 their
// offsets (one byte each), and each lane takes rows g and g+8 by shuffles when the chunk is computed. The ring's first
// loads are issued before the programmatic-dependent wait (the weights do not depend on the kernel before).
//
// Math: the same in-register dequant as the mma.sync W4A8 kernel ((q*s + a) ^ 0x80 per byte, w4a8_common_sm80.cuh)
// straight into the A fragment, mma.sync m16n8k32 s8 with the tokens as B (8 columns, tokens past m read a zero row;
// 9-16 tokens: a second 8-column tile, one more ldmatrix and two more mma per chunk on the same dequantized A),
// int32 accumulation over the whole k (exact, so the slices' and the k splits' sums equal the other kernels' bit for
// bit) and the per-token x per-channel scales once in the epilogue. Per chunk: 2 mma + ~30 dequant instructions (half
// the W4A16 GEMV's dequant work). x (s8, the CTA's k range for its tokens) is copied once per CTA into shared memory;
// its rows are an odd multiple of 16 bytes apart (conflict-free ldmatrix.x4: one per chunk gives all four B words).
//
// FMPQ activations (COMET W4Ax, gemm_fmpq's "gemv"; kFmpq): s8 codes with one f32 scale per token and 128-channel
// block. The same kernel, with each warp's k run made of whole blocks: at a block's last chunk its int32 sums (exact)
// are flushed into f32 accumulators times each token's block scale (staged in shared memory beside x), then reset;
// the k slices and the k splits then meet in f32, always in the same order (deterministic, not bit-equal to the
// mma.sync FMPQ kernel's order), and the channel scale applies once at the end.
//
// When x for the whole k would not fit the configuration's shared-memory budget (at r4b4 ~47 KB per CTA: one token
// past k ~24000, 8 tokens past k ~5200, 16 tokens past k ~2700) the k range is split over gridDim.y CTAs whose int32 partials a small kernel
// sums before the scales.
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "cuda/pdl.cuh"
#include "cuda/smem_limit.h"
#include "kernels/sm80/gemm_w4a8_gemv_sm80.h"
#include "kernels/sm80/gemv_plan.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm80/w4a8_common_sm80.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda::detail {
namespace {

using w4a16::cp_async16;
using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::kChunkK;
using w4a16::kTileN;
using w4a16::ldmatrix_x4;
using w4a16::smem_addr;
using w4a8::dequant_bytes;
using w4a8::mma_s8_16832;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
// Token tiles of 8 (the mma's n): 1 up to 8 tokens, 2 up to 16.
constexpr int token_tiles(int m) { return m <= 8 ? 1 : 2; }
// The k slices' int32 sums, one int4 per lane and warp per token tile.
constexpr int red_bytes(int tiles) { return tiles * kWarps * 32 * 16; }
// Bytes of x per CTA: what leaves `blocks` CTAs per SM room on Hopper / A100 (228 KB, 1 KB reserved per CTA) with the
// reduction area, at most 100000.
constexpr int x_budget(int blocks, int tiles) {
  return std::min(100000, 228 * 1024 / blocks - 1024 - red_bytes(tiles) - 512);
}
// Rows of x in shared memory: 16 * (4 * chunks + 1) bytes apart, an odd multiple of 16, so the 8 rows one ldmatrix
// phase reads fall in 8 different 16-byte bank groups.
int x_row_bytes(int chunks) { return chunks * kChunkK + 16; }
// x's rows, then a zero row for the token tiles' columns past m (none at 8 or 16 tokens: 16 tokens x k 4096 then fit
// r6b3's budget unsplit).
__host__ __device__ constexpr int x_rows(int m) { return m % 8 == 0 ? m : m + 1; }
int x_bytes(int m, int chunks) { return x_rows(m) * x_row_bytes(chunks); }
// FMPQ: the block scales of the CTA's k range, [m][ceil(chunks / 2)] f32 after the reduction area.
int scale_bytes(int m, int chunks) { return (m * ((chunks + 1) / 2) * 4 + 15) / 16 * 16; }

struct Args {
  W4A8Problem p;                   // FMPQ: x_scale unused, raw false
  int32_t* partial;                // [gridDim.y, m, n] when gridDim.y > 1
  int k_chunks, z_chunks, x_row;   // z_chunks: chunks per CTA along y; x_row: bytes between x rows in shared memory
  int tiles, slices;               // 16-row weight tiles per CTA and k slices per tile (tiles x slices = 8 warps)
  float inv_chunks_per_group;      // 1 / (group / 64)
  bool pdl;
  // FMPQ only: the block scales [m, blocks], f32 partials [gridDim.y, m, n] when gridDim.y > 1, f32 or f16 y
  const float* block_scale = nullptr;
  float* fpartial = nullptr;
  int blocks = 0;
  bool f32_out = false;
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) {
  uint32_t r;
  asm("ld.global.nc.u8 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}

// FMPQ: the block-scaled f32 sum times the channel scale (the mma.sync FMPQ kernel's epilogue expression).
__device__ __forceinline__ void store_fmpq(const Args& a, int token, int col, float v) {
  const float y = v * a.p.channel_scale[col];
  if (a.f32_out)
    static_cast<float*>(a.p.y)[token * a.p.ldy + col] = y;
  else
    static_cast<__half*>(a.p.y)[token * a.p.ldy + col] = __float2half_rn(y);
}

__device__ __forceinline__ void store_output(const W4A8Problem& p, int token, int col, int v) {
  if (p.raw)
    static_cast<int32_t*>(p.y)[token * p.ldy + col] = v;
  else  // the mma.sync kernel's expression, so its f16 outputs match bit for bit
    static_cast<__half*>(p.y)[token * p.ldy + col] =
        __float2half_rn(static_cast<float>(v) * p.x_scale[token] * p.channel_scale[col]);
}

// kRing: chunks in flight per warp; kBlocks: CTAs per SM the registers are budgeted for; kTiles: 8-token tiles;
// kFmpq: FMPQ activations (per-block scales).
template <int kRing, int kBlocks, int kTiles, bool kFmpq>
__global__ void __launch_bounds__(kThreads, kBlocks) gemm_w4a8_gemv_kernel(Args a) {
  extern __shared__ uint4 smem_u4[];
  uint8_t* xs = reinterpret_cast<uint8_t*>(smem_u4);
  const W4A8Problem& p = a.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tile = warp % a.tiles, slice = warp / a.tiles;
  const int nt = blockIdx.x * a.tiles + tile, n_tiles = (p.n + kTileN - 1) / kTileN;
  const int zb = blockIdx.y * a.z_chunks, ze = min(zb + a.z_chunks, a.k_chunks);
  int per = (ze - zb + a.slices - 1) / a.slices;
  if (kFmpq) per = (per + 1) & ~1;  // whole FMPQ blocks per warp (zb is even: the plan's z_chunks is)
  // A warp past the last tile (n not a multiple of 16 x tiles) streams nothing but still meets the CTA's barriers.
  const int kb = nt < n_tiles ? min(zb + slice * per, ze) : ze, ke = min(kb + per, ze);

  // This lane's 16 bytes of chunk kc are 16-byte word wofs + 32 kc of p.w (a layer stays below 2^32 such words).
  const uint32_t wofs = static_cast<uint32_t>(nt) * a.k_chunks * 32 + lane;
  const uint8_t* pbase = (lane < 16 ? p.steps : p.offsets) + nt * kTileN + (lane & 15);
  // Where registers are tight (3+ CTAs per SM) a slot is refilled after its chunk is computed, not before.
  constexpr bool kLateRefill = kBlocks >= 3;
  uint4 wbuf[kRing];
  uint32_t pbuf[kRing];
  auto issue = [&](int d, int kc) {
    wbuf[d] = ld_stream(reinterpret_cast<const uint4*>(p.w) + (wofs + static_cast<uint32_t>(kc) * 32));
    // The group row of chunk kc in f32: (kc + 0.5) / (group / 64) stays at least 0.5 / (group / 64) off an integer,
    // far above f32's rounding for any k this kernel takes.
    const int row = static_cast<int>((static_cast<float>(kc) + 0.5f) * a.inv_chunks_per_group);
    pbuf[d] = ld_u8(pbase + static_cast<int64_t>(row) * p.npad);
  };
#pragma unroll
  for (int d = 0; d < kRing; ++d)
    if (kb + d < ke) issue(d, kb + d);
  if (a.pdl) pdl_wait_for_producers();

  // x rows [0, m) of chunks [zb, ze), then a zero row that tokens past m read (the whole range: their ldmatrix
  // addresses step by one chunk like the others').
  const int len16 = (ze - zb) * (kChunkK / 16);
  for (int r = 0; r < p.m; ++r)
    for (int q = threadIdx.x; q < len16; q += kThreads)
      cp_async16(xs + r * a.x_row + q * 16, p.x + r * p.ldx + zb * kChunkK + q * 16);
  cp_async_commit();
  uint8_t* zero_row = xs + p.m * a.x_row;
  if (p.m < 8 * kTiles)
    for (int q = threadIdx.x; q < len16; q += kThreads) reinterpret_cast<uint4*>(zero_row)[q] = make_uint4(0, 0, 0, 0);
  // FMPQ: the block scales of this CTA's k range, one row of nb per token.
  const int b0 = zb / 2, nb = (ze - zb + 1) / 2;
  float* sscale = reinterpret_cast<float*>(xs + x_rows(p.m) * a.x_row + red_bytes(kTiles));
  if (kFmpq)
    for (int i = threadIdx.x; i < p.m * nb; i += kThreads) sscale[i] = a.block_scale[(i / nb) * a.blocks + b0 + i % nb];
  cp_async_wait<0>();
  __syncthreads();

  // ldmatrix.x4: lane l addresses token l & 7 of matrix l >> 3 = the chunk's 16-byte column l >> 3, so lane
  // (g, t) receives k 4t..4t+3 (+16, +32, +48) of token g: b0, b1 of step 0, then of step 1.
  uint32_t xaddr[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int tok = 8 * j + (lane & 7);
    xaddr[j] = smem_addr((tok < p.m ? xs + tok * a.x_row : zero_row) + 16 * (lane >> 3)) + (kb - zb) * kChunkK;
  }

  const int g = lane >> 2, tq = lane & 3;
  int acc[kTiles][4] = {};
  float facc[kTiles][4] = {};  // FMPQ: the block-scaled sums
  for (int base = kb; base < ke; base += kRing) {
#pragma unroll
    for (int d = 0; d < kRing; ++d) {
      const int kc = base + d;
      if (kc >= ke) break;
      const uint4 wv = wbuf[d];
      const uint32_t pv = pbuf[d];
      if (!kLateRefill && kc + kRing < ke) issue(d, kc + kRing);
      // Lanes 0-15: step | offset << 8 of row lane; then rows g and g + 8 per lane, the offset in every byte.
      const uint32_t so = pv | (__shfl_xor_sync(0xffffffffu, pv, 16) << 8);
      const uint32_t r_g = __shfl_sync(0xffffffffu, so, g), r_g8 = __shfl_sync(0xffffffffu, so, g + 8);
      const uint32_t s_g = r_g & 0xffu, s_g8 = r_g8 & 0xffu;
      const uint32_t a_g = __byte_perm(r_g, 0, 0x1111), a_g8 = __byte_perm(r_g8, 0, 0x1111);
      uint32_t b[kTiles][4];
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        ldmatrix_x4(xaddr[j], b[j][0], b[j][1], b[j][2], b[j][3]);
        xaddr[j] += kChunkK;
      }
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const uint32_t w_g = step ? wv.z : wv.x, w_g8 = step ? wv.w : wv.y;
        const uint32_t af[4] = {dequant_bytes(w_g & 0x0f0f0f0fu, s_g, a_g),
                                dequant_bytes(w_g8 & 0x0f0f0f0fu, s_g8, a_g8),
                                dequant_bytes((w_g >> 4) & 0x0f0f0f0fu, s_g, a_g),
                                dequant_bytes((w_g8 >> 4) & 0x0f0f0f0fu, s_g8, a_g8)};
#pragma unroll
        for (int j = 0; j < kTiles; ++j) mma_s8_16832(acc[j], af, b[j][2 * step], b[j][2 * step + 1]);
      }
      // FMPQ: chunk kc ends block kc / 2 when odd, or when it is k's last chunk (a one-chunk last block): the
      // block's exact int32 sums times each token's scale, then a fresh block. |sum| <= 128 * 127 * 127 < 2^22, so
      // the sum is exactly the f32 (2^23 + 2^22 + sum) - (2^23 + 2^22): an integer add and a float add in place of
      // the quarter-rate int-to-float conversion.
      if (kFmpq && ((kc & 1) || kc + 1 == ke)) {
        const float* bs = sscale + ((kc >> 1) - b0);
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int token = 8 * j + 2 * tq + (c & 1);
            const float sc = token < p.m ? bs[token * nb] : 0.f;
            facc[j][c] = fmaf(__int_as_float(0x4B400000 + acc[j][c]) - 12582912.f, sc, facc[j][c]);
            acc[j][c] = 0;
          }
      }
      if (kLateRefill && kc + kRing < ke) issue(d, kc + kRing);
    }
  }

  // The 8 k slices meet in shared memory after x, summed in int32 (exact) by warp 0.
  int4* red = reinterpret_cast<int4*>(xs + x_rows(p.m) * a.x_row);
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
    red[(j * kWarps + warp) * 32 + lane] =
        kFmpq ? make_int4(__float_as_int(facc[j][0]), __float_as_int(facc[j][1]), __float_as_int(facc[j][2]),
                          __float_as_int(facc[j][3]))
              : make_int4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
  __syncthreads();
  if (slice != 0 || nt >= n_tiles) return;
  const int t = tq;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    for (int s = 1; s < a.slices; ++s) {  // the tile's other k slices: warps tile + s * tiles (FMPQ: in this order)
      const int4 v = red[(j * kWarps + s * a.tiles + tile) * 32 + lane];
      if (kFmpq) {
        facc[j][0] += __int_as_float(v.x), facc[j][1] += __int_as_float(v.y);
        facc[j][2] += __int_as_float(v.z), facc[j][3] += __int_as_float(v.w);
      } else {
        acc[j][0] += v.x, acc[j][1] += v.y, acc[j][2] += v.z, acc[j][3] += v.w;
      }
    }
    // acc[j]: c0, c1 = row g, tokens 8j + 2t, 8j + 2t + 1; c2, c3 = row g + 8, the same tokens.
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int token = 8 * j + 2 * t + (c & 1), col = nt * kTileN + g + 8 * (c >> 1);
      if (token >= p.m || col >= p.n) continue;
      const int64_t at = (static_cast<int64_t>(blockIdx.y) * p.m + token) * p.n + col;
      if (kFmpq) {
        if (gridDim.y == 1)
          store_fmpq(a, token, col, facc[j][c]);
        else
          a.fpartial[at] = facc[j][c];
      } else if (gridDim.y == 1) {
        store_output(p, token, col, acc[j][c]);
      } else {
        a.partial[at] = acc[j][c];
      }
    }
  }
}

// Sums the int32 partials of the k splits (exact in any order) and applies the scales.
__global__ void sum_partials8_kernel(W4A8Problem p, const int32_t* partial, int split) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.m * p.n) return;
  int s = 0;
  for (int z = 0; z < split; ++z) s += partial[static_cast<int64_t>(z) * p.m * p.n + i];
  store_output(p, i / p.n, i % p.n, s);
}

// FMPQ: sums the f32 partials of the k splits in split order, then the channel scale.
__global__ void sum_partials_fmpq_kernel(Args a, int split) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.p.m * a.p.n) return;
  float s = 0.f;
  for (int z = 0; z < split; ++z) s += a.fpartial[static_cast<int64_t>(z) * a.p.m * a.p.n + i];
  store_fmpq(a, i / a.p.n, i % a.p.n, s);
}

}  // namespace

Gemv8Plan gemm_w4a8_gemv_plan(int m, int n, int k, int ring, int blocks, bool wide, int sms, bool fmpq) {
  const char* op = fmpq ? "gemm_fmpq" : "gemm_w4a8";
  LOWBIT_CHECK(m >= 1 && m <= kGemv8MaxTokens, op, ": the gemv kernel takes 1-", kGemv8MaxTokens, " tokens, got m=", m);
  const int k_chunks = k / kChunkK;
  const GemvShape s = plan_gemv_shape(op, kGemv8Configs, k_chunks, ring, blocks, [&](int b, int chunks) {
    return x_bytes(m, chunks) + (fmpq ? scale_bytes(m, chunks) : 0) <= x_budget(b, token_tiles(m));
  });
  // FMPQ: each CTA's k range is whole 128-channel blocks (one more chunk of x at most past the budget's fit).
  auto whole_blocks = [&](int per) {
    if (fmpq && per % 2) ++per;
    return Gemv8Plan{(k_chunks + per - 1) / per, per, s.config, 1};
  };
  if (!wide) return whole_blocks(s.chunks_per_split);
  // Wide: 4 tiles per CTA read one copy of x (x per CTA a quarter of the one-tile kernel's per weight byte), and k
  // is split over CTAs until the grid has ~3 CTAs per SM, each warp keeping at least 4 chunks.
  constexpr int kWideTiles = 4, kSlices = kWarps / kWideTiles;
  const int groups = ((n + kTileN - 1) / kTileN + kWideTiles - 1) / kWideTiles;
  const int most = std::max(1, k_chunks / (4 * kSlices));
  const int split = std::max(s.split, std::min(most, (3 * sms + groups - 1) / groups));
  Gemv8Plan plan = whole_blocks((k_chunks + split - 1) / split);
  plan.tiles = kWideTiles;
  return plan;
}

namespace {
template <int kRing, int kBlocks, bool kFmpq>
void launch_config(const Args& args, dim3 grid, int smem, bool pdl, cudaStream_t stream) {
  const char* op = kFmpq ? "gemm_fmpq" : "gemm_w4a8";
  auto kernel = token_tiles(args.p.m) == 1 ? gemm_w4a8_gemv_kernel<kRing, kBlocks, 1, kFmpq>
                                           : gemm_w4a8_gemv_kernel<kRing, kBlocks, 2, kFmpq>;
  raise_dynamic_smem_limit(op, kernel, smem);  // smem varies by launch (cuda/smem_limit.h)
  launch_maybe_pdl(op, pdl, kernel, grid, dim3(kThreads), static_cast<size_t>(smem), stream, args);
}
}  // namespace

namespace {
// Both formats' launch: args.block_scale set = FMPQ.
void launch_gemv(const Args& args, const Gemv8Plan& plan, bool pdl, cudaStream_t stream) {
  const bool fmpq = args.block_scale != nullptr;
  const char* op = fmpq ? "gemm_fmpq" : "gemm_w4a8";
  const W4A8Problem& p = args.p;
  const int n_tiles = (p.n + kTileN - 1) / kTileN;
  const int smem = x_bytes(p.m, plan.chunks_per_split) + red_bytes(token_tiles(p.m)) +
                   (fmpq ? scale_bytes(p.m, plan.chunks_per_split) : 0);
  LOWBIT_CHECK(plan.tiles == 1 || plan.tiles == 2 || plan.tiles == 4 || plan.tiles == 8, op, ": bad tiles per CTA ",
               plan.tiles);
  LOWBIT_CHECK(plan.split <= 65535, op, ": split too large");
  LOWBIT_CHECK(plan.split == 1 || (fmpq ? args.fpartial != nullptr : args.partial != nullptr), op,
               ": a split gemv needs its partials");
  LOWBIT_CHECK(!fmpq || plan.chunks_per_split % 2 == 0 || plan.split == 1, op, ": FMPQ k splits need whole blocks");
  const dim3 grid(static_cast<unsigned>((n_tiles + plan.tiles - 1) / plan.tiles), static_cast<unsigned>(plan.split));
  // One case per kGemv8Configs entry (gemm_w4a8_gemv_sm80.h), in its order.
  static_assert(kGemv8ConfigCount == 5, "a launch case per configuration");
  auto launch = [&](auto fmpq_tag) {
    constexpr bool F = decltype(fmpq_tag)::value;
    switch (plan.config) {
      case 0: launch_config<kGemv8Configs[0].depth, kGemv8Configs[0].blocks, F>(args, grid, smem, pdl, stream); break;
      case 1: launch_config<kGemv8Configs[1].depth, kGemv8Configs[1].blocks, F>(args, grid, smem, pdl, stream); break;
      case 2: launch_config<kGemv8Configs[2].depth, kGemv8Configs[2].blocks, F>(args, grid, smem, pdl, stream); break;
      case 3: launch_config<kGemv8Configs[3].depth, kGemv8Configs[3].blocks, F>(args, grid, smem, pdl, stream); break;
      case 4: launch_config<kGemv8Configs[4].depth, kGemv8Configs[4].blocks, F>(args, grid, smem, pdl, stream); break;
      default: LOWBIT_CHECK(false, op, ": bad gemv configuration ", plan.config);
    }
  };
  if (fmpq)
    launch(std::true_type{});
  else
    launch(std::false_type{});
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (plan.split > 1) {
    const int total = p.m * p.n;
    if (fmpq)
      sum_partials_fmpq_kernel<<<(total + 255) / 256, 256, 0, stream>>>(args, plan.split);
    else
      sum_partials8_kernel<<<(total + 255) / 256, 256, 0, stream>>>(p, args.partial, plan.split);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}
}  // namespace

void gemm_w4a8_gemv(const W4A8Problem& p, int32_t* partial, const Gemv8Plan& plan, bool pdl, cudaStream_t stream) {
  const Args args{p, partial, p.k / kChunkK, plan.chunks_per_split, x_row_bytes(plan.chunks_per_split),
                  plan.tiles, kWarps / plan.tiles, 1.f / static_cast<float>(p.group / kChunkK), pdl};
  launch_gemv(args, plan, pdl, stream);
}

void gemm_fmpq_gemv(const FmpqProblem& f, float* partial, const Gemv8Plan& plan, bool pdl, cudaStream_t stream) {
  const W4A8Problem p{f.x, f.ldx, nullptr, f.w, f.steps, f.offsets, f.channel_scale, f.y, f.ldy,
                      f.m, f.n, f.k, f.group, f.npad, /*raw=*/false};
  Args args{p, nullptr, f.k / kChunkK, plan.chunks_per_split, x_row_bytes(plan.chunks_per_split),
            plan.tiles, kWarps / plan.tiles, 1.f / static_cast<float>(f.group / kChunkK), pdl};
  args.block_scale = f.x_scale;
  args.fpartial = partial;
  args.blocks = f.blocks;
  args.f32_out = f.f32_out;
  launch_gemv(args, plan, pdl, stream);
}

}  // namespace lowbit::cuda::detail
