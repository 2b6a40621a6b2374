// 8-bit weights x f16 activations on the sm80 family (mma.sync m16n8k16, f16 in, f32 accumulate): y = x · Wᵀ,
// one kernel for two code types, chosen by the Codes policy below:
// - s8 (gemm_w8a16_sm80.cu): one f32 scale per output channel (recipe w8a16) or per group of 32/64/128 k
//   (w8a16g32: GGUF Q8_0 as stored);
// - fp8 e4m3 (gemm_wfp8a16_sm80.cu, recipe wfp8a16): one f32 scale per output channel.
// Both read the weight as the W8A8 / FP8 kernels do (row-major bytes [n, k], f32 scales [n] or [n, groups]):
// one GPU layout, nothing to repack.
//
// Yᵀ = W · Xᵀ as in gemm_w4a16_sm80.cu: the weight is the A operand (16 rows x 16 k per mma), 8 tokens the
// B operand, so decode wastes no tensor-core rows. A block owns kBlockN weight rows x kBlockM tokens x a
// k range (split-K across blocks, f32 partials summed in a fixed order). Weights, activations and group
// scales stream through a cp.async shared-memory ring. ldmatrix over the byte rows (as b16 pairs) hands
// lane (g, t) the four bytes k 4t..4t+3 of rows g and g+8: the mma takes them as its k positions
// (2t, 2t+1, 2t+8, 2t+9), and the lane reads the activations at the same k 4t..4t+3 (one 8-byte load), so
// the products pair up (a dot product ignores the order of its terms). Codes become their exact f16
// values (Codes::to_f16); per-channel weights multiply the f32 accumulator by the channel's scale at the
// end (no rounding of the scale), grouped weights multiply the integer by the group's scale in f16 before
// the mma (one rounding, as an f16 weight would have).
#pragma once

#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"
#include "kernels/sm80/w4a16_common_sm80.cuh"

namespace lowbit::cuda::w8f16 {

using w4a16::as_h2;
using w4a16::as_u32;
using w4a16::cp_async16;
using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::ldmatrix_x2;
using w4a16::mma_16816;
using w4a16::smem_addr;

constexpr int kChunkK = 64;  // k per chunk (64 s8 bytes per weight row)

// s8 codes: the exact integers by the magic-number trick ((q ^ 0x80) | 0x6400 = 1152 + q), per channel or
// per group of k (GGUF Q8_0).
struct S8Codes {
  static constexpr const char* kOp = "gemm_w8a16";
  static constexpr WeightFormat kFormat = WeightFormat::w8;
  static constexpr ScalarType kDtype = ScalarType::s8;
  static constexpr bool kGroups = true;
  // Four codes (one 32-bit word) -> two f16x2: bytes (0, 1) and (2, 3).
  __device__ static inline void to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
    const __half2 k1152 = w4a16::as_h2(0x64806480);  // (1152, 1152)
    const uint32_t u = w ^ 0x80808080u;               // s8 -> u8 = q + 128
    lo = w4a16::as_u32(__hsub2(w4a16::as_h2(__byte_perm(u, 0x64646464, 0x4140)), k1152));
    hi = w4a16::as_u32(__hsub2(w4a16::as_h2(__byte_perm(u, 0x64646464, 0x4342)), k1152));
  }
};

// e4m3 codes (per-channel scales only, as the CPU format stores them). Every e4m3 value is an f16 value:
// moving the byte's exponent and mantissa into the f16 fields (sign | byte & 0x7f << 7) gives the value
// times 2^-8 (bias 15 instead of 7; e4m3 subnormals land on f16 subnormals with the same scaling), and
// multiplying by 256 is exact. The NaN codes (0x7f, 0xff) would read as +-480: the CPU never stores them
// (saturating quantization), the loaders refuse them.
struct E4m3Codes {
  static constexpr const char* kOp = "gemm_wfp8a16";
  static constexpr WeightFormat kFormat = WeightFormat::e4m3;
  static constexpr ScalarType kDtype = ScalarType::e4m3;
  static constexpr bool kGroups = false;
  __device__ static inline uint32_t pair_to_f16(uint32_t hi_bytes) {  // bytes at bits 8-15 and 24-31
    const __half2 k256 = w4a16::as_h2(0x5c005c00);                      // (256, 256)
    const uint32_t bits = (hi_bytes & 0x80008000u) | ((hi_bytes >> 1) & 0x3f803f80u);
    return w4a16::as_u32(__hmul2(w4a16::as_h2(bits), k256));
  }
  __device__ static inline void to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
    lo = pair_to_f16(__byte_perm(w, 0, 0x1404));  // byte 0 -> bits 8-15, byte 1 -> bits 24-31
    hi = pair_to_f16(__byte_perm(w, 0, 0x3424));
  }
};

struct Args {
  const __half* x;
  int64_t ldx;
  const uint8_t* w;     // [n, k] row-major codes (s8 or e4m3 bits)
  const float* scales;  // [n] (group 0) or [n, groups]
  __half* y;
  int64_t ldy;
  float* partial;  // [split, m, n] when split > 1
  int m, n, k, group, chunks_per_split;
};

// kWarpsN x kWarpsM warps, each owning kTilesN 16-row weight tiles x kTilesM 8-token tiles; kChunks 64-k
// chunks per stage, kStages stages. Rows are padded by 16 bytes (s8) / 16 halves (x) so that the
// ldmatrix rows and the lanes' 8-byte activation loads fall in distinct banks.
template <int kWarpsN_, int kWarpsM_, int kTilesN_, int kTilesM_, int kChunks_, int kStages_, int kMinBlocks_>
struct Cfg {
  static constexpr int kWarpsN = kWarpsN_, kWarpsM = kWarpsM_, kTilesN = kTilesN_, kTilesM = kTilesM_;
  static constexpr int kChunks = kChunks_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsM;
  static constexpr int kBlockN = 16 * kTilesN * kWarpsN, kBlockM = 8 * kTilesM * kWarpsM;
  static constexpr int kK = kChunks * kChunkK;           // k per stage
  static constexpr int kWRow = kK + 16;                  // bytes per weight row in smem
  static constexpr int kXRow = kK + 16;                  // halves per token row in smem
  static constexpr int kHalves = kK / 32;                // group-scale slots per row and stage
  static constexpr int kWBytes = kBlockN * kWRow;
  static constexpr int kSBytes = kBlockN * kHalves * 4;  // f32 [row][half]
  static constexpr int kXBytes = kBlockM * kXRow * 2;
  static constexpr int kStageBytes = kWBytes + kSBytes + kXBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kWBytes % 16 == 0 && kSBytes % 16 == 0, "16-byte aligned stage parts");
  static_assert(kBlockN * (kK / 16) % kThreads == 0, "load_stage's weight copies cover the tile exactly");
};

__device__ inline void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(smem)), "l"(gmem));
}

// The cp.async copies of the stage starting at k0 (rows past n / m and k past k_end are skipped: what
// they would feed is never stored).
template <class C>
__device__ inline void load_stage(const Args& p, uint8_t* st, int k0, int k_end, int n0, int m0) {
  const int tid = threadIdx.x;
  constexpr int kWUnits = C::kBlockN * (C::kK / 16);
#pragma unroll
  for (int u0 = 0; u0 < kWUnits; u0 += C::kThreads) {
    const int u = u0 + tid, r = u / (C::kK / 16), c = u % (C::kK / 16);
    if (n0 + r < p.n && k0 + 16 * c < k_end)
      cp_async16(st + r * C::kWRow + 16 * c, p.w + static_cast<int64_t>(n0 + r) * p.k + k0 + 16 * c);
  }
  if (p.group > 0) {
    float* ss = reinterpret_cast<float*>(st + C::kWBytes);
    const int groups = (p.k + p.group - 1) / p.group;
    for (int u = tid; u < C::kBlockN * C::kHalves; u += C::kThreads) {
      const int r = u / C::kHalves, h = u % C::kHalves, kk = k0 + 32 * h;
      if (n0 + r < p.n && kk < k_end)
        cp_async4(ss + u, p.scales + static_cast<int64_t>(n0 + r) * groups + kk / p.group);
    }
  }
  uint8_t* xs = st + C::kWBytes + C::kSBytes;
  constexpr int kXUnits = C::kBlockM * (C::kK / 8);
#pragma unroll
  for (int u0 = 0; u0 < kXUnits; u0 += C::kThreads) {
    const int u = u0 + tid;
    if (kXUnits % C::kThreads != 0 && u >= kXUnits) break;
    const int r = u / (C::kK / 8), c = u % (C::kK / 8);
    if (m0 + r < p.m && k0 + 8 * c < k_end)
      cp_async16(xs + (r * C::kXRow + 8 * c) * 2, p.x + static_cast<int64_t>(m0 + r) * p.ldx + k0 + 8 * c);
  }
}

// One warp's share of a stage: per k16 step, ldmatrix its weight tiles, convert (and scale, when grouped),
// and multiply into all of its token tiles.
template <class C, class Codes>
__device__ inline void compute_stage(const uint8_t* st, int k_valid, int warp_n, int warp_m, bool grouped,
                                     float (&acc)[C::kTilesN][C::kTilesM][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* ss = reinterpret_cast<const float*>(st + C::kWBytes);
  const __half* xs = reinterpret_cast<const __half*>(st + C::kWBytes + C::kSBytes);
#pragma unroll
  for (int step = 0; step < C::kK / 16; ++step) {
    if (16 * step >= k_valid) break;
    uint32_t a[C::kTilesN][4];
#pragma unroll
    for (int i = 0; i < C::kTilesN; ++i) {
      // Two 8x8 b16 matrices: rows 0-7 and 8-15 of the tile at this step's 16 bytes (lanes 0-7 and 8-15
      // address their rows); lane (g, t) receives bytes 4t..4t+3 of rows g and g + 8.
      const int tile_row = (warp_n * C::kTilesN + i) * 16;
      uint32_t w_g, w_g8;
      ldmatrix_x2(smem_addr(st + (tile_row + (lane & 15)) * C::kWRow + 16 * step), w_g, w_g8);
      Codes::to_f16(w_g, a[i][0], a[i][2]);   // row g: k 4t, 4t+1 | 4t+2, 4t+3
      Codes::to_f16(w_g8, a[i][1], a[i][3]);  // row g + 8
      if (Codes::kGroups && grouped) {
        const int half = step / 2;
        const __half2 s_g = __float2half2_rn(ss[(tile_row + g) * C::kHalves + half]);
        const __half2 s_g8 = __float2half2_rn(ss[(tile_row + g + 8) * C::kHalves + half]);
        a[i][0] = as_u32(__hmul2(as_h2(a[i][0]), s_g));
        a[i][2] = as_u32(__hmul2(as_h2(a[i][2]), s_g));
        a[i][1] = as_u32(__hmul2(as_h2(a[i][1]), s_g8));
        a[i][3] = as_u32(__hmul2(as_h2(a[i][3]), s_g8));
      }
    }
#pragma unroll
    for (int j = 0; j < C::kTilesM; ++j) {
      const int token = (warp_m * C::kTilesM + j) * 8 + g;
      const uint2 b = *reinterpret_cast<const uint2*>(xs + token * C::kXRow + 16 * step + 4 * t);
#pragma unroll
      for (int i = 0; i < C::kTilesN; ++i) mma_16816(acc[i][j], a[i], b.x, b.y);
    }
  }
}

template <class C, class Codes>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) gemm_w8_f16act_kernel(Args p) {
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp_n = warp % C::kWarpsN, warp_m = warp / C::kWarpsN;
  const int m0 = blockIdx.x * C::kBlockM, n0 = blockIdx.y * C::kBlockN;
  const int k_begin = blockIdx.z * p.chunks_per_split * kChunkK;
  const int k_end = min(k_begin + p.chunks_per_split * kChunkK, p.k);
  const int iters = k_end > k_begin ? (k_end - k_begin + C::kK - 1) / C::kK : 0;
  const bool active = n0 + warp_n * C::kTilesN * 16 < p.n && m0 + warp_m * C::kTilesM * 8 < p.m;
  const bool grouped = Codes::kGroups && p.group > 0;

  float acc[C::kTilesN][C::kTilesM][4] = {};
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < iters) load_stage<C>(p, smem + s * C::kStageBytes, k_begin + s * C::kK, k_end, n0, m0);
    cp_async_commit();  // one group per stage, empty or not: uniform wait counts
  }
  for (int it = 0; it < iters; ++it) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    const int next = it + C::kStages - 1;
    if (next < iters)
      load_stage<C>(p, smem + (next % C::kStages) * C::kStageBytes, k_begin + next * C::kK, k_end, n0, m0);
    cp_async_commit();
    const int k0 = k_begin + it * C::kK;
    if (active) compute_stage<C, Codes>(smem + (it % C::kStages) * C::kStageBytes, k_end - k0, warp_n, warp_m, grouped, acc);
  }
  cp_async_wait<0>();

  // acc[i][j]: c0, c1 = weight row g, tokens 2t, 2t+1; c2, c3 = row g+8.
#pragma unroll
  for (int i = 0; i < C::kTilesN; ++i)
#pragma unroll
    for (int j = 0; j < C::kTilesM; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int token = m0 + (warp_m * C::kTilesM + j) * 8 + 2 * t + (c & 1);
        const int col = n0 + (warp_n * C::kTilesN + i) * 16 + g + (c >> 1) * 8;
        if (token >= p.m || col >= p.n) continue;
        const float v = grouped ? acc[i][j][c] : acc[i][j][c] * __ldg(p.scales + col);
        if (gridDim.z == 1)
          p.y[token * p.ldy + col] = __float2half_rn(v);
        else
          p.partial[(static_cast<int64_t>(blockIdx.z) * p.m + token) * p.n + col] = v;
      }
}

// Decode (<= 16 tokens): 8 warps x one 16-row tile, 128 rows per block; up to 64 tokens: the same with
// up to 8 token tiles per warp; more: 128 x 128 blocks of 2 x 8 tiles per warp.
using CfgM8 = Cfg<8, 1, 1, 1, 2, 4, 2>;
using CfgM16 = Cfg<8, 1, 1, 2, 2, 4, 2>;
using CfgM64 = Cfg<8, 1, 1, 8, 2, 4, 1>;
using CfgLarge = Cfg<4, 2, 2, 8, 1, 4, 1>;

template <class C, class Codes>
int blocks_per_sm(int device) {  // raises the shared-memory limit once per device; resident blocks per SM
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    const char* op = Codes::kOp;
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(gemm_w8_f16act_kernel<C, Codes>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               C::kSmemBytes));
    int blocks = 0;
    LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemm_w8_f16act_kernel<C, Codes>, C::kThreads,
                                                                        C::kSmemBytes));
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, blocks > 0, op, ": the kernel for this token count does not fit "
                      "device ", device, "'s shared memory");
    cache[device] = blocks;
  }
  return cache[device];
}

// Split-K to fill one wave of resident blocks when the (n, m) tiles do not, keeping >= 2 stages per split
// and the f32 partials (8 bytes per output and split) below the weight bytes.
template <class C, class Codes>
void run(const Args& base, int split_k, const Tensor& workspace, const Tensor& x, cudaStream_t stream) {
  const int dev = x.device().index;
  const int64_t tiles = int64_t((base.n + C::kBlockN - 1) / C::kBlockN) * ((base.m + C::kBlockM - 1) / C::kBlockM);
  const int k_chunks = base.k / kChunkK;
  int split = split_k;
  if (split <= 0) {
    const int64_t slots = int64_t(blocks_per_sm<C, Codes>(dev)) * multiprocessor_count(dev);
    int64_t s = std::max<int64_t>(1, slots / std::max<int64_t>(tiles, 1));
    s = std::min<int64_t>(s, std::max(1, k_chunks / (2 * C::kChunks)));
    s = std::min<int64_t>(s, std::max<int64_t>(1, int64_t(base.k) / (8 * std::max(base.m, 1))));
    split = static_cast<int>(std::min<int64_t>(s, 64));
  } else {
    blocks_per_sm<C, Codes>(dev);
  }
  const int per = (k_chunks + split - 1) / std::min(split, k_chunks);
  split = (k_chunks + per - 1) / per;
  Args p = base;
  p.chunks_per_split = per;
  Tensor ws = workspace;
  if (split > 1) {
    const int64_t need = int64_t(split) * p.m * p.n;
    if (!ws.defined()) ws = Tensor::empty({need}, ScalarType::f32, x.device());
    LOWBIT_CHECK(ws.dtype() == ScalarType::f32 && ws.is_contiguous() && ws.numel() >= need &&
                     ws.device() == x.device(),
                 Codes::kOp, ": argument 'workspace' needs ", need, " contiguous f32 elements on ", x.device().str(),
                 ", got ", ws.str());
    p.partial = ws.data<float>();
  }
  const dim3 grid((p.m + C::kBlockM - 1) / C::kBlockM, (p.n + C::kBlockN - 1) / C::kBlockN, split);
  gemm_w8_f16act_kernel<C, Codes><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  LOWBIT_CUDA_CHECK_LAUNCH(Codes::kOp);
  if (split > 1) {
    w4a16::sum_split_partials(p.partial, split, p.m, p.n, p.y, p.ldy, stream);
    LOWBIT_CUDA_CHECK_LAUNCH(Codes::kOp);
  }
}

// The checks and the token-count dispatch, one per code type.
template <class Codes>
void gemm_w8_f16act(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                    cudaStream_t stream) {
  const char* op = Codes::kOp;
  LOWBIT_CHECK(w.format == Codes::kFormat, op, ": argument 'w' must be a ", name_of(Codes::kFormat), " weight, got ",
               name_of(w.format));
  check_cuda_tensor(x, op, "x");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, x.dtype() == ScalarType::f16, op,
                    ": argument 'x' must be f16 (bf16 activations have no kernel here), got ", name_of(x.dtype()));
  check_dim(x, 2, op, "x");
  const int64_t m = x.size(0), n = w.n, k = w.k;
  LOWBIT_CHECK(x.size(1) == k, op, ": argument 'x' has ", x.size(1), " features but the weight expects k=", k);
  LOWBIT_CHECK(x.stride(1) == 1 && x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0, op,
               ": argument 'x' needs unit stride in the last dim, a row stride divisible by 8 and a 16-byte aligned "
               "start, got strides ", shape_str(x.strides()));
  LOWBIT_CHECK(k % kChunkK == 0, op, ": k must be a multiple of ", kChunkK, ", got k=", k);
  if (Codes::kGroups)
    LOWBIT_CHECK(w.group == 0 || (w.group % 32 == 0 && w.group > 0), op,
                 ": the group must be 0 (per channel) or a multiple of 32, got ", w.group);
  else
    LOWBIT_CHECK(w.group == 0, op, ": ", name_of(Codes::kFormat), " weights take per-channel scales (group 0), got group ",
                 w.group);
  const int64_t groups = w.group > 0 ? (k + w.group - 1) / w.group : 0;
  check_same_device(w.data, x, op, "w.data");
  check_same_device(w.scales, x, op, "w.scales");
  check_dtype(w.data, Codes::kDtype, op, "w.data");
  check_shape(w.data, {n, k}, op, "w.data");
  check_dtype(w.scales, ScalarType::f32, op, "w.scales");
  if (groups > 0)
    check_shape(w.scales, {n, groups}, op, "w.scales");
  else
    check_shape(w.scales, {n}, op, "w.scales");
  LOWBIT_CHECK(w.data.is_contiguous() && w.scales.is_contiguous() &&
                   reinterpret_cast<uintptr_t>(w.data.data_ptr()) % 16 == 0,
               op, ": the weight's data and scales must be contiguous, data 16-byte aligned");
  check_same_device(y, x, op, "y");
  check_dtype(y, ScalarType::f16, op, "y");
  check_shape(y, {m, n}, op, "y");
  LOWBIT_CHECK(y.stride(1) == 1, op, ": argument 'y' needs unit stride in the last dim");
  LOWBIT_CHECK(m <= (1LL << 30) && n <= (1LL << 24) && k <= (1LL << 24), op, ": problem too large");
  if (m == 0 || n == 0) return;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(x.device().index));
  const Args p{x.data<__half>(), x.stride(0), static_cast<const uint8_t*>(w.data.data_ptr()), w.scales.data<float>(), y.data<__half>(),
               y.stride(0), nullptr, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), w.group, 0};
  if (m <= 8)
    run<CfgM8, Codes>(p, split_k, workspace, x, stream);
  else if (m <= 16)
    run<CfgM16, Codes>(p, split_k, workspace, x, stream);
  else if (m <= 64)
    run<CfgM64, Codes>(p, split_k, workspace, x, stream);
  else
    run<CfgLarge, Codes>(p, split_k, workspace, x, stream);
}

}  // namespace lowbit::cuda::w8f16
