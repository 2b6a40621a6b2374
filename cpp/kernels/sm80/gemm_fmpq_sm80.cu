// COMET W4Ax GEMM over FMPQ activations (activation.h: s8 codes, int4 blocks holding [-7, 7], one f32
// scale per token and 128-channel block) for the sm80 family (mma.sync m16n8k32 s8 x s8 -> s32, sm_80
// and newer, so it also runs on the H100) over the qoq/liquid weights packed by pack_sm80_w4a8.
//
// The pipeline is gemm_w4a8_sm80.cu's (Yᵀ = W · Xᵀ, the weight dequantized in registers straight into
// the A fragment, (q*s + a) ^ 0x80 per byte; a multi-stage cp.async ring; split-K across blocks), with
// one change that COMET's per-block activation scales force: a stage is exactly one 128-channel block
// (two 64-k chunks), the block's int32 sums are exact, and at the stage's end each is flushed into an f32
// accumulator with its token's block scale (cp.async'd with the stage), then reset. Every block, int4
// or int8, runs on the s8 tensor cores: on sm_90 there are no fast s4 ones (this is COMET's int4 blocks
// widened to s8). With kS4 (Ampere/Ada, the registry's gemm_fmpq_s4_sm80) the int4 blocks run on the s4 m16n8k64
// stream of fmpq_s4_stream_sm80.cuh instead, the same pipeline otherwise.
// The channel scale applies once at the end; split-K partials are f32 (each split owns whole blocks).
#include <cuda_fp16.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cuda/pdl.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/quant/activation.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm80/w4a8_common_sm80.cuh"
#include "kernels/sm80/fmpq_s4_stream_sm80.cuh"
#include "kernels/sm80/gemm_w4a8_gemv_sm80.h"
#include "kernels/sm90/gemm_fmpq_sm90.h"

namespace lowbit::cuda {
namespace {

using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::kChunkBytes;
using w4a16::kChunkK;
using w4a16::kTileN;
using w4a8::compute_stage;
static_assert(kFmpqBlock == 2 * kChunkK, "a stage of two packed chunks is one FMPQ block");

enum class Out : uint8_t { f16, f32, raw };

struct FmpqArgs {
  const int8_t* x;  // s8 [m, k], row stride ldx
  int64_t ldx;
  const float* x_scale;  // [m, blocks]; unused for raw output
  const uint8_t* w;      // packed tiles
  const uint8_t* steps;  // [G, npad]
  const uint8_t* offsets;
  const float* channel_scale;  // [npad]
  void* y;                     // f16 / f32 [m, ldy], or s32 [m, blocks, n]
  int64_t ldy;
  float* partial;  // [split, m, n] when split > 1 (scaled outputs)
  int m, n, k, blocks, group, npad, chunks_per_split;
  Out out;
  bool pdl;
};
// The s4 kernels' arguments: the block map besides (a derived struct, so that the s8 kernels' parameters, and with
// them their code, stay as they were).
struct FmpqS4Args : FmpqArgs {
  uint32_t int8_mask[kFmpqMaxBlocks / 32];  // bit b set = block b is int8 (the others run on the s4 stream)
};
template <bool kS4>
using KernelArgs = std::conditional_t<kS4, FmpqS4Args, FmpqArgs>;

// kWarpsN x kWarpsM warps, each owning kTilesN 16-row weight tiles x kTilesM 8-token tiles; a stage is
// two 64-k chunks (one FMPQ block), kStages stages.
template <int kWarpsN_, int kWarpsM_, int kTilesN_, int kTilesM_, int kStages_, int kMinBlocks_>
struct Cfg {
  static constexpr int kWarpsN = kWarpsN_, kWarpsM = kWarpsM_, kTilesN = kTilesN_, kTilesM = kTilesM_;
  static constexpr int kChunks = 2, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsM;
  static constexpr int kBlockN = kTileN * kTilesN * kWarpsN, kBlockM = 8 * kTilesM * kWarpsM;
  static constexpr int kBlockTiles = kBlockN / kTileN;
  static constexpr int kWBytes = kBlockTiles * kChunks * kChunkBytes;
  static constexpr int kPBytes = kChunks * 2 * kBlockN;  // [chunk][step | offset][kBlockN] u8
  static constexpr int kXBytes = kChunks * kBlockM * kChunkK;  // [chunk][token][64], swizzled units
  static constexpr int kSBytes = (kBlockM * 4 + 15) / 16 * 16;  // the block's scale per token, f32
  static constexpr int kStageBytes = kWBytes + kPBytes + kXBytes + kSBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kBlockN % 16 == 0, "parameter rows are copied in 16-byte units");
};

__device__ inline void cp_async4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem));
}

// One stage: the operands of chunks [kc0, kc0 + 2) as gemm_w4a8_sm80.cu loads them, then the block scale of
// each token after the activation rows (kc0 is even: the stage is FMPQ block kc0 / 2).
template <class C>
__device__ inline void load_stage(const FmpqArgs& p, uint8_t* stage, int kc0, int kc_end, int n0, int m0) {
  w4a8::load_operands<C>(p, stage, kc0, kc_end, n0, m0);
  if (p.out != Out::raw) {
    float* s_base = reinterpret_cast<float*>(stage + C::kWBytes + C::kPBytes + C::kXBytes);
    for (int r = threadIdx.x; r < C::kBlockM; r += C::kThreads)
      if (m0 + r < p.m) cp_async4(s_base + r, p.x_scale + static_cast<int64_t>(m0 + r) * p.blocks + kc0 / 2);
  }
}

// acc[i][j]: c0,c1 = weight row g, tokens 2t, 2t+1; c2,c3 = weight row g+8, same tokens.
template <class C>
__device__ inline int token_of(int warp_m, int j, int t, int c) {
  return (warp_m * C::kTilesM + j) * 8 + 2 * t + (c & 1);
}
template <class C>
__device__ inline int col_of(int warp_n, int i, int g, int c) {
  return (warp_n * C::kTilesN + i) * kTileN + g + (c >> 1) * 8;
}

// An int32 |v| < 2^22 as an exact float without I2F (a quarter-rate conversion that measured as the
// flush's cost): the bits of 1.5 * 2^23 + v, minus 1.5 * 2^23. A block's |sum| <= 128 * 127 * 128 < 2^21.
__device__ inline float exact_float(int v) { return __int_as_float(0x4B400000 + v) - 12582912.f; }

// The end of block `blk`: its exact int32 sums are scaled by the token's block scale into facc (or,
// raw, written out as they are), then reset for the next block.
template <class C>
__device__ inline void flush_block(const FmpqArgs& p, const uint8_t* stage, int blk, int m0, int n0, int warp_n,
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

__device__ inline void store_scaled(const FmpqArgs& p, int token, int col, float v) {
  const float y = v * p.channel_scale[col];
  if (p.out == Out::f32)
    static_cast<float*>(p.y)[token * p.ldy + col] = y;
  else
    static_cast<__half*>(p.y)[token * p.ldy + col] = __float2half_rn(y);
}

// Whether block b is int8: unrolled selects, since indexing the parameter array with a variable makes a local copy.
__device__ inline bool is_int8(const FmpqS4Args& p, int b) {
  uint32_t word = 0;
#pragma unroll
  for (int w = 0; w < kFmpqMaxBlocks / 32; ++w) word = (b >> 5) == w ? p.int8_mask[w] : word;
  return (word >> (b & 31)) & 1u;
}

// kS4: int4 blocks on the s4 stream, int8 blocks on the s8 one; otherwise every block on the s8 stream.
template <class C, bool kS4>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) gemm_fmpq_kernel(KernelArgs<kS4> p) {
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
  if (p.pdl) pdl_wait_for_producers();  // x and its scales come from the kernel before (cuda/pdl.cuh)

  int acc[C::kTilesN][C::kTilesM][4] = {};
  float facc[C::kTilesN][C::kTilesM][4] = {};
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < iters) load_stage<C>(p, smem + s * C::kStageBytes, kc_begin + s * C::kChunks, kc_end, n0, m0);
    cp_async_commit();  // one group per stage, empty or not, so the wait count below is uniform
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    const int next = it + C::kStages - 1;
    if (next < iters)
      load_stage<C>(p, smem + (next % C::kStages) * C::kStageBytes, kc_begin + next * C::kChunks, kc_end, n0, m0);
    cp_async_commit();
    const int kc0 = kc_begin + it * C::kChunks;
    const uint8_t* stage = smem + (it % C::kStages) * C::kStageBytes;
    if (active) {
      if constexpr (kS4) {  // the block map is uniform over the CTA: one stream or the other, no divergence
        if (is_int8(p, kc0 / 2))
          compute_stage<C>(stage, kc_end - kc0, warp_n, warp_m, acc);
        else
          fmpq_s4::compute_stage_s4<C>(stage, kc_end - kc0, warp_n, warp_m, acc);
      } else {
        compute_stage<C>(stage, kc_end - kc0, warp_n, warp_m, acc);
      }
      flush_block<C>(p, stage, kc0 / 2, m0, n0, warp_n, warp_m, acc, facc);
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

// Sums the f32 split-K partials in split order and applies the channel scale.
__global__ void sum_partials_kernel(FmpqArgs p, int split) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.m) * p.n) return;
  float s = 0.f;
  for (int z = 0; z < split; ++z) s += p.partial[z * static_cast<int64_t>(p.m) * p.n + i];
  store_scaled(p, static_cast<int>(i / p.n), static_cast<int>(i % p.n), s);
}

// Shapes by token count, gemm_w4a8_sm80.cu's: decode 8 warps x one 16-row weight tile (128 rows per
// block), up to 64 tokens up to 8 token tiles per warp, beyond 128 x 128 blocks of 2 x 8 tiles per warp.
// The s4 kernels (kS4) hold more registers: 3 blocks per SM at <= 8 tokens (4 spilled on sm_90a) and 64-token
// tiles from 33 tokens on (the 128-token tile spilled on sm_80).
template <bool kS4>
struct FmpqShapes {
  using M8 = Cfg<8, 1, 1, 1, 4, kS4 ? 3 : 4>;
  using M16 = Cfg<8, 1, 1, 2, 4, 3>;  // 3 blocks: 64 registers spill (the f32 block sums)
  using M32 = Cfg<8, 1, 1, 4, 4, 2>;
  using M64 = std::conditional_t<kS4, Cfg<4, 2, 1, 4, 4, 2>, Cfg<8, 1, 1, 8, 4, 2>>;
  using Large = Cfg<4, 2, 2, kS4 ? 4 : 8, 4, 1>;
};

enum class Shape { m8, m16, m32, m64, large };
Shape shape_for(int64_t m) {
  return m <= 8 ? Shape::m8 : m <= 16 ? Shape::m16 : m <= 32 ? Shape::m32 : m <= 64 ? Shape::m64 : Shape::large;
}

struct ShapeInfo {
  int block_n, block_m, blocks_per_sm;
};

// Raises the kernel's dynamic shared-memory limit (once per device) and reports its occupancy.
template <class C, bool kS4>
ShapeInfo prepare(int device) {
  static std::mutex mu;
  static std::vector<int> cache;  // blocks per SM, 0 = not yet prepared
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    const char* op = "gemm_fmpq";
    int previous = 0;
    LOWBIT_CUDA_CHECK(op, cudaGetDevice(&previous));
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(gemm_fmpq_kernel<C, kS4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               C::kSmemBytes));
    int blocks = 0;
    LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemm_fmpq_kernel<C, kS4>,
                                                                        C::kThreads, C::kSmemBytes));
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(previous));
    LOWBIT_CHECK(blocks > 0, op, ": the kernel for this token count does not fit on device ", device);
    cache[device] = blocks;
  }
  return {C::kBlockN, C::kBlockM, cache[device]};
}

template <bool kS4>
ShapeInfo prepare(Shape s, int device) {
  using S = FmpqShapes<kS4>;
  switch (s) {
    case Shape::m8: return prepare<typename S::M8, kS4>(device);
    case Shape::m16: return prepare<typename S::M16, kS4>(device);
    case Shape::m32: return prepare<typename S::M32, kS4>(device);
    case Shape::m64: return prepare<typename S::M64, kS4>(device);
    default: return prepare<typename S::Large, kS4>(device);
  }
}

template <class C, bool kS4>
void launch(const KernelArgs<kS4>& p, int split, cudaStream_t stream) {
  const dim3 grid((p.m + C::kBlockM - 1) / C::kBlockM, (p.n + C::kBlockN - 1) / C::kBlockN, split);
  launch_maybe_pdl("gemm_fmpq", p.pdl, gemm_fmpq_kernel<C, kS4>, grid, dim3(C::kThreads), C::kSmemBytes, stream, p);
}

template <bool kS4>
void launch(Shape s, const KernelArgs<kS4>& p, int split, cudaStream_t stream) {
  using S = FmpqShapes<kS4>;
  switch (s) {
    case Shape::m8: return launch<typename S::M8, kS4>(p, split, stream);
    case Shape::m16: return launch<typename S::M16, kS4>(p, split, stream);
    case Shape::m32: return launch<typename S::M32, kS4>(p, split, stream);
    case Shape::m64: return launch<typename S::M64, kS4>(p, split, stream);
    default: return launch<typename S::Large, kS4>(p, split, stream);
  }
}

// Split-K over whole FMPQ blocks, as gemm_w4a8_pick_split splits chunks: fill one wave of resident
// blocks when the (n, m) tiles alone do not, >= 2 blocks per split, partials below the weight bytes.
template <bool kS4>
int pick_split(int64_t m, int64_t n, int64_t k, int device) {
  const ShapeInfo info = prepare<kS4>(shape_for(m), device);
  const int64_t blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  const int64_t tiles = ((n + info.block_n - 1) / info.block_n) * ((m + info.block_m - 1) / info.block_m);
  const int64_t slots = static_cast<int64_t>(info.blocks_per_sm) * multiprocessor_count(device);
  int64_t split = std::max<int64_t>(1, slots / std::max<int64_t>(tiles, 1));
  split = std::min<int64_t>(split, std::max<int64_t>(1, k / (16 * std::max<int64_t>(m, 1))));
  split = std::min<int64_t>(split, std::max<int64_t>(1, blocks / 2));
  return static_cast<int>(std::min<int64_t>(split, 64));
}

}  // namespace

void gemm_fmpq(const Tensor& xq, const Tensor& x_scale, const PackedWeight& w, Tensor& y, cudaStream_t stream,
               int split_k, FmpqKernel kernel, const Tensor& block_bits) {
  const char* op = "gemm_fmpq";
  LOWBIT_CHECK((w.format == WeightFormat::qoq || w.format == WeightFormat::liquid) && w.target == PackTarget::sm80,
               op, ": argument 'w' must be a qoq or liquid weight packed for sm80 (pack_sm80), got ",
               name_of(w.format), " for ", name_of(w.target));
  check_cuda_tensor(xq, op, "xq");
  check_dtype(xq, ScalarType::s8, op, "xq");
  check_dim(xq, 2, op, "xq");
  const int64_t m = xq.size(0), n = w.n, k = w.k, blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  LOWBIT_CHECK(xq.size(1) == k, op, ": argument 'xq' has ", xq.size(1), " features but the weight expects k=", k);
  LOWBIT_CHECK(xq.stride(1) == 1 && xq.stride(0) % 16 == 0 && reinterpret_cast<uintptr_t>(xq.data_ptr()) % 16 == 0,
               op, ": argument 'xq' needs unit stride in the last dim, a row stride divisible by 16 and a 16-byte "
               "aligned start, got strides ", shape_str(xq.strides()));
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, k % kChunkK == 0 && w.group % kChunkK == 0, op,
                    ": the packed weight needs k and group multiples of ", kChunkK, ", got k=", k, " group=", w.group);
  const int64_t groups = (k + w.group - 1) / w.group, npad = (n + kTileN - 1) / kTileN * kTileN;
  check_shape(w.data, {(n + kTileN - 1) / kTileN, (k / kChunkK) * kChunkBytes}, op, "w.data");
  check_shape(w.scales, {groups, npad}, op, "w.scales");
  check_shape(w.zeros, {groups, npad}, op, "w.zeros");
  check_shape(w.channel_scales, {npad}, op, "w.channel_scales");
  check_dtype(w.scales, ScalarType::u8, op, "w.scales");
  check_dtype(w.zeros, ScalarType::u8, op, "w.zeros");
  check_dtype(w.channel_scales, ScalarType::f32, op, "w.channel_scales");
  for (const Tensor* t : {&w.data, &w.scales, &w.zeros, &w.channel_scales}) {
    check_same_device(*t, xq, op, "w");
    LOWBIT_CHECK(t->is_contiguous() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, op,
                 ": the packed weight's data, scales, zeros and channel_scales must be contiguous with 16-byte "
                 "aligned starts");
  }
  check_same_device(y, xq, op, "y");
  const Out out = y.dtype() == ScalarType::s32 ? Out::raw : y.dtype() == ScalarType::f32 ? Out::f32 : Out::f16;
  LOWBIT_CHECK_KIND(ErrorKind::kType, out != Out::f16 || y.dtype() == ScalarType::f16, op,
                    ": argument 'y' must be f16 or f32 (scaled) or s32 [m, blocks, n] (raw per-block accumulators), "
                    "got ", name_of(y.dtype()));
  if (out == Out::raw) {
    check_shape(y, {m, blocks, n}, op, "y");
    check_contiguous(y, op, "y");
  } else {
    check_shape(y, {m, n}, op, "y");
    LOWBIT_CHECK(y.stride(1) == 1 || n <= 1, op, ": argument 'y' needs unit stride in the last dim");
    check_defined(x_scale, op, "x_scale");
    check_same_device(x_scale, xq, op, "x_scale");
    check_dtype(x_scale, ScalarType::f32, op, "x_scale");
    check_shape(x_scale, {m, blocks}, op, "x_scale");
    check_contiguous(x_scale, op, "x_scale");
  }
  LOWBIT_CHECK(m <= (1LL << 30) && n * k < (1LL << 40) && n <= (1LL << 22) && m * blocks * n < (1LL << 40), op,
               ": problem too large");
  LOWBIT_CHECK(split_k >= 0, op, ": split_k must be >= 0 (0 = automatic), got ", split_k);
  if (m == 0 || n == 0) return;

  const int dev = xq.device().index;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(dev));
  // Ampere/Ada's int4 tensor cores (the kS4 kernels) when the block map is known: by default on sm_80/86/87/89,
  // forced anywhere (sm_90 runs it slowly).
  bool s4 = kernel == FmpqKernel::sm80_s4;
  if (kernel == FmpqKernel::automatic && block_bits.defined()) {
    int major = 0, minor = 0;
    LOWBIT_CUDA_CHECK(op, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOWBIT_CUDA_CHECK(op, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const int cc = 10 * major + minor;
    s4 = cc == 80 || cc == 86 || cc == 87 || cc == 89;
  }
  FmpqBits bits{};
  if (s4) {
    LOWBIT_CHECK(block_bits.defined(), op, ": the s4 kernel needs the block map (block_bits)");
    bits = fmpq_bits_of(block_bits, op);
    LOWBIT_CHECK(block_bits.size(0) == blocks, op, ": argument 'block_bits' has ", block_bits.size(0),
                 " blocks, k=", k, " has ", blocks);
  }
  // The register-direct GEMV (gemm_w4a8_gemv_sm80.cu's FMPQ form) when named, and where it pays on sm_90 (one token;
  // 2-4 tokens but on down-like layers: fmpq_gemv_pays, which the registry's rank reads too) when the
  // caller pins no split; its width follows the shape unless named ('gemv1' / 'gemvw').
  const bool gemv_named =
      kernel == FmpqKernel::gemv || kernel == FmpqKernel::gemv_one_tile || kernel == FmpqKernel::gemv_wide;
  if (gemv_named || (kernel == FmpqKernel::automatic && !s4 && out != Out::raw && split_k == 0 &&
                     detail::fmpq_gemv_pays(m, n, k) && compute_capability_major(dev) == 9)) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, out != Out::raw, op,
                      ": the gemv kernel writes scaled f16/f32 rows only (raw per-block sums: kernel sm80)");
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, m <= detail::kGemv8MaxTokens, op, ": the gemv kernel takes 1-",
                      detail::kGemv8MaxTokens, " tokens, got m=", m, "; name 'sm80' instead");
    LOWBIT_CHECK(split_k == 0, op, ": the gemv kernel picks its own k split (split_k must be 0), got ", split_k);
    const bool wide = kernel == FmpqKernel::gemv_wide ||
                      (kernel != FmpqKernel::gemv_one_tile && detail::gemv8_wide_pays(m, n, k));
    const detail::Gemv8Plan plan = detail::gemm_w4a8_gemv_plan(
        static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 0, 0, wide, multiprocessor_count(dev),
        /*fmpq=*/true);
    Tensor partial;
    if (plan.split > 1) partial = Tensor::empty({plan.split * m * n}, ScalarType::f32, xq.device());
    const detail::FmpqProblem problem{xq.data<int8_t>(), xq.stride(0), x_scale.data<float>(), w.data.data<uint8_t>(),
                                      w.scales.data<uint8_t>(), w.zeros.data<uint8_t>(), w.channel_scales.data<float>(),
                                      y.data_ptr(), y.stride(0), static_cast<int>(m), static_cast<int>(n),
                                      static_cast<int>(k), static_cast<int>(blocks), w.group, static_cast<int>(npad),
                                      out == Out::f32};
    detail::gemm_fmpq_gemv(problem, partial.defined() ? partial.data<float>() : nullptr, plan, pdl_supported(dev),
                           stream);
    return;
  }
  // The wgmma kernel from 128 tokens on (its tile); below, the mma.sync kernel's small tiles and split-K.
  const bool sm90 = !s4 && (kernel == FmpqKernel::sm90 || kernel == FmpqKernel::sm90_serial ||
                            (kernel == FmpqKernel::automatic && m >= 128 && out != Out::raw &&
                             detail::gemm_fmpq_sm90_usable(dev)));
  if (sm90) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, detail::gemm_fmpq_sm90_usable(dev), op,
                      ": the sm90 kernel needs an sm_90 device and a library built with sm_90a kernels (device ", dev,
                      ")");
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, out != Out::raw, op,
                      ": the sm90 kernel writes scaled f16/f32 rows only (raw per-block sums: kernel sm80)");
    const detail::FmpqProblem problem{xq.data<int8_t>(), xq.stride(0), x_scale.data<float>(), w.data.data<uint8_t>(),
                                      w.scales.data<uint8_t>(), w.zeros.data<uint8_t>(), w.channel_scales.data<float>(),
                                      y.data_ptr(), y.stride(0), static_cast<int>(m), static_cast<int>(n),
                                      static_cast<int>(k), static_cast<int>(blocks), w.group, static_cast<int>(npad),
                                      out == Out::f32};
    detail::gemm_fmpq_sm90(problem, split_k, /*overlap=*/kernel != FmpqKernel::sm90_serial, stream);
    return;
  }
  const Shape shape = shape_for(m);
  if (s4) prepare<true>(shape, dev);
  else prepare<false>(shape, dev);
  int split = split_k > 0 ? std::min<int>(split_k, static_cast<int>(blocks))
              : s4        ? pick_split<true>(m, n, k, dev)
                          : pick_split<false>(m, n, k, dev);
  const int per_blocks = static_cast<int>((blocks + split - 1) / split);
  split = static_cast<int>((blocks + per_blocks - 1) / per_blocks);
  LOWBIT_CHECK(split <= 65535, op, ": split_k too large");
  // Raw per-block outputs need no partials: each split writes its own blocks.
  Tensor partial;
  if (split > 1 && out != Out::raw) partial = Tensor::empty({split * m * n}, ScalarType::f32, xq.device());

  FmpqArgs p{xq.data<int8_t>(), xq.stride(0), out == Out::raw ? nullptr : x_scale.data<float>(),
             w.data.data<uint8_t>(), w.scales.data<uint8_t>(), w.zeros.data<uint8_t>(), w.channel_scales.data<float>(),
             y.data_ptr(), out == Out::raw ? 0 : y.stride(0), partial.defined() ? partial.data<float>() : nullptr,
             static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), static_cast<int>(blocks), w.group,
             static_cast<int>(npad), 2 * per_blocks, out, pdl_supported(dev)};
  if (s4) {
    FmpqS4Args p4{p, {}};
    std::copy(std::begin(bits.int8_mask), std::end(bits.int8_mask), p4.int8_mask);
    launch<true>(shape, p4, split, stream);
  } else {
    launch<false>(shape, p, split, stream);
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (split > 1 && out != Out::raw) {
    const int64_t total = m * n;
    sum_partials_kernel<<<(total + 255) / 256, 256, 0, stream>>>(p, split);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda
