// W4A8 GEMM for the sm80 family (mma.sync m16n8k32 s8 x s8 -> s32, sm_80 and newer) over the
// two-level weights of QServe's QoQ and LiquidGEMM's LiquidQuant, packed by pack_sm80_w4a8
// (cpp/quant/pack_sm80_w4a8.cpp documents the layout and why one dequant serves both formats).
//
// Yᵀ = W · Xᵀ as in the W4A16 kernel (gemm_w4a16_sm80.cu, whose pipeline this follows): the weight
// is the A operand (16 rows x 32 k per mma), 8 tokens form B, a block owns kBlockN weight rows x
// kBlockM tokens x a k-range (split-K across blocks), and every operand streams through a
// multi-stage cp.async ring. Dequant happens in registers, straight into the A fragment: four u4
// codes per byte-lane word become four s8 weights with one IMAD and one XOR, (q*s + a) ^ 0x80808080
// (LiquidGEMM §5.1; no byte carries because q*s + a <= 255), and each dequantized fragment feeds all
// of the warp's 8-token tiles. Products and sums stay in int32 for the whole k (exact), so split-K
// partials are int32 too and the per-token x per-channel scales apply once, at the end.
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "cuda/pdl.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"
#include "kernels/sm80/gemm_w4a8_gemv_sm80.h"
#include "lowbit/kernels/desc.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"
#include "kernels/sm80/w4a8_common_sm80.cuh"
#include "kernels/sm90/gemm_w4a8_sm90.h"

namespace lowbit::cuda {
namespace {

using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::kChunkBytes;
using w4a16::kChunkK;
using w4a16::kTileN;
using w4a8::compute_stage;

struct W4A8Args {
  const int8_t* x;  // s8 [m, k], row stride ldx
  int64_t ldx;
  const float* x_scale;  // [m]; unused for raw output
  const uint8_t* w;      // packed tiles
  const uint8_t* steps;  // [G, npad]
  const uint8_t* offsets;
  const float* channel_scale;  // [npad]
  void* y;                     // f16 scaled, or s32 raw accumulators
  int64_t ldy;
  int32_t* partial;  // [split, m, n] when split > 1
  int m, n, k, group, npad, chunks_per_split;
  bool raw, pdl;
};

// Block shape as in gemm_w4a16_sm80.cu: kWarpsN x kWarpsM warps, each owning kTilesN 16-row weight
// tiles x kTilesM 8-token tiles; kChunks 64-k chunks per stage, kStages stages.
template <int kWarpsN_, int kWarpsM_, int kTilesN_, int kTilesM_, int kChunks_, int kStages_, int kMinBlocks_>
struct Cfg {
  static constexpr int kWarpsN = kWarpsN_, kWarpsM = kWarpsM_, kTilesN = kTilesN_, kTilesM = kTilesM_;
  static constexpr int kChunks = kChunks_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsM;
  static constexpr int kBlockN = kTileN * kTilesN * kWarpsN, kBlockM = 8 * kTilesM * kWarpsM;
  static constexpr int kBlockTiles = kBlockN / kTileN;
  static constexpr int kWBytes = kBlockTiles * kChunks * kChunkBytes;
  static constexpr int kPBytes = kChunks * 2 * kBlockN;  // [chunk][step | offset][kBlockN] u8
  // Activations chunk-major, [chunk][token][64 bytes], the 16-byte units of token r's row stored in
  // order q ^ w4a8::x_swizzle(r) (w4a8_common_sm80.cuh).
  static constexpr int kXBytes = kChunks * kBlockM * kChunkK;
  static constexpr int kStageBytes = kWBytes + kPBytes + kXBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kBlockN % 16 == 0, "parameter rows are copied in 16-byte units");
};

__device__ inline void store_output(const W4A8Args& p, int token, int col, int v) {
  if (p.raw)
    static_cast<int32_t*>(p.y)[token * p.ldy + col] = v;
  else
    static_cast<__half*>(p.y)[token * p.ldy + col] =
        __float2half_rn(static_cast<float>(v) * p.x_scale[token] * p.channel_scale[col]);
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) gemm_w4a8_kernel(W4A8Args p) {
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp_n = warp % C::kWarpsN, warp_m = warp / C::kWarpsN;
  const int m0 = blockIdx.x * C::kBlockM, n0 = blockIdx.y * C::kBlockN;
  const int k_chunks = p.k / kChunkK;
  const int kc_begin = blockIdx.z * p.chunks_per_split;
  const int kc_end = min(kc_begin + p.chunks_per_split, k_chunks);
  const int iters = kc_end > kc_begin ? (kc_end - kc_begin + C::kChunks - 1) / C::kChunks : 0;
  const bool active = n0 + warp_n * C::kTilesN * kTileN < p.n && m0 + warp_m * C::kTilesM * 8 < p.m;
  if (p.pdl) {
    // The packed weights do not depend on the kernel before this one (cuda/pdl.cuh): pull this
    // block's first stages into L2 while it finishes, then wait for x.
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

  int acc[C::kTilesN][C::kTilesM][4] = {};
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < iters) w4a8::load_operands<C>(p, smem + s * C::kStageBytes, kc_begin + s * C::kChunks, kc_end, n0, m0);
    cp_async_commit();  // one group per stage, empty or not, so the wait count below is uniform
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    const int next = it + C::kStages - 1;
    if (next < iters)
      w4a8::load_operands<C>(p, smem + (next % C::kStages) * C::kStageBytes, kc_begin + next * C::kChunks, kc_end,
                             n0, m0);
    cp_async_commit();
    const int kc0 = kc_begin + it * C::kChunks;
    if (active) compute_stage<C>(smem + (it % C::kStages) * C::kStageBytes, kc_end - kc0, warp_n, warp_m, acc);
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
          store_output(p, token, col, acc[i][j][c]);
        else
          p.partial[(static_cast<int64_t>(blockIdx.z) * p.m + token) * p.n + col] = acc[i][j][c];
      }
}

// Sums the int32 split-K partials (exact in any order) and applies the scales.
__global__ void sum_partials_kernel(W4A8Args p, int split) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.m) * p.n) return;
  int s = 0;
  for (int z = 0; z < split; ++z) s += p.partial[z * static_cast<int64_t>(p.m) * p.n + i];
  store_output(p, static_cast<int>(i / p.n), static_cast<int>(i % p.n), s);
}

// Shapes by token count, as the W4A16 kernel's: decode (<= 16 tokens) 8 warps x one 16-row tile,
// 128 weight rows per block, two chunks per stage; up to 64 tokens, up to 8 token tiles per warp;
// more tokens, 128 x 128 blocks of 2 x 8 tiles per warp.
using CfgM8 = Cfg<8, 1, 1, 1, 2, 4, 4>;
using CfgM16 = Cfg<8, 1, 1, 2, 2, 4, 4>;
using CfgM32 = Cfg<8, 1, 1, 4, 2, 4, 2>;
using CfgM64 = Cfg<8, 1, 1, 8, 2, 4, 2>;
using CfgLarge = Cfg<4, 2, 2, 8, 2, 4, 1>;

enum class Shape { m8, m16, m32, m64, large };
Shape shape_for(int64_t m) {
  return m <= 8 ? Shape::m8 : m <= 16 ? Shape::m16 : m <= 32 ? Shape::m32 : m <= 64 ? Shape::m64 : Shape::large;
}

struct ShapeInfo {
  int block_n, block_m, blocks_per_sm;
};

// Raises the kernel's dynamic shared-memory limit (once per device) and reports its occupancy.
template <class C>
ShapeInfo prepare(int device) {
  static std::mutex mu;
  static std::vector<int> cache;  // blocks per SM, 0 = not yet prepared
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    const char* op = "gemm_w4a8";
    int previous = 0;
    LOWBIT_CUDA_CHECK(op, cudaGetDevice(&previous));
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(gemm_w4a8_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               C::kSmemBytes));
    int blocks = 0;
    LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemm_w4a8_kernel<C>, C::kThreads,
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
void launch(const W4A8Args& p, int split, cudaStream_t stream) {
  const dim3 grid((p.m + C::kBlockM - 1) / C::kBlockM, (p.n + C::kBlockN - 1) / C::kBlockN, split);
  launch_maybe_pdl("gemm_w4a8", p.pdl, gemm_w4a8_kernel<C>, grid, dim3(C::kThreads), C::kSmemBytes, stream, p);
}

}  // namespace

// Split-K as the W4A16 kernel picks it: fill one wave of resident blocks when the (n, m) tiles
// alone do not, with at least 4 chunks per split and the int32 partials (8 bytes per split and
// output, written then read) below the weight bytes n*k/2.
int gemm_w4a8_pick_split(int64_t m, int64_t n, int64_t k, int device) {
  const ShapeInfo info = prepare(shape_for(m), device);
  const int64_t k_chunks = k / kChunkK;
  const int64_t tiles = ((n + info.block_n - 1) / info.block_n) * ((m + info.block_m - 1) / info.block_m);
  const int64_t slots = static_cast<int64_t>(info.blocks_per_sm) * multiprocessor_count(device);
  int64_t split = std::max<int64_t>(1, slots / std::max<int64_t>(tiles, 1));
  split = std::min<int64_t>(split, std::max<int64_t>(1, k / (16 * std::max<int64_t>(m, 1))));
  split = std::min<int64_t>(split, std::max<int64_t>(1, k_chunks / 4));
  split = std::min<int64_t>(split, 64);
  const int64_t per = (k_chunks + split - 1) / split;
  return static_cast<int>(std::max<int64_t>(1, (k_chunks + per - 1) / per));
}

// The wgmma kernel's pinned choices from the op's options (by field: Sm90Choice also holds W4A16-only fields).
detail::Sm90Choice sm90_choice_of(const W4A8Options& options) {
  detail::Sm90Choice c;
  c.split = options.sm90_split, c.tokens = options.sm90_tokens, c.serial = options.sm90_serial;
  c.streamk = options.sm90_streamk, c.ctas = options.sm90_ctas, c.no_streamk = options.sm90_no_streamk;
  c.one_producer = options.sm90_one_producer, c.persistent = options.sm90_persistent;
  c.pair = options.sm90_pair;
  c.prefetch = options.sm90_prefetch;
  return c;
}

std::tuple<int, int, int> gemm_w4a8_sm90_plan(int64_t m, int64_t n, int64_t k, int device,
                                              const W4A8Options& options) {
  const char* op = "gemm_w4a8_sm90_plan";
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, detail::gemm_w4a8_sm90_usable(device), op,
                    ": the sm90 kernel needs an sm_90 device and a library built with sm_90a kernels");
  LOWBIT_CHECK(m > 0 && m <= (1LL << 30) && n > 0 && n <= (1LL << 22) && k > 0 && k % 64 == 0, op,
               ": bad shape m=", m, " n=", n, " k=", k);
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
  const detail::Sm90Plan plan = detail::gemm_w4a8_sm90_plan(
      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), sm90_choice_of(options));
  return {plan.tokens, plan.streamk ? 0 : plan.split, plan.head};
}

void gemm_w4a8(const Tensor& xq, const Tensor& x_scale, const PackedWeight& w, Tensor& y, cudaStream_t stream,
               const W4A8Options& options) {
  const char* op = "gemm_w4a8";
  LOWBIT_CHECK((w.format == WeightFormat::qoq || w.format == WeightFormat::liquid) && w.target == PackTarget::sm80,
               op, ": argument 'w' must be a qoq or liquid weight packed for sm80 (pack_sm80), got ",
               name_of(w.format), " for ", name_of(w.target));
  check_cuda_tensor(xq, op, "xq");
  check_dtype(xq, ScalarType::s8, op, "xq");
  check_dim(xq, 2, op, "xq");
  const int64_t m = xq.size(0), n = w.n, k = w.k;
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
  const bool raw = y.dtype() == ScalarType::s32;
  LOWBIT_CHECK_KIND(ErrorKind::kType, raw || y.dtype() == ScalarType::f16, op,
                    ": argument 'y' must be f16 (scaled) or s32 (raw accumulators), got ", name_of(y.dtype()));
  check_shape(y, {m, n}, op, "y");
  LOWBIT_CHECK(y.stride(1) == 1, op, ": argument 'y' needs unit stride in the last dim");
  if (!raw) {
    check_defined(x_scale, op, "x_scale");
    check_same_device(x_scale, xq, op, "x_scale");
    check_dtype(x_scale, ScalarType::f32, op, "x_scale");
    check_shape(x_scale, {m}, op, "x_scale");
    check_contiguous(x_scale, op, "x_scale");
  }
  LOWBIT_CHECK(m <= (1LL << 30) && n * k < (1LL << 40) && n <= (1LL << 22), op, ": problem too large");
  if (m == 0 || n == 0) return;

  const int dev = xq.device().index;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(dev));
  // The register-direct GEMV when named (1-16 tokens), and at 1-4 tokens (the registry's m1 and m2-4 buckets) on sm_90
  // when the caller pins no split (gemm_w4a8_gemv_sm80.cu; the registry's rank for gemm_w4a8_gemv_sm80 is the plans'
  // copy of this rule). Its width follows the shape unless named.
  const kernels::MBucket bucket = kernels::m_bucket_of(m);
  const bool gemv = options.kernel == Gemm8Kernel::gemv ||
                    (options.kernel == Gemm8Kernel::automatic && options.split_k <= 0 &&
                     (bucket == kernels::MBucket::m1 || bucket == kernels::MBucket::m4) &&
                     compute_capability_major(dev) == 9);
  if (gemv) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, m <= detail::kGemv8MaxTokens, op, ": the gemv kernel takes 1-",
                      detail::kGemv8MaxTokens, " tokens, got m=", m, "; name 'sm80' instead");
    const bool wide = options.gemv_width == GemvWidth::wide ||
                      (options.gemv_width == GemvWidth::automatic && detail::gemv8_wide_pays(m, n, k));
    const detail::Gemv8Plan plan =
        detail::gemm_w4a8_gemv_plan(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), options.gemv_ring,
                                    options.gemv_blocks, wide, multiprocessor_count(dev));
    Tensor partial;
    if (plan.split > 1) partial = Tensor::empty({plan.split * m * n}, ScalarType::s32, xq.device());
    const detail::W4A8Problem problem{xq.data<int8_t>(), xq.stride(0), raw ? nullptr : x_scale.data<float>(),
                                      w.data.data<uint8_t>(), w.scales.data<uint8_t>(), w.zeros.data<uint8_t>(),
                                      w.channel_scales.data<float>(), y.data_ptr(), y.stride(0), static_cast<int>(m),
                                      static_cast<int>(n), static_cast<int>(k), w.group, static_cast<int>(npad), raw};
    detail::gemm_w4a8_gemv(problem, plan.split > 1 ? partial.data<int32_t>() : nullptr, plan,
                           options.pdl && pdl_supported(dev), stream);
    return;
  }
  // The wgmma kernel from 128 tokens on (one dequantized fragment feeds 128-256 tokens), and below that where the
  // registry's rule says (kernels::w4a8_wgmma_preferred: from 17 tokens, and at 5-16 on layers of 16384+ rows) when
  // the caller pins no mma.sync split.
  const bool sm90 = options.kernel == Gemm8Kernel::sm90 ||
                    (options.kernel == Gemm8Kernel::automatic &&
                     (m >= 128 || (options.split_k <= 0 && kernels::w4a8_wgmma_preferred(bucket, n))) &&
                     detail::gemm_w4a8_sm90_usable(dev));
  if (sm90) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, detail::gemm_w4a8_sm90_usable(dev), op,
                      ": the sm90 kernel needs an sm_90 device and a library built with sm_90a kernels (device ", dev,
                      ")");
    const detail::W4A8Problem problem{xq.data<int8_t>(), xq.stride(0), raw ? nullptr : x_scale.data<float>(),
                                      w.data.data<uint8_t>(), w.scales.data<uint8_t>(), w.zeros.data<uint8_t>(),
                                      w.channel_scales.data<float>(), y.data_ptr(), y.stride(0), static_cast<int>(m),
                                      static_cast<int>(n), static_cast<int>(k), w.group, static_cast<int>(npad), raw};
    detail::Sm90Choice choice = sm90_choice_of(options);
    choice.pdl = options.pdl && pdl_supported(dev);
    detail::gemm_w4a8_sm90(problem, choice, stream);
    return;
  }
  const Shape shape = shape_for(m);
  prepare(shape, dev);
  const int k_chunks = static_cast<int>(k / kChunkK);
  int split = options.split_k > 0 ? std::min(options.split_k, k_chunks) : gemm_w4a8_pick_split(m, n, k, dev);
  const int per = (k_chunks + split - 1) / split;
  split = (k_chunks + per - 1) / per;
  LOWBIT_CHECK(split <= 65535, op, ": split_k too large");
  Tensor partial;
  if (split > 1) partial = Tensor::empty({split * m * n}, ScalarType::s32, xq.device());

  W4A8Args p{xq.data<int8_t>(), xq.stride(0), raw ? nullptr : x_scale.data<float>(), w.data.data<uint8_t>(),
             w.scales.data<uint8_t>(), w.zeros.data<uint8_t>(), w.channel_scales.data<float>(), y.data_ptr(),
             y.stride(0), split > 1 ? partial.data<int32_t>() : nullptr, static_cast<int>(m), static_cast<int>(n),
             static_cast<int>(k), w.group, static_cast<int>(npad), per, raw, options.pdl && pdl_supported(dev)};
  switch (shape) {
    case Shape::m8: launch<CfgM8>(p, split, stream); break;
    case Shape::m16: launch<CfgM16>(p, split, stream); break;
    case Shape::m32: launch<CfgM32>(p, split, stream); break;
    case Shape::m64: launch<CfgM64>(p, split, stream); break;
    default: launch<CfgLarge>(p, split, stream); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (split > 1) {
    const int64_t total = m * n;
    sum_partials_kernel<<<(total + 255) / 256, 256, 0, stream>>>(p, split);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda
