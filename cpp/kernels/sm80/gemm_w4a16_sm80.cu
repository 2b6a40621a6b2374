// W4A16 GEMM for the sm80 family (mma.sync m16n8k16, f16 in, f32 accumulate), weights packed
// offline by pack_sm80 (cpp/quant/pack_sm80.cpp documents the layout).
//
// Yᵀ = W · Xᵀ: the weight is the A operand (16 rows x 16 k per mma) and up to 8 tokens form the B
// operand, so decode (M = 1..16) wastes no tensor-core rows on padding tokens. Each warp owns one
// 16-row weight tile and walks its share of k in 64-wide chunks: one 16-byte load per lane brings
// the whole 16x64 u4 tile (TurboMind §4.1), the lop3 magic-number trick turns 8 nibbles into four
// f16x2 fragment registers, and w = q*s - z*s is one f16x2 fma per register. The activations are
// read straight from global memory (two 16-byte loads per lane and 8-token tile per chunk; the
// block's warps share them through L1). Chunks of the next step are loaded before the current
// one is used. Split-K across blocks writes f32 partials that a small kernel sums (deterministic).
// (Deeper prefetch - a 4-stage register ring, or an 8-stage cp.async shared-memory ring - measured
// slower on H100; docs/gpu_notes.md has the numbers.)
#include <cuda_fp16.h>

#include <algorithm>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"

namespace lowbit::cuda {
namespace {

constexpr int kWarps = 4;       // weight tiles (16 rows each) per block
constexpr int kChunkK = 64;     // k per packed chunk
constexpr int kTileN = 16;

__device__ inline uint4 load_nc(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int kLut>
__device__ inline uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm volatile("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(r) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return r;
}

__device__ inline uint32_t as_u32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ inline __half2 as_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// 8 nibbles -> 4 f16x2 A-fragment registers (order documented in pack_sm80.cpp), then
// w = q*s + (-z*s) with the scale of row g for a0/a2 and of row g+8 for a1/a3.
__device__ inline void dequant_word(uint32_t word, __half2 s_lo, __half2 nzs_lo, __half2 s_hi, __half2 nzs_hi,
                                    uint32_t (&a)[4]) {
  constexpr uint32_t kLowMask = 0x000f000f, kHighMask = 0x00f000f0, kExp = 0x64006400;  // 0x6400 = 1024.0
  constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;                                         // (a & b) | c
  const __half2 k1024 = as_h2(0x64006400), k1_16 = as_h2(0x2c002c00), km64 = as_h2(0xd400d400);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint32_t lo = lop3<kAndOr>(word, kLowMask, kExp);   // (1024 + n_i, 1024 + n_{i+4})
    const uint32_t hi = lop3<kAndOr>(word, kHighMask, kExp);  // (1024 + 16 n_{i+1}, ...)
    const __half2 q_row_g = __hsub2(as_h2(lo), k1024);
    const __half2 q_row_g8 = __hfma2(as_h2(hi), k1_16, km64);
    a[2 * half] = as_u32(__hfma2(q_row_g, s_lo, nzs_lo));
    a[2 * half + 1] = as_u32(__hfma2(q_row_g8, s_hi, nzs_hi));
    word >>= 8;
  }
}

__device__ inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct GemmArgs {
  const __half* x;
  int64_t ldx;
  const uint8_t* w;  // packed tiles
  const __half* scales;
  const __half* zeros;  // [G, npad]
  __half* y;
  int64_t ldy;
  float* partial;  // [split, m, n] when split > 1
  int m, n, k, group, npad, chunks_per_split;
};

// One chunk's operands for one lane: the weight word quad and, per 8-token tile, 16 activations.
template <int kTiles>
struct ChunkRegs {
  uint4 w;
  uint4 x[kTiles][2];
  __half2 s_lo, nzs_lo, s_hi, nzs_hi;
};

template <int kTiles>
__device__ inline void load_chunk(const GemmArgs& p, int tile_n, int kc, int m0, ChunkRegs<kTiles>& r) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int k_chunks = p.k / kChunkK;
  r.w = load_nc(p.w + ((static_cast<int64_t>(tile_n) * k_chunks + kc) * 32 + lane) * 16);
  const int64_t prow = static_cast<int64_t>(kc * kChunkK / p.group) * p.npad + tile_n * kTileN + g;
  const __half s0 = p.scales[prow], s8 = p.scales[prow + 8];
  const __half z0 = p.zeros[prow], z8 = p.zeros[prow + 8];
  r.s_lo = __half2half2(s0);
  r.s_hi = __half2half2(s8);
  r.nzs_lo = __half2half2(__hneg(__hmul(z0, s0)));
  r.nzs_hi = __half2half2(__hneg(__hmul(z8, s8)));
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int row = m0 + i * 8 + g;
    if (row < p.m) {
      const __half* src = p.x + row * p.ldx + kc * kChunkK + 16 * t;
      r.x[i][0] = load_nc(src);
      r.x[i][1] = load_nc(src + 8);
    } else {
      r.x[i][0] = r.x[i][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

template <int kTiles>
__device__ inline void compute_chunk(const ChunkRegs<kTiles>& r, float (&acc)[kTiles][4]) {
  const uint32_t words[4] = {r.w.x, r.w.y, r.w.z, r.w.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    dequant_word(words[j], r.s_lo, r.nzs_lo, r.s_hi, r.nzs_hi, a);
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const uint4& xv = r.x[i][j >> 1];
      const uint32_t b0 = (j & 1) ? xv.z : xv.x;  // actual k 16t+4j+{0,1}
      const uint32_t b1 = (j & 1) ? xv.w : xv.y;  // actual k 16t+4j+{2,3}
      mma_16816(acc[i], a, b0, b1);
    }
  }
}

template <int kTiles>
__global__ void __launch_bounds__(kWarps * 32) gemm_w4a16_kernel(GemmArgs p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile_n = blockIdx.x * kWarps + warp;
  if (tile_n * kTileN >= p.n) return;  // no block-wide barrier below
  const int k_chunks = p.k / kChunkK;
  const int kc_begin = blockIdx.y * p.chunks_per_split;
  const int kc_end = min(kc_begin + p.chunks_per_split, k_chunks);
  const int m0 = blockIdx.z * kTiles * 8;

  float acc[kTiles][4] = {};
  if (kc_begin < kc_end) {
    ChunkRegs<kTiles> cur, next;
    load_chunk<kTiles>(p, tile_n, kc_begin, m0, next);
    for (int kc = kc_begin; kc < kc_end; ++kc) {
      cur = next;
      if (kc + 1 < kc_end) load_chunk<kTiles>(p, tile_n, kc + 1, m0, next);
      compute_chunk<kTiles>(cur, acc);
    }
  }
  // c0,c1: weight row g, tokens 2t, 2t+1; c2,c3: weight row g+8, same tokens.
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int token = m0 + i * 8 + 2 * t + (c & 1);
      const int col = tile_n * kTileN + g + (c >> 1) * 8;
      if (token >= p.m || col >= p.n) continue;
      if (gridDim.y == 1)
        p.y[token * p.ldy + col] = __float2half_rn(acc[i][c]);
      else
        p.partial[(static_cast<int64_t>(blockIdx.y) * p.m + token) * p.n + col] = acc[i][c];
    }
}

__global__ void sum_partials_kernel(const float* __restrict__ partial, int split, int m, int n, __half* y,
                                    int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(m) * n) return;
  float s = 0.f;
  for (int z = 0; z < split; ++z) s += partial[z * static_cast<int64_t>(m) * n + i];  // fixed order
  y[(i / n) * ldy + i % n] = __float2half_rn(s);
}

int tiles_for(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

template <int kTiles>
void launch(const GemmArgs& p, int split, cudaStream_t stream) {
  const dim3 grid((p.n + kWarps * kTileN - 1) / (kWarps * kTileN), split, (p.m + kTiles * 8 - 1) / (kTiles * 8));
  gemm_w4a16_kernel<kTiles><<<grid, kWarps * 32, 0, stream>>>(p);
}

}  // namespace

int gemm_w4a16_pick_split(int64_t m, int64_t n, int64_t k, int device) {
  const int64_t k_chunks = k / kChunkK;
  const int64_t blocks = ((n + kWarps * kTileN - 1) / (kWarps * kTileN)) * ((m + tiles_for(m) * 8 - 1) / (tiles_for(m) * 8));
  // ~8 blocks (32 warps) per SM; for 1-8 tokens twice that, at most 16 splits (H100 sweep,
  // docs/benchmarks_gpu.md: gate_up M=1 36 us at split 4-8 vs 40.6 us at 3; down and o best at 16).
  const int64_t want = (m <= 8 ? 16LL : 8LL) * multiprocessor_count(device);
  int64_t split = (want + blocks - 1) / blocks;
  if (m <= 8) split = std::min<int64_t>(split, 16);
  // Partials cost 8 bytes per split and output (written, then read); keep them below the weight
  // bytes n*k/2, i.e. split <= k / (16 m).
  split = std::min<int64_t>(split, std::max<int64_t>(1, k / (16 * m)));
  split = std::min<int64_t>(split, k_chunks);
  // Even chunk counts per split (no idle tail split).
  const int64_t per = (k_chunks + split - 1) / split;
  return static_cast<int>(std::max<int64_t>(1, (k_chunks + per - 1) / per));
}

int64_t gemm_w4a16_workspace_elems(int64_t m, int64_t n, int split_k) { return split_k > 1 ? split_k * m * n : 0; }

void gemm_w4a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                cudaStream_t stream) {
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
  check_same_device(w.data, x, op, "w.data");
  check_same_device(w.scales, x, op, "w.scales");
  check_same_device(w.zeros, x, op, "w.zeros");
  check_shape(w.data, {(n + kTileN - 1) / kTileN, (k / kChunkK) * 512}, op, "w.data");
  const int64_t groups = (k + w.group - 1) / w.group, npad = (n + kTileN - 1) / kTileN * kTileN;
  check_shape(w.scales, {groups, npad}, op, "w.scales");
  check_shape(w.zeros, {groups, npad}, op, "w.zeros");
  check_same_device(y, x, op, "y");
  check_dtype(y, ScalarType::f16, op, "y");
  check_shape(y, {m, n}, op, "y");
  LOWBIT_CHECK(y.stride(1) == 1, op, ": argument 'y' needs unit stride in the last dim");
  LOWBIT_CHECK(m <= (1LL << 30) && n * k < (1LL << 40), op, ": problem too large");
  if (m == 0 || n == 0) return;

  const int dev = x.device().index;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(dev));
  const int k_chunks = static_cast<int>(k / kChunkK);
  int split = split_k > 0 ? std::min(split_k, k_chunks) : gemm_w4a16_pick_split(m, n, k, dev);
  const int per = (k_chunks + split - 1) / split;
  split = (k_chunks + per - 1) / per;

  Tensor ws = workspace;
  if (split > 1) {
    const int64_t need = gemm_w4a16_workspace_elems(m, n, split);
    if (!ws.defined()) ws = Tensor::empty({need}, ScalarType::f32, x.device());
    check_same_device(ws, x, op, "workspace");
    check_dtype(ws, ScalarType::f32, op, "workspace");
    LOWBIT_CHECK(ws.is_contiguous() && ws.numel() >= need, op, ": argument 'workspace' needs ", need,
                 " contiguous f32 elements, got ", ws.str());
  }
  GemmArgs p{x.data<__half>(), x.stride(0), w.data.data<uint8_t>(), w.scales.data<__half>(), w.zeros.data<__half>(),
             y.data<__half>(), y.stride(0), split > 1 ? ws.data<float>() : nullptr, static_cast<int>(m),
             static_cast<int>(n), static_cast<int>(k), w.group, static_cast<int>(npad), per};
  switch (tiles_for(m)) {
    case 1: launch<1>(p, split, stream); break;
    case 2: launch<2>(p, split, stream); break;
    case 4: launch<4>(p, split, stream); break;
    default: launch<8>(p, split, stream); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (split > 1) {
    const int64_t total = m * n;
    sum_partials_kernel<<<(total + 255) / 256, 256, 0, stream>>>(ws.data<float>(), split, p.m, p.n, p.y, p.ldy);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda
