// Row-wise kernels of the forward pass on the GPU: RMSNorm (+ fused residual add), SiLU·mul,
// embedding gather, bias add, cast to f32. Norms take one block per row, element-wise kernels spread
// rows over many blocks; f32 math, one rounding per output like the CPU kernels
// (cpp/kernels/cpu/elementwise_cpu.cpp).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include <cooperative_groups.h>

#include "cuda/float_io.cuh"
#include "cuda/fmpq_code.cuh"
#include "cuda/pdl.cuh"
#include "cuda/quantize_code.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

// rsqrt(mean(v^2) + eps) over the row, with the square sum accumulated in f32 per thread and the
// final mean and root in double (the CPU sums in double; the difference is far below f16/bf16 ulps).
__device__ float inv_rms(float ss, int64_t cols, float eps) {
  const float total = block_reduce<kThreads, false>(ss);
  return static_cast<float>(1.0 / sqrt(static_cast<double>(total) / static_cast<double>(cols) + eps));
}

// Row-wise norms hold their row in registers (kPer values per thread, rows up to kPer * kThreads
// columns): every load of the row is issued before any store, so they overlap. (A loop that loads,
// stores, and reloads element by element cannot: the compiler must assume the store may alias the
// next load.) The weight is read in the same round trip, before the reduction. They are typed (T for
// x, residual and out; W for the weight): branching on dtypes per element made a 6.7K-instruction
// kernel (typing it measured only 7% faster, 11.4 -> 10.6 us at batch 1; the weight prefetch, 4.7 us).
// A thread owns groups of kVec adjacent columns (kVec 8: 16-byte loads of f16 rows, where the
// columns, strides and bases allow it; 2-byte loads ran a prefill's norms at ~1.1 TB/s), kPer / kVec
// groups by default; 16-byte rows of up to 4096 columns hold only the two groups they use (kGroups 2): 32
// live values instead of 64 double the blocks per SM (88 -> ~56 registers), the rows in flight.
constexpr int kPer = 32;
constexpr int64_t kMaxRegisterCols = int64_t{kPer} * kThreads;

// kVec elements of T at p as f32 (kVec 8: p 16-byte aligned), and back (stores round to nearest even).
template <int kVec, typename T>
__device__ __forceinline__ void load_group(const T* p, float* out) {
  if constexpr (kVec == 1) {
    out[0] = load_f32(p);
  } else {
    constexpr int kWords = kVec * int(sizeof(T)) / 16;
    static_assert(kWords * 16 == kVec * int(sizeof(T)), "a group is whole 16-byte words");
    uint4 raw[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) raw[k] = reinterpret_cast<const uint4*>(p)[k];
    const T* t = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = load_f32(t + e);
  }
}
template <int kVec, typename T>
__device__ __forceinline__ void store_group(T* p, const float* in) {
  if constexpr (kVec == 1) {
    store_f32(p, in[0]);
  } else {
    constexpr int kWords = kVec * int(sizeof(T)) / 16;
    uint4 raw[kWords];
    T* t = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int e = 0; e < kVec; ++e) store_f32(t + e, in[e]);
#pragma unroll
    for (int k = 0; k < kWords; ++k) reinterpret_cast<uint4*>(p)[k] = raw[k];
  }
}

// Whether rows of `r` allow 8-element groups: 16-byte aligned base and a stride of whole groups.
bool groups_of_8(const Rows& r) {
  return reinterpret_cast<uintptr_t>(r.base) % 16 == 0 && r.stride % 8 == 0;
}

__device__ __forceinline__ float round_as(ScalarType t, float v) {  // what storing v as t keeps
  if (t == ScalarType::f16) return __half2float(__float2half_rn(v));
  if (t == ScalarType::bf16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

// Where a norm that quantizes its output puts it: codes [rows, ldq] and one f32 scale per row.
struct QuantOut {
  uint8_t* q;
  int64_t ldq;
  float* scales;
};
// Where a norm that writes FMPQ codes puts them (NormOut::fmpq): codes [rows, ldq] of the row gathered through perm
// (null: none), f32 scales [rows, ceil(cols / 128)], the block map; q8: code rows 8-byte aligned.
struct FmpqOut {
  int8_t* q;
  int64_t ldq;
  float* scales;
  const int32_t* perm;
  FmpqBits bits;
  bool q8;
};
enum class NormOut { rows, int8, e4m3, fmpq };

// kOut = rows: `out` gets the normed row. Otherwise the normed row, rounded to T exactly as `out` would
// hold it, is quantized per token as quantize_per_token_{s8,e4m3} would quantize that `out` (same
// scale and codes), so the linear after it reads codes without a separate quantize kernel.
// kVec 8 needs cols % 8 == 0 and groups_of_8 of x, res and w (out: out_groups says, else element stores).
// kOut = fmpq: the f16 normed row (the bytes `out` would hold) goes to shared memory, then each 128-channel block of
// row[perm] gets quantize_fmpq's codes and scale, one block per half warp.
template <bool kAdd, typename T, typename W, NormOut kOut = NormOut::rows, int kVec = 1, int kGroups = kPer / kVec>
__global__ void __launch_bounds__(kThreads) norm_rows_kernel(Rows res, Rows x, Rows w, float eps, Rows out,
                                                             QuantOut qout = {}, bool out_groups = false,
                                                             FmpqOut fout = {}) {
  static_assert(kGroups * kVec <= kPer, "at most kPer values per thread");
  constexpr int kValues = kGroups * kVec;
  pdl_allow_dependents();  // the GEMM that reads `out` may launch and prefetch its weights meanwhile
  const int64_t r = blockIdx.x;
  const T* xr = static_cast<const T*>(x.base) + r * x.stride;
  T* rr = kAdd ? static_cast<T*>(res.base) + r * res.stride : nullptr;
  const W* wr = static_cast<const W*>(w.base);
  const int cols = static_cast<int>(x.cols);
  const auto first_col = [](int g) { return (static_cast<int>(threadIdx.x) + g * kThreads) * kVec; };
  float v[kValues], wv[kValues];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int i = first_col(g);
    float* vg = v + g * kVec;
    float* wg = wv + g * kVec;
    if (i < cols) {
      load_group<kVec>(xr + i, vg);
      if (kAdd) {
        float rg[kVec];
        load_group<kVec>(rr + i, rg);
#pragma unroll
        for (int e = 0; e < kVec; ++e) vg[e] += rg[e];
      }
      load_group<kVec>(wr + i, wg);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) vg[e] = wg[e] = 0.f;
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    float* vg = v + g * kVec;
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      if (kAdd) vg[e] = round_to<T>(vg[e]);  // normalize what the residual now holds (rounded)
    if (first_col(g) < cols) {
      if (kAdd) store_group<kVec>(rr + first_col(g), vg);
#pragma unroll
      for (int e = 0; e < kVec; ++e) ss += vg[e] * vg[e];
    }
  }
  const float inv = inv_rms(ss, cols, eps);
  if constexpr (kOut == NormOut::rows) {
    T* orow = static_cast<T*>(out.base) + r * out.stride;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int i = first_col(g);
      if (i >= cols) continue;
      float og[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) og[e] = v[g * kVec + e] * inv * wv[g * kVec + e];
      if (kVec == 1 || out_groups) {
        store_group<kVec>(orow + i, og);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) store_f32(orow + i + e, og[e]);
      }
    }
  } else if constexpr (kOut == NormOut::fmpq) {
    static_assert(std::is_same_v<T, __half>, "FMPQ codes come from f16 rows");
    __shared__ __align__(16) __half row[kMaxRegisterCols];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int i = first_col(g);
      if (i >= cols) continue;
      float og[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) og[e] = v[g * kVec + e] * inv * wv[g * kVec + e];
      store_group<kVec>(row + i, og);  // kVec 8: cols % 8 == 0, so the group is whole
    }
    __syncthreads();
    const int blocks = (cols + kFmpqBlock - 1) / kFmpqBlock, half = static_cast<int>(threadIdx.x) / 16;
    const int l = static_cast<int>(threadIdx.x) % 16;
    int8_t* qrow = fout.q + r * fout.ldq;
    for (int b0 = 0; b0 < blocks; b0 += kThreads / 16) {  // the same trip count for every lane (shuffles)
      const int b = b0 + half, c = b * kFmpqBlock + 8 * l;
      const bool active = b < blocks;
      float q[8];
      if (!fout.perm && active && c + 8 <= cols) {
        load_group<8>(row + c, q);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          q[e] = active && c + e < cols ? __half2float(row[fout.perm ? fout.perm[c + e] : c + e]) : 0.f;
      }
      fmpq_codes_half_warp(q, b, cols, active && fmpq_int8_block(fout.bits, b), active, qrow,
                           fout.scales + r * blocks + b, fout.q8);
    }
  } else {
    constexpr bool kFp8 = kOut == NormOut::e4m3;
    float amax = 0.f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float& val = v[g * kVec + e];
        val = round_to<T>(val * inv * wv[g * kVec + e]);  // the value `out` would hold
        if (first_col(g) < cols) amax = fmaxf(amax, fabsf(val));
      }
    }
    amax = block_reduce<kThreads, true>(amax);
    const float s = row_scale<kFp8>(amax);
    if (threadIdx.x == 0) qout.scales[r] = s;
    uint8_t* qrow = qout.q + r * qout.ldq;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int i = first_col(g);
      if (i >= cols) continue;
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        qrow[i + e] = static_cast<uint8_t>(quantize_code<kFp8>(__fdiv_rn(v[g * kVec + e], s)));
    }
  }
}

// Whether a norm reads its rows in 8-column groups: the fused quantizing norm decides alike, so for the same
// rows both sum the squares in the same order and give the same scale.
bool norm_groups_of_8(bool add, const Rows& res, const Rows& x, const Rows& w) {
  return x.cols % 8 == 0 && groups_of_8(x) && (!add || groups_of_8(res)) && groups_of_8(w);
}

// Calls f with the kernel's (kVec, kGroups) for rows of `cols` columns: 8-column groups where `groups` (the rows
// allow 16-byte accesses), two per thread up to 4096 columns (the 8B's hidden size) else kPer / 8; otherwise single
// columns. The plain and the quantizing norm choose alike, so their sums agree.
template <typename F>
void with_row_layout(bool groups, int64_t cols, F&& f) {
  using std::integral_constant;
  if (!groups) f(integral_constant<int, 1>{}, integral_constant<int, kPer>{});
  else if (cols <= int64_t{2} * 8 * kThreads) f(integral_constant<int, 8>{}, integral_constant<int, 2>{});
  else f(integral_constant<int, 8>{}, integral_constant<int, kPer / 8>{});
}

// The typed kernel for x/residual/out of one dtype and a weight of that dtype or f32 (every model
// on the GPU); false for other mixes, which take the generic kernels below.
template <bool kAdd>
bool launch_typed_norm(const Rows& res, const Rows& x, const Rows& w, float eps, const Rows& out,
                       cudaStream_t stream) {
  if (x.cols > kMaxRegisterCols || out.dtype != x.dtype || (kAdd && res.dtype != x.dtype) ||
      (w.dtype != x.dtype && w.dtype != ScalarType::f32))
    return false;
  const unsigned grid = static_cast<unsigned>(x.rows);
  const bool groups = norm_groups_of_8(kAdd, res, x, w), out_groups = groups_of_8(out);
  dispatch_float(x.dtype, "rms_norm", [&](auto t) {
    using T = decltype(t);
    const auto run = [&](auto weight) {  // the weight's element type: f32 or T
      using W = decltype(weight);
      with_row_layout(groups, x.cols, [&](auto vec, auto per) {
        norm_rows_kernel<kAdd, T, W, NormOut::rows, decltype(vec)::value, decltype(per)::value>
            <<<grid, kThreads, 0, stream>>>(res, x, w, eps, out, {}, out_groups);
      });
    };
    if (w.dtype == ScalarType::f32) run(float{});
    else run(t);
  });
  return true;
}

// The norm that quantizes its output: f16 rows (the GPU linears' activations) and an f16 or f32 weight.
template <bool kAdd, NormOut kOut>
void launch_norm_quantize(const Rows& res, const Rows& x, const Rows& w, float eps, const QuantOut& q,
                          cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(x.rows);
  const bool groups = norm_groups_of_8(kAdd, res, x, w);
  const auto run = [&](auto weight) {  // the weight's element type: f32 or f16
    using W = decltype(weight);
    with_row_layout(groups, x.cols, [&](auto vec, auto per) {
      norm_rows_kernel<kAdd, __half, W, kOut, decltype(vec)::value, decltype(per)::value>
          <<<grid, kThreads, 0, stream>>>(res, x, w, eps, Rows{}, q);
    });
  };
  if (w.dtype == ScalarType::f32) run(float{});
  else run(__half{});
}

// Other dtype mixes, and rows wider than kMaxRegisterCols: the row is streamed twice (sum of squares,
// then the output).
__global__ void rms_norm_wide_kernel(Rows x, Rows w, float eps, Rows out) {
  const int64_t r = blockIdx.x;
  const void* xr = static_cast<const char*>(x.base) + r * x.stride * float_bytes(x.dtype);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < x.cols; i += kThreads) {
    const float v = load_any(xr, x.dtype, i);
    ss += v * v;
  }
  const float inv = inv_rms(ss, x.cols, eps);
  void* orow = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
  for (int64_t i = threadIdx.x; i < x.cols; i += kThreads)
    store_any(orow, out.dtype, i, load_any(xr, x.dtype, i) * inv * load_any(w.base, w.dtype, i));
}

__global__ void add_rms_norm_wide_kernel(Rows res, Rows x, Rows w, float eps, Rows out) {
  const int64_t r = blockIdx.x;
  void* rr = static_cast<char*>(res.base) + r * res.stride * float_bytes(res.dtype);
  const void* xr = static_cast<const char*>(x.base) + r * x.stride * float_bytes(x.dtype);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < x.cols; i += kThreads) {
    const float v = round_as(res.dtype, load_any(rr, res.dtype, i) + load_any(xr, x.dtype, i));
    store_any(rr, res.dtype, i, v);
    ss += v * v;
  }
  const float inv = inv_rms(ss, x.cols, eps);
  void* orow = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
  for (int64_t i = threadIdx.x; i < x.cols; i += kThreads)
    store_any(orow, out.dtype, i, load_any(rr, res.dtype, i) * inv * load_any(w.base, w.dtype, i));
}

// Element-wise kernels: a grid of (column chunks, rows), one element per thread, so a single row
// (batch-1 decode) is spread over many SMs instead of one block looping over it.
__global__ void silu_mul_kernel(Rows gu, Rows out) {
  pdl_allow_dependents();  // the down GEMM that reads `out` may launch meanwhile
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x, inter = out.cols;
  if (i >= inter) return;
  for (int64_t r = blockIdx.y; r < out.rows; r += gridDim.y) {
    const void* g = static_cast<const char*>(gu.base) + r * gu.stride * float_bytes(gu.dtype);
    void* o = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
    const float a = load_any(g, gu.dtype, i), b = load_any(g, gu.dtype, inter + i);
    store_any(o, out.dtype, i, a / (1.f + expf(-a)) * b);
  }
}

// f16/bf16 rows whose columns, strides and bases allow 16-byte accesses: 8 columns per thread (one load of the
// gate, one of the up half, one store), the same f32 expression per element as silu_mul_kernel. The scalar
// kernel ran a prefill's SiLU·mul at ~1.3 TB/s.
template <typename T>
__global__ void silu_mul_groups_kernel(Rows gu, Rows out) {
  pdl_allow_dependents();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 8, inter = out.cols;
  if (i >= inter) return;
  for (int64_t r = blockIdx.y; r < out.rows; r += gridDim.y) {
    const T* g = static_cast<const T*>(gu.base) + r * gu.stride;
    float a[8], b[8], o[8];
    load_group<8>(g + i, a);
    load_group<8>(g + inter + i, b);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = a[e] / (1.f + expf(-a[e])) * b[e];
    store_group<8>(static_cast<T*>(out.base) + r * out.stride + i, o);
  }
}

// SiLU·mul with the down linear's per-token quantizer fused (W8A8 / W4A8 / FP8): one block per row holds the row's
// f16 gate and up groups in registers (every load issued before the reduction), forms silu(g) * u with
// silu_mul_groups_kernel's f32 expression, rounds it to f16 as `out` would hold it, and writes the codes and scale
// quantize_per_token_{s8,e4m3} would make of that f16 row. At batch 1 this replaces two launches (the element-wise
// kernel, then the one-block quantizer) by one; the f16 row is never written.
constexpr int kActThreads = 512;

template <bool kFp8, int kGroups>
__global__ void __launch_bounds__(kActThreads) silu_mul_quantize_kernel(Rows gu, QuantOut qout) {
  pdl_allow_dependents();   // the down GEMM that reads the codes may launch and prefetch its weights meanwhile
  pdl_wait_for_producers();  // a programmatic dependent of the gate_up GEMM when launched so (no-op otherwise)
  const int64_t r = blockIdx.x;
  const int inter = static_cast<int>(gu.cols / 2);
  const __half* g = static_cast<const __half*>(gu.base) + r * gu.stride;
  float a[kGroups][8], b[kGroups][8];
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const int i = (static_cast<int>(threadIdx.x) + k * kActThreads) * 8;
    if (i < inter) {
      load_group<8>(g + i, a[k]);
      load_group<8>(g + inter + i, b[k]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) a[k][e] = b[k][e] = 0.f;  // silu(0) * 0 = 0: no effect on the max
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < kGroups; ++k)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float x = a[k][e];
      a[k][e] = round_to<__half>(x / (1.f + expf(-x)) * b[k][e]);
      amax = fmaxf(amax, fabsf(a[k][e]));
    }
  amax = block_reduce<kActThreads, true>(amax);
  const float s = row_scale<kFp8>(amax);
  if (threadIdx.x == 0) qout.scales[r] = s;
  uint8_t* qrow = qout.q + r * qout.ldq;
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const int i = (static_cast<int>(threadIdx.x) + k * kActThreads) * 8;
    if (i >= inter) continue;
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e) packed[e / 4] |= quantize_code<kFp8>(__fdiv_rn(a[k][e], s)) << (8 * (e % 4));
    *reinterpret_cast<uint2*>(qrow + i) = make_uint2(packed[0], packed[1]);
  }
}

// Batch-1..~16 decode: one block per row leaves all but a few SMs idle. On sm_90 the SiLU·mul quantizer spreads each
// of a few rows over a thread-block cluster and merges the row max through distributed shared memory (a max does
// not depend on order: the one-block bytes). The quantizing norm stays one block per row: a cluster form that kept
// its bits (every CTA summing the whole row's squares, only the divide/code chain split) measured slower on the
// H200 (3.20 vs 2.78 us at 4096 columns), and splitting the square sum would change them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
#endif
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The max of each CTA's `mine` over the cluster: publish, barrier (which also orders every CTA's earlier loads
// before any CTA's later stores), read every rank's value, then a relaxed arrive that says "done reading"; the
// caller must cluster_wait() before it exits so no CTA's shared memory goes away while read.
template <int kCluster>
__device__ __forceinline__ float cluster_max(float mine) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float cta_max;
  if (threadIdx.x == 0) cta_max = mine;
  cluster_arrive_release();
  cluster_wait();
  cg::cluster_group cluster = cg::this_cluster();
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < kCluster; ++k) m = fmaxf(m, *cluster.map_shared_rank(&cta_max, k));
  cluster_arrive_relaxed();
  return m;
#else
  return mine;
#endif
}

__device__ __forceinline__ int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<int>(cg::this_cluster().block_rank());
#else
  return 0;
#endif
}

// silu_mul_quantize_kernel spread over a cluster of kCluster CTAs per row (sm_90, few rows): CTA `rank` takes the
// kGroups x kThreads 8-column groups from (rank * kGroups) * kThreads on, kGroups per thread (k-th at thread + k *
// kThreads: coalesced), with the same f32 expression and f16 rounding per element; the row max is merged through
// distributed shared memory (a max: the one-block scale and codes, bit for bit). kGroups = 2 with 8 CTAs covers
// 32768 channels (Llama-3-70B's 28672 on one GPU), past the one-block kernel's 16384.
template <bool kFp8, int kCluster, int kGroups>
__global__ void __launch_bounds__(kThreads) silu_mul_quantize_cluster_kernel(Rows gu, QuantOut qout) {
  pdl_allow_dependents();
  pdl_wait_for_producers();
  const int rank = cluster_rank();
  const int64_t r = blockIdx.x / kCluster;
  const int inter = static_cast<int>(gu.cols / 2);
  const __half* g = static_cast<const __half*>(gu.base) + r * gu.stride;
  float a[kGroups][8], b[kGroups][8];
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const int i = ((rank * kGroups + k) * kThreads + static_cast<int>(threadIdx.x)) * 8;
    if (i < inter) {
      load_group<8>(g + i, a[k]);
      load_group<8>(g + inter + i, b[k]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) a[k][e] = b[k][e] = 0.f;
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < kGroups; ++k)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float x = a[k][e];
      a[k][e] = round_to<__half>(x / (1.f + expf(-x)) * b[k][e]);
      amax = fmaxf(amax, fabsf(a[k][e]));
    }
  amax = cluster_max<kCluster>(block_reduce<kThreads, true>(amax));
  const float s = row_scale<kFp8>(amax);
  if (rank == 0 && threadIdx.x == 0) qout.scales[r] = s;
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const int i = ((rank * kGroups + k) * kThreads + static_cast<int>(threadIdx.x)) * 8;
    if (i >= inter) continue;
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e) packed[e / 4] |= quantize_code<kFp8>(__fdiv_rn(a[k][e], s)) << (8 * (e % 4));
    *reinterpret_cast<uint2*>(qout.q + r * qout.ldq + i) = make_uint2(packed[0], packed[1]);
  }
  cluster_wait();
}

// Launches kernel over `rows` clusters of kCluster CTAs (kThreads each), as a programmatic dependent when `pdl`.
template <int kCluster, typename... Params, typename... Args>
void launch_cluster(const char* op, bool pdl, void (*kernel)(Params...), int64_t rows, cudaStream_t stream,
                    Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * kCluster));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2]{};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  LOWBIT_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Whether `rows` rows take clusters of `cluster` CTAs: sm_90+, and (auto mode) every row's cluster fits on the SMs
// at once (rows * cluster <= SMs); row_cluster_mode 0 never, 1 always on sm_90+.
std::atomic<int> g_row_cluster_mode{-1};

bool use_row_clusters(int64_t rows, int cluster) {
  const int mode = g_row_cluster_mode.load(std::memory_order_relaxed);
  if (mode == 0) return false;
  int device = 0;
  LOWBIT_CUDA_CHECK("row clusters", cudaGetDevice(&device));
  if (compute_capability_major(device) < 9) return false;
  if (mode == 1) return rows * cluster < (1LL << 31);
  return rows * cluster <= multiprocessor_count(device);
}

__global__ void embedding_kernel(const int32_t* ids, Rows table, Rows out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= out.cols) return;
  for (int64_t r = blockIdx.y; r < out.rows; r += gridDim.y) {
    const int32_t id = ids[r];
    void* o = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
    const bool ok = id >= 0 && id < table.rows;
    const void* t = static_cast<const char*>(table.base) + (ok ? id : 0) * table.stride * float_bytes(table.dtype);
    store_any(o, out.dtype, i, ok ? load_any(t, table.dtype, i) : NAN);
  }
}

__global__ void gather_columns_kernel(Rows x, const int32_t* perm, Rows out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= out.cols) return;
  const int32_t p = perm[j];
  const bool ok = p >= 0 && p < x.cols;
  for (int64_t r = blockIdx.y; r < out.rows; r += gridDim.y) {
    const void* xr = static_cast<const char*>(x.base) + r * x.stride * float_bytes(x.dtype);
    void* o = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
    store_any(o, out.dtype, j, ok ? load_any(xr, x.dtype, p) : NAN);  // f16/bf16 -> f32 -> same dtype: exact
  }
}

__global__ void add_bias_kernel(Rows y, Rows bias) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= y.cols) return;
  const float b = load_any(bias.base, bias.dtype, i);
  for (int64_t r = blockIdx.y; r < y.rows; r += gridDim.y) {
    void* yr = static_cast<char*>(y.base) + r * y.stride * float_bytes(y.dtype);
    store_any(yr, y.dtype, i, load_any(yr, y.dtype, i) + b);
  }
}

__global__ void cast_kernel(Rows x, Rows out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= x.cols) return;
  for (int64_t r = blockIdx.y; r < x.rows; r += gridDim.y) {
    const void* xr = static_cast<const char*>(x.base) + r * x.stride * float_bytes(x.dtype);
    static_cast<float*>(out.base)[r * out.stride + i] = load_any(xr, x.dtype, i);
  }
}

unsigned grid_of(int64_t rows, const char* op) {
  LOWBIT_CHECK(rows < (1LL << 31), op, ": too many rows (", rows, ")");
  return static_cast<unsigned>(rows);
}

// (column chunks, rows) for the element-wise kernels; rows past 65535 are looped over by the kernel.
dim3 elementwise_grid(int64_t rows, int64_t cols, const char* op) {
  LOWBIT_CHECK(cols < (1LL << 40), op, ": rows too wide (", cols, " columns)");
  return dim3(static_cast<unsigned>((cols + kThreads - 1) / kThreads), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

}  // namespace

void rms_norm(const Rows& x, const Rows& weight, float eps, const Rows& out, cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0) return;
  grid_of(x.rows, "rms_norm");  // checks the row count
  if (!launch_typed_norm<false>(Rows{}, x, weight, eps, out, stream))
    rms_norm_wide_kernel<<<grid_of(x.rows, "rms_norm"), kThreads, 0, stream>>>(x, weight, eps, out);
  LOWBIT_CUDA_CHECK_LAUNCH("rms_norm");
}

void add_rms_norm(const Rows& residual, const Rows& x, const Rows& weight, float eps, const Rows& out,
                  cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0) return;
  grid_of(x.rows, "add_rms_norm");  // checks the row count
  if (!launch_typed_norm<true>(residual, x, weight, eps, out, stream))
    add_rms_norm_wide_kernel<<<grid_of(x.rows, "add_rms_norm"), kThreads, 0, stream>>>(residual, x, weight, eps, out);
  LOWBIT_CUDA_CHECK_LAUNCH("add_rms_norm");
}

void norm_quantize(const Rows& residual, const Rows& x, const Rows& weight, float eps, void* q, int64_t ldq,
                   ScalarType q_type, float* scales, cudaStream_t stream) {
  constexpr const char* op = "norm_quantize";
  const Rows& rows = x.base ? x : residual;
  if (rows.rows == 0 || rows.cols == 0) return;
  grid_of(rows.rows, op);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, rows.cols <= kMaxRegisterCols && rows.dtype == ScalarType::f16 &&
                        residual.dtype == ScalarType::f16 &&
                        (weight.dtype == ScalarType::f16 || weight.dtype == ScalarType::f32),
                    op, ": needs f16 rows of at most ", kMaxRegisterCols, " columns and an f16/f32 weight, got ",
                    rows.cols, " columns of ", name_of(rows.dtype), ", weight ", name_of(weight.dtype));
  LOWBIT_CHECK_TYPE(q_type == ScalarType::s8 || q_type == ScalarType::e4m3, op, ": codes must be s8 or e4m3, got ",
                    name_of(q_type));
  const QuantOut qo{static_cast<uint8_t*>(q), ldq, scales};
  const bool fp8 = q_type == ScalarType::e4m3;
  if (x.base) {  // residual += x, then norm the residual
    if (fp8) launch_norm_quantize<true, NormOut::e4m3>(residual, x, weight, eps, qo, stream);
    else launch_norm_quantize<true, NormOut::int8>(residual, x, weight, eps, qo, stream);
  } else {  // norm `residual` as it is
    if (fp8) launch_norm_quantize<false, NormOut::e4m3>(Rows{}, residual, weight, eps, qo, stream);
    else launch_norm_quantize<false, NormOut::int8>(Rows{}, residual, weight, eps, qo, stream);
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

bool norm_quantize_fmpq(const Rows& residual, const Rows& x, const Rows& weight, float eps, const FmpqBits& bits,
                        const int32_t* perm, int8_t* q, int64_t ldq, float* scales, cudaStream_t stream) {
  constexpr const char* op = "norm_quantize_fmpq";
  const bool add = x.base != nullptr;
  const Rows& rows = add ? x : residual;
  if (rows.cols > kMaxRegisterCols || rows.dtype != ScalarType::f16 || residual.dtype != ScalarType::f16 ||
      (weight.dtype != ScalarType::f16 && weight.dtype != ScalarType::f32) ||
      (rows.cols + kFmpqBlock - 1) / kFmpqBlock > kFmpqMaxBlocks)
    return false;  // the caller runs the norm, then quantize_fmpq (the same bytes)
  if (rows.rows == 0 || rows.cols == 0) return true;
  const unsigned grid = grid_of(rows.rows, op);
  const FmpqOut fo{q, ldq, scales, perm, bits, reinterpret_cast<uintptr_t>(q) % 8 == 0 && ldq % 8 == 0};
  // The plain norm's layout for these rows (with_row_layout, norm_groups_of_8): the same square sum, so the same
  // f16 row as add_rms_norm / rms_norm would write.
  const bool groups = add ? norm_groups_of_8(true, residual, x, weight) : norm_groups_of_8(false, Rows{}, residual,
                                                                                           weight);
  const auto run = [&](auto add_c, auto weight_t) {
    constexpr bool kAdd = decltype(add_c)::value;
    using W = decltype(weight_t);
    with_row_layout(groups, rows.cols, [&](auto vec, auto per) {
      norm_rows_kernel<kAdd, __half, W, NormOut::fmpq, decltype(vec)::value, decltype(per)::value>
          <<<grid, kThreads, 0, stream>>>(kAdd ? residual : Rows{}, kAdd ? x : residual, weight, eps, Rows{}, {},
                                          false, fo);
    });
  };
  const auto with_weight = [&](auto add_c) {
    if (weight.dtype == ScalarType::f32) run(add_c, float{});
    else run(add_c, __half{});
  };
  if (add) with_weight(std::true_type{});
  else with_weight(std::false_type{});
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  return true;
}

void silu_mul(const Rows& gate_up, const Rows& out, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return;
  if (gate_up.dtype == out.dtype && out.dtype != ScalarType::f32 && out.cols % 8 == 0 && groups_of_8(gate_up) &&
      groups_of_8(out)) {
    dispatch_float(out.dtype, "silu_mul", [&](auto t) {
      using T = decltype(t);
      silu_mul_groups_kernel<T><<<elementwise_grid(out.rows, out.cols / 8, "silu_mul"), kThreads, 0, stream>>>(
          gate_up, out);
    });
  } else {
    silu_mul_kernel<<<elementwise_grid(out.rows, out.cols, "silu_mul"), kThreads, 0, stream>>>(gate_up, out);
  }
  LOWBIT_CUDA_CHECK_LAUNCH("silu_mul");
}

bool silu_mul_quantize(const Rows& gate_up, void* q, int64_t ldq, ScalarType q_type, float* scales, bool pdl,
                       cudaStream_t stream) {
  const int64_t inter = gate_up.cols / 2;
  if (gate_up.rows == 0 || inter == 0) return true;
  // Past the one-block kernel's 16384 channels only the cluster kernel with two groups per thread runs (few rows on
  // sm_90, up to 32768 channels); elsewhere the caller runs silu_mul, then the stand-alone quantizer (the same bytes).
  const bool wide = inter > int64_t{4} * 8 * kActThreads;
  if (gate_up.dtype != ScalarType::f16 || gate_up.cols % 16 != 0 || !groups_of_8(gate_up) ||
      reinterpret_cast<uintptr_t>(q) % 8 != 0 || ldq % 8 != 0 || inter > int64_t{2} * 8 * 8 * kThreads ||
      (q_type != ScalarType::s8 && q_type != ScalarType::e4m3))
    return false;
  int device = 0;
  LOWBIT_CUDA_CHECK("silu_mul_quantize", cudaGetDevice(&device));
  pdl = pdl && pdl_supported(device);
  const QuantOut qo{static_cast<uint8_t*>(q), ldq, scales};
  const dim3 grid(grid_of(gate_up.rows, "silu_mul_quantize"));
  // Few rows (batch-1 decode): a cluster of 2, 4 or 8 CTAs per row on sm_90 (the same bytes).
  const int cluster = inter <= 8 * kThreads ? 1 : inter <= 2 * 8 * kThreads ? 2 : inter <= 4 * 8 * kThreads ? 4 : 8;
  if (cluster > 1 && use_row_clusters(gate_up.rows, cluster)) {
    using std::integral_constant;
    const auto run_cluster = [&](auto fp8) {
      constexpr bool kFp8 = decltype(fp8)::value;
      const auto launch = [&](auto size, auto groups) {
        constexpr int kCluster = decltype(size)::value, kGroups = decltype(groups)::value;
        launch_cluster<kCluster>("silu_mul_quantize", pdl, silu_mul_quantize_cluster_kernel<kFp8, kCluster, kGroups>,
                                 gate_up.rows, stream, gate_up, qo);
      };
      if (cluster == 2) launch(integral_constant<int, 2>{}, integral_constant<int, 1>{});
      else if (cluster == 4) launch(integral_constant<int, 4>{}, integral_constant<int, 1>{});
      else if (!wide) launch(integral_constant<int, 8>{}, integral_constant<int, 1>{});
      else launch(integral_constant<int, 8>{}, integral_constant<int, 2>{});
    };
    if (q_type == ScalarType::e4m3) run_cluster(std::true_type{});
    else run_cluster(std::false_type{});
    LOWBIT_CUDA_CHECK_LAUNCH("silu_mul_quantize");
    return true;
  }
  if (wide) return false;  // too many rows for clusters (or not sm_90): the two-kernel path
  const auto run = [&](auto fp8, auto groups) {
    launch_maybe_pdl("silu_mul_quantize", pdl, silu_mul_quantize_kernel<decltype(fp8)::value, decltype(groups)::value>,
                     grid, dim3(kActThreads), 0, stream, gate_up, qo);
  };
  using std::integral_constant;
  const auto with_groups = [&](auto fp8) {
    if (inter <= 8 * kActThreads) run(fp8, integral_constant<int, 1>{});
    else if (inter <= 2 * 8 * kActThreads) run(fp8, integral_constant<int, 2>{});
    else run(fp8, integral_constant<int, 4>{});
  };
  if (q_type == ScalarType::e4m3) with_groups(std::true_type{});
  else with_groups(std::false_type{});
  LOWBIT_CUDA_CHECK_LAUNCH("silu_mul_quantize");
  return true;
}

int set_row_cluster_mode(int mode) { return g_row_cluster_mode.exchange(mode); }
int get_row_cluster_mode() { return g_row_cluster_mode.load(std::memory_order_relaxed); }

void embedding(const int32_t* ids, const Rows& table, const Rows& out, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return;
  embedding_kernel<<<elementwise_grid(out.rows, out.cols, "embedding"), kThreads, 0, stream>>>(ids, table, out);
  LOWBIT_CUDA_CHECK_LAUNCH("embedding");
}

void gather_columns(const Rows& x, const int32_t* perm, const Rows& out, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return;
  gather_columns_kernel<<<elementwise_grid(out.rows, out.cols, "gather_columns"), kThreads, 0, stream>>>(x, perm, out);
  LOWBIT_CUDA_CHECK_LAUNCH("gather_columns");
}

void add_bias(const Rows& y, const Rows& bias, cudaStream_t stream) {
  if (y.rows == 0 || y.cols == 0) return;
  add_bias_kernel<<<elementwise_grid(y.rows, y.cols, "add_bias"), kThreads, 0, stream>>>(y, bias);
  LOWBIT_CUDA_CHECK_LAUNCH("add_bias");
}

void cast_rows_to_f32(const Rows& x, const Rows& out, cudaStream_t stream) {
  LOWBIT_CHECK_TYPE(out.dtype == ScalarType::f32, "cast_rows_to_f32: 'out' must be f32, got ", name_of(out.dtype));
  if (x.rows == 0 || x.cols == 0) return;
  cast_kernel<<<elementwise_grid(x.rows, x.cols, "cast_rows_to_f32"), kThreads, 0, stream>>>(x, out);
  LOWBIT_CUDA_CHECK_LAUNCH("cast_rows_to_f32");
}

}  // namespace lowbit::cuda
