// COMET W4Ax GEMM for Ampere/Ada's int4 tensor cores (COMET §4: two MMA streams into one tile's
// accumulators): int4 activation blocks run on mma.sync m16n8k64 s4 x s4, int8 blocks on the m16n8k32
// s8 stream of gemm_fmpq_sm80.cu (w4a8_common_sm80.cuh), chosen per 128-channel block by the block map
// (a bit mask in the kernel's arguments). Same pipeline, tiles, per-block f32 flush and split-K as
// gemm_fmpq_sm80.cu; only the int4 blocks' inner product differs, and it is exact, so the int32 block
// sums (raw output) equal that kernel's bit for bit.
//
// The s4 stream never widens the weight to s8. pack_sm80_w4a8's s8 weight of a row and group is affine in
// its u4 code q: w8 = (q*s + a) - 128 (QoQ a = 128 - z*s, LiquidQuant a = min + 128 as stored), so over a
// group's k
//     sum_k w8_k * x_k = s * sum_k (q_k - 8) * x_k + c * sum_k x_k,   c = 8*s + a - 128,
// with q - 8 in [-8, 7] an s4 operand (q ^ 8 per nibble) and x in [-7, 7] (int4 blocks). Per 64-k chunk
// (groups are multiples of 64) one s4 MMA per weight tile gives sum (q - 8) x, one s4 MMA of a ones tile
// per token tile gives sum x (in the accumulator layout, tokens 2t and 2t+1), and two IMADs per element
// fold them into the block's int32 sums.
//
// Fragment order: the k order inside an MMA is free as long as A and B agree. A lane's packed weight word
// (pack_sm80_w4a8.cpp) holds, at nibble 2b / 2b+1, chunk k 4t+b / 16+4t+b (+32 for the second k32 step),
// which is the s4 A register as it is (no permutation, one XOR). The B register is built to match from
// the s8 codes in shared memory: (lo & 0x0f0f0f0f) | (hi & 0x0f0f0f0f) << 4 of the two words the s8
// stream reads (first version: activations arrive as s8 codes and are narrowed in registers; an s4
// activation layout from the quantizer would halve their bytes and is not written).
//
// Hopper runs this code (test_gpu_fmpq.py forces it there for correctness) but its s4 mma is slow: the
// registry takes this kernel by default on sm_80/86/87/89 only; on sm_90 it runs only when forced by name.
// Tiles: gemm_fmpq_sm80.cu's, except 64-token tiles from 33 tokens on (its 128-token tile spilled on sm_80)
// and 3 CTAs per SM at <= 8 tokens (4 spilled on sm_90a); 0 spills on sm_80 and sm_90a. Speed: unmeasured
// (no GPU with int4 tensor cores measured yet; docs/benchmarks_gpu.md, COMET round 3).
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "cuda/pdl.cuh"
#include "kernels/sm80/gemm_fmpq_s4_sm80.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm80/w4a8_common_sm80.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/quant/activation.h"

namespace lowbit::cuda::detail {
namespace {

using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::kChunkBytes;
using w4a16::kChunkK;
using w4a16::kTileN;
static_assert(kFmpqBlock == 2 * kChunkK, "a stage of two packed chunks is one FMPQ block");

enum class Out : uint8_t { f16, f32, raw };

struct S4Args {
  const int8_t* x;  // s8 [m, k], row stride ldx
  int64_t ldx;
  const float* x_scale;  // [m, blocks]; unused for raw output
  const uint8_t* w;
  const uint8_t* steps;  // [G, npad]
  const uint8_t* offsets;
  const float* channel_scale;
  void* y;  // f16 / f32 [m, ldy], or s32 [m, blocks, n]
  int64_t ldy;
  float* partial;  // [split, m, n] when split > 1 (scaled outputs)
  int m, n, k, blocks, group, npad, chunks_per_split;
  Out out;
  bool pdl;
  uint32_t int8_mask[kFmpqMaxBlocks / 32];
};

template <int kWarpsN_, int kWarpsM_, int kTilesN_, int kTilesM_, int kStages_, int kMinBlocks_>
struct Cfg {
  static constexpr int kWarpsN = kWarpsN_, kWarpsM = kWarpsM_, kTilesN = kTilesN_, kTilesM = kTilesM_;
  static constexpr int kChunks = 2, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsM;
  static constexpr int kBlockN = kTileN * kTilesN * kWarpsN, kBlockM = 8 * kTilesM * kWarpsM;
  static constexpr int kBlockTiles = kBlockN / kTileN;
  static constexpr int kWBytes = kBlockTiles * kChunks * kChunkBytes;
  static constexpr int kPBytes = kChunks * 2 * kBlockN;
  static constexpr int kXBytes = kChunks * kBlockM * kChunkK;
  static constexpr int kSBytes = (kBlockM * 4 + 15) / 16 * 16;
  static constexpr int kStageBytes = kWBytes + kPBytes + kXBytes + kSBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kBlockN % 16 == 0, "parameter rows are copied in 16-byte units");
};

__device__ inline void cp_async4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem));
}

template <class C>
__device__ inline void load_stage(const S4Args& p, uint8_t* stage, int kc0, int kc_end, int n0, int m0) {
  w4a8::load_operands<C>(p, stage, kc0, kc_end, n0, m0);
  if (p.out != Out::raw) {
    float* s_base = reinterpret_cast<float*>(stage + C::kWBytes + C::kPBytes + C::kXBytes);
    for (int r = threadIdx.x; r < C::kBlockM; r += C::kThreads)
      if (m0 + r < p.m) cp_async4(s_base + r, p.x_scale + static_cast<int64_t>(m0 + r) * p.blocks + kc0 / 2);
  }
}

__device__ inline void mma_s4_16864(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two s8 words of a token (k 4t+0..3 and 16+4t+0..3 of a k32 step) as one s4 B register: nibble 2b = byte b
// of lo, nibble 2b+1 = byte b of hi, the order of the packed weight word.
__device__ inline uint32_t s4_pair(uint32_t lo, uint32_t hi) {
  return (lo & 0x0f0f0f0fu) | ((hi << 4) & 0xf0f0f0f0u);
}

// One warp's share of an int4 block's stage: per chunk, each token tile's B fragment and its ones-MMA
// activation sums, then per weight tile one s4 MMA and the affine fold into the int32 block sums.
template <class C>
__device__ inline void compute_stage_s4(const uint8_t* stage, int chunks, int warp_n, int warp_m,
                                        int (&acc)[C::kTilesN][C::kTilesM][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint4* ws = reinterpret_cast<const uint4*>(stage);
  const uint8_t* ps = stage + C::kWBytes;
  const uint8_t* xs = stage + C::kWBytes + C::kPBytes;
  const uint32_t ones[4] = {0x11111111u, 0x11111111u, 0x11111111u, 0x11111111u};  // s4 1s: the sum of x
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c) {
    if (c >= chunks) break;
    uint32_t a[C::kTilesN][4];
    int s_g[C::kTilesN], s_g8[C::kTilesN], c_g[C::kTilesN], c_g8[C::kTilesN];
#pragma unroll
    for (int i = 0; i < C::kTilesN; ++i) {
      const int tile = warp_n * C::kTilesN + i, row = tile * kTileN + g;
      const uint4 wv = ws[(tile * C::kChunks + c) * 32 + lane];
      a[i][0] = wv.x ^ 0x88888888u;  // q - 8 as s4: rows g / g+8, k32 steps 0 / 1
      a[i][1] = wv.y ^ 0x88888888u;
      a[i][2] = wv.z ^ 0x88888888u;
      a[i][3] = wv.w ^ 0x88888888u;
      const uint8_t* pc = ps + c * 2 * C::kBlockN;
      s_g[i] = pc[row];
      s_g8[i] = pc[row + 8];
      c_g[i] = 8 * s_g[i] + pc[C::kBlockN + row] - 128;
      c_g8[i] = 8 * s_g8[i] + pc[C::kBlockN + row + 8] - 128;
    }
#pragma unroll
    for (int j = 0; j < C::kTilesM; ++j) {
      const int r = (warp_m * C::kTilesM + j) * 8 + g;
      const uint8_t* xrow = xs + (c * C::kBlockM + r) * kChunkK + 4 * t;
      uint32_t b[2];
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const uint32_t lo = *reinterpret_cast<const uint32_t*>(xrow + 16 * ((2 * step) ^ w4a8::x_swizzle(r)));
        const uint32_t hi = *reinterpret_cast<const uint32_t*>(xrow + 16 * ((2 * step + 1) ^ w4a8::x_swizzle(r)));
        b[step] = s4_pair(lo, hi);
      }
      int xsum[4] = {0, 0, 0, 0};  // [0] / [1]: sum of the chunk's codes of tokens 2t / 2t+1 (every row alike)
      mma_s4_16864(xsum, ones, b[0], b[1]);
#pragma unroll
      for (int i = 0; i < C::kTilesN; ++i) {
        int d[4] = {0, 0, 0, 0};
        mma_s4_16864(d, a[i], b[0], b[1]);
        acc[i][j][0] += s_g[i] * d[0] + c_g[i] * xsum[0];
        acc[i][j][1] += s_g[i] * d[1] + c_g[i] * xsum[1];
        acc[i][j][2] += s_g8[i] * d[2] + c_g8[i] * xsum[0];
        acc[i][j][3] += s_g8[i] * d[3] + c_g8[i] * xsum[1];
      }
    }
  }
}

template <class C>
__device__ inline int token_of(int warp_m, int j, int t, int c) {
  return (warp_m * C::kTilesM + j) * 8 + 2 * t + (c & 1);
}
template <class C>
__device__ inline int col_of(int warp_n, int i, int g, int c) {
  return (warp_n * C::kTilesN + i) * kTileN + g + (c >> 1) * 8;
}

// |v| < 2^22 as an exact float without I2F (gemm_fmpq_sm80.cu measured I2F as the flush's cost).
__device__ inline float exact_float(int v) { return __int_as_float(0x4B400000 + v) - 12582912.f; }

// The end of block `blk`: its int32 sums scaled by the token's block scale into facc (raw: written out), reset.
template <class C>
__device__ inline void flush_block(const S4Args& p, const uint8_t* stage, int blk, int m0, int n0, int warp_n,
                                   int warp_m, int (&acc)[C::kTilesN][C::kTilesM][4],
                                   float (&facc)[C::kTilesN][C::kTilesM][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* sx = reinterpret_cast<const float*>(stage + C::kWBytes + C::kPBytes + C::kXBytes);
#pragma unroll
  for (int j = 0; j < C::kTilesM; ++j) {
    const int tl = token_of<C>(warp_m, j, t, 0);
    const float s0 = p.out == Out::raw ? 0.f : sx[tl], s1 = p.out == Out::raw ? 0.f : sx[tl + 1];
#pragma unroll
    for (int i = 0; i < C::kTilesN; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (p.out == Out::raw) {
          const int token = m0 + token_of<C>(warp_m, j, t, c), col = n0 + col_of<C>(warp_n, i, g, c);
          if (token < p.m && col < p.n)
            static_cast<int32_t*>(p.y)[(static_cast<int64_t>(token) * p.blocks + blk) * p.n + col] = acc[i][j][c];
        } else {
          facc[i][j][c] = fmaf(exact_float(acc[i][j][c]), (c & 1) ? s1 : s0, facc[i][j][c]);
        }
        acc[i][j][c] = 0;
      }
  }
}

__device__ inline void store_scaled(const S4Args& p, int token, int col, float v) {
  const float y = v * p.channel_scale[col];
  if (p.out == Out::f32)
    static_cast<float*>(p.y)[token * p.ldy + col] = y;
  else
    static_cast<__half*>(p.y)[token * p.ldy + col] = __float2half_rn(y);
}

// Whether block b is int8: unrolled selects, since indexing the parameter array with a variable makes a local copy.
__device__ inline bool is_int8(const S4Args& p, int b) {
  uint32_t word = 0;
#pragma unroll
  for (int w = 0; w < kFmpqMaxBlocks / 32; ++w) word = (b >> 5) == w ? p.int8_mask[w] : word;
  return (word >> (b & 31)) & 1u;
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) gemm_fmpq_s4_kernel(S4Args p) {
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp_n = warp % C::kWarpsN, warp_m = warp / C::kWarpsN;
  const int m0 = blockIdx.x * C::kBlockM, n0 = blockIdx.y * C::kBlockN;
  const int k_chunks = p.k / kChunkK;
  const int kc_begin = blockIdx.z * p.chunks_per_split;  // even: splits own whole blocks
  const int kc_end = min(kc_begin + p.chunks_per_split, k_chunks);
  const int iters = kc_end > kc_begin ? (kc_end - kc_begin + C::kChunks - 1) / C::kChunks : 0;
  const bool active = n0 + warp_n * C::kTilesN * kTileN < p.n && m0 + warp_m * C::kTilesM * 8 < p.m;
  if (p.pdl) pdl_wait_for_producers();

  int acc[C::kTilesN][C::kTilesM][4] = {};
  float facc[C::kTilesN][C::kTilesM][4] = {};
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < iters) load_stage<C>(p, smem + s * C::kStageBytes, kc_begin + s * C::kChunks, kc_end, n0, m0);
    cp_async_commit();
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    const int next = it + C::kStages - 1;
    if (next < iters)
      load_stage<C>(p, smem + (next % C::kStages) * C::kStageBytes, kc_begin + next * C::kChunks, kc_end, n0, m0);
    cp_async_commit();
    const int kc0 = kc_begin + it * C::kChunks, blk = kc0 / 2;
    const uint8_t* stage = smem + (it % C::kStages) * C::kStageBytes;
    if (active) {
      // The block map is uniform over the CTA: one stream or the other, no divergence.
      if (is_int8(p, blk))
        w4a8::compute_stage<C>(stage, kc_end - kc0, warp_n, warp_m, acc);
      else
        compute_stage_s4<C>(stage, kc_end - kc0, warp_n, warp_m, acc);
      flush_block<C>(p, stage, blk, m0, n0, warp_n, warp_m, acc, facc);
    }
  }
  cp_async_wait<0>();
  if (p.out == Out::raw) return;

#pragma unroll
  for (int i = 0; i < C::kTilesN; ++i)
#pragma unroll
    for (int j = 0; j < C::kTilesM; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int token = m0 + token_of<C>(warp_m, j, t, c), col = n0 + col_of<C>(warp_n, i, g, c);
        if (token >= p.m || col >= p.n) continue;
        if (gridDim.z == 1)
          store_scaled(p, token, col, facc[i][j][c]);
        else
          p.partial[(static_cast<int64_t>(blockIdx.z) * p.m + token) * p.n + col] = facc[i][j][c];
      }
}

// The f32 split-K partials summed in split order, times the channel scale.
__global__ void sum_partials_s4_kernel(S4Args p, int split) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.m) * p.n) return;
  float s = 0.f;
  for (int z = 0; z < split; ++z) s += p.partial[z * static_cast<int64_t>(p.m) * p.n + i];
  store_scaled(p, static_cast<int>(i / p.n), static_cast<int>(i % p.n), s);
}

// Shapes by token count (see the header comment for where they differ from gemm_fmpq_sm80.cu's).
using CfgM8 = Cfg<8, 1, 1, 1, 4, 3>;
using CfgM16 = Cfg<8, 1, 1, 2, 4, 3>;
using CfgM32 = Cfg<8, 1, 1, 4, 4, 2>;
using CfgM64 = Cfg<4, 2, 1, 4, 4, 2>;
using CfgLarge = Cfg<4, 2, 2, 4, 4, 1>;

enum class Shape { m8, m16, m32, m64, large };
Shape shape_for(int64_t m) {
  return m <= 8 ? Shape::m8 : m <= 16 ? Shape::m16 : m <= 32 ? Shape::m32 : m <= 64 ? Shape::m64 : Shape::large;
}

struct ShapeInfo {
  int block_n, block_m, blocks_per_sm;
};

template <class C>
ShapeInfo prepare(int device) {
  static std::mutex mu;
  static std::vector<int> cache;  // blocks per SM, 0 = not yet prepared
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    const char* op = "gemm_fmpq_s4";
    int previous = 0;
    LOWBIT_CUDA_CHECK(op, cudaGetDevice(&previous));
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(gemm_fmpq_s4_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               C::kSmemBytes));
    int blocks = 0;
    LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemm_fmpq_s4_kernel<C>, C::kThreads,
                                                                        C::kSmemBytes));
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(previous));
    LOWBIT_CHECK(blocks > 0, op, ": the kernel for this token count does not fit on device ", device);
    cache[device] = blocks;
  }
  return {C::kBlockN, C::kBlockM, cache[device]};
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
void launch(const S4Args& p, int split, cudaStream_t stream) {
  const dim3 grid((p.m + C::kBlockM - 1) / C::kBlockM, (p.n + C::kBlockN - 1) / C::kBlockN, split);
  launch_maybe_pdl("gemm_fmpq_s4", p.pdl, gemm_fmpq_s4_kernel<C>, grid, dim3(C::kThreads), C::kSmemBytes, stream, p);
}

// gemm_fmpq_sm80.cu's split-K rule: fill one wave when the tiles alone do not, >= 2 blocks per split.
int pick_split(int64_t m, int64_t n, int64_t k, int device) {
  const ShapeInfo info = prepare(shape_for(m), device);
  const int64_t blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  const int64_t tiles = ((n + info.block_n - 1) / info.block_n) * ((m + info.block_m - 1) / info.block_m);
  const int64_t slots = static_cast<int64_t>(info.blocks_per_sm) * multiprocessor_count(device);
  int64_t split = std::max<int64_t>(1, slots / std::max<int64_t>(tiles, 1));
  split = std::min<int64_t>(split, std::max<int64_t>(1, k / (16 * std::max<int64_t>(m, 1))));
  split = std::min<int64_t>(split, std::max<int64_t>(1, blocks / 2));
  return static_cast<int>(std::min<int64_t>(split, 64));
}

}  // namespace

void gemm_fmpq_s4_sm80(const FmpqProblem& q, const uint32_t* int8_mask, bool raw, int split_k, bool pdl,
                       cudaStream_t stream) {
  const char* op = "gemm_fmpq_s4";
  int dev = 0;
  LOWBIT_CUDA_CHECK(op, cudaGetDevice(&dev));
  const Shape shape = shape_for(q.m);
  prepare(shape, dev);
  int split = split_k > 0 ? std::min(split_k, q.blocks) : pick_split(q.m, q.n, q.k, dev);
  const int per_blocks = (q.blocks + split - 1) / split;
  split = (q.blocks + per_blocks - 1) / per_blocks;
  LOWBIT_CHECK(split <= 65535, op, ": split_k too large");
  Tensor partial;
  if (split > 1 && !raw)
    partial = Tensor::empty({static_cast<int64_t>(split) * q.m * q.n}, ScalarType::f32, Device::cuda(dev));
  S4Args p{q.x, q.ldx, raw ? nullptr : q.x_scale, q.w, q.steps, q.offsets, q.channel_scale, q.y, raw ? 0 : q.ldy,
           partial.defined() ? partial.data<float>() : nullptr, q.m, q.n, q.k, q.blocks, q.group, q.npad,
           2 * per_blocks, raw ? Out::raw : q.f32_out ? Out::f32 : Out::f16, pdl, {}};
  std::copy(int8_mask, int8_mask + kFmpqMaxBlocks / 32, p.int8_mask);
  switch (shape) {
    case Shape::m8: launch<CfgM8>(p, split, stream); break;
    case Shape::m16: launch<CfgM16>(p, split, stream); break;
    case Shape::m32: launch<CfgM32>(p, split, stream); break;
    case Shape::m64: launch<CfgM64>(p, split, stream); break;
    default: launch<CfgLarge>(p, split, stream); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (split > 1 && !raw) {
    const int64_t total = static_cast<int64_t>(q.m) * q.n;
    sum_partials_s4_kernel<<<(total + 255) / 256, 256, 0, stream>>>(p, split);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda::detail
