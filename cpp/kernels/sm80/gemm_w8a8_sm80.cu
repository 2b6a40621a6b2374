// W8A8 GEMMs for the sm80 family and the per-token activation quantizers that feed them (per-token
// activation scale x per-channel weight scale, applied in the epilogue): int8 (SmoothQuant W8A8,
// mma.sync m16n8k32 s8 x s8 -> s32) and fp8 e4m3 (mma.sync m16n8k32 e4m3 x e4m3 -> f32, sm_89+; the
// 8-bit fragments have the same layout, so one kernel template serves both). On sm_90 both GEMMs run
// the wgmma/TMA kernel of cpp/kernels/sm90/gemm_w8a8_sm90.cu instead (see pick_kernel; Gemm8Options names it).
//
// Tiles: 128x128 outputs per block of 8 warps (2 x 4, 64x32 per warp), k in steps of 64 bytes,
// three cp.async stages in shared memory (rows padded to 80 bytes so ldmatrix is conflict-free).
// The s8 m16n8k32 fragments have the byte layout of f16 m16n8k16 fragments, so ldmatrix.x4 loads
// them directly. Rows past m or n are zero-filled by the copy (src-size 0); k must be a multiple
// of 64.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/quantize_code.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"

namespace lowbit::cuda {
namespace detail {  // cpp/kernels/sm90/gemm_w8a8_sm90.cu (wgmma + TMA, built for sm_90a)
bool gemm_w8a8_sm90_usable(const char* op, int device);
void gemm_w8a8_sm90(const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y, int64_t ldy,
                    bool raw, int m, int n, int k, const Gemm8Options& o, cudaStream_t stream);
void gemm_fp8_sm90(const int8_t* xq, const int8_t* wq, const float* xs, const float* ws, void* y, int64_t ldy,
                   bool raw, int m, int n, int k, const Gemm8Options& o, cudaStream_t stream);
}  // namespace detail
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3, kThreads = 256;
constexpr int kRowBytes = kBK + 16;  // padded smem row
constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
constexpr int kSmemBytes = kStages * kStageBytes;

__device__ inline void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending)); }

__device__ inline void ldmatrix_x4(const void* smem, uint32_t (&r)[4]) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ inline void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// e4m3 x e4m3 -> f32 (sm_89+). Products of two e4m3 values are exact in f32; only the sums round.
__device__ inline void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the host launches fp8 only on sm_89+
#endif
}
__device__ inline void mma8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { mma_s8(c, a, b0, b1); }
__device__ inline void mma8(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { mma_e4m3(c, a, b0, b1); }

struct W8A8Args {
  const int8_t* x;  // [m, k] row-major (s8, or e4m3 bytes)
  const int8_t* w;  // [n, k] row-major
  const float* x_scale;  // [m]
  const float* w_scale;  // [n]
  void* y;               // [m, n]: f16 scaled, or the raw accumulators (s32 / f32)
  int64_t ldy;
  int m, n, k;
};

// Copies one stage (A rows m0.., B rows n0.., k bytes k0..k0+63) into shared memory.
__device__ inline void load_stage(const W8A8Args& p, uint8_t* stage, int m0, int n0, int k0) {
  for (int c = threadIdx.x; c < (kBM + kBN) * (kBK / 16); c += kThreads) {
    const int row = c / (kBK / 16), col = (c % (kBK / 16)) * 16;
    const bool is_a = row < kBM;
    const int r = is_a ? m0 + row : n0 + row - kBM;
    const bool valid = r < (is_a ? p.m : p.n);
    const int8_t* src = (is_a ? p.x : p.w) + static_cast<int64_t>(valid ? r : 0) * p.k + k0 + col;
    cp_async16_zfill(stage + row * kRowBytes + col, src, valid);
  }
}

// Acc = int: s8 operands; Acc = float: e4m3 operands. kRaw writes the accumulators unscaled.
template <typename Acc, bool kRaw>
__global__ void __launch_bounds__(kThreads) gemm_w8a8_kernel(W8A8Args p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;  // warp tile origin inside the block tile
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const int k_steps = p.k / kBK;

  Acc acc[4][4][4] = {};  // [m16 tile][n8 tile][fragment]
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_steps) load_stage(p, smem + s * kStageBytes, m0, n0, s * kBK);
    cp_async_commit();
  }
  for (int ks = 0; ks < k_steps; ++ks) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage ks visible to all; stage ks-1 fully consumed
    const int next = ks + kStages - 1;
    if (next < k_steps) load_stage(p, smem + (next % kStages) * kStageBytes, m0, n0, next * kBK);
    cp_async_commit();

    const uint8_t* a_base = smem + (ks % kStages) * kStageBytes;
    const uint8_t* b_base = a_base + kBM * kRowBytes;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32) {
      uint32_t a[4][4], b[4][2];
      // A: matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31), (rows 8-15, k 16-31)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = wm + i * 16 + (lane & 15), col = kk + (lane >> 4) * 16;
        ldmatrix_x4(a_base + row * kRowBytes + col, a[i]);
      }
      // B: matrices (n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15), (n 8-15, k 16-31)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t r[4];
        const int row = wn + j * 16 + (lane & 7) + ((lane >> 4) << 3), col = kk + ((lane >> 3) & 1) * 16;
        ldmatrix_x4(b_base + row * kRowBytes + col, r);
        b[2 * j][0] = r[0];
        b[2 * j][1] = r[1];
        b[2 * j + 1][0] = r[2];
        b[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma8(acc[i][j], a[i], b[j][0], b[j][1]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: c0,c1 = (row g, cols 2t, 2t+1), c2,c3 = (row g+8, same cols).
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int row = m0 + wm + i * 16 + g + (c >> 1) * 8, col = n0 + wn + j * 8 + 2 * t + (c & 1);
        if (row >= p.m || col >= p.n) continue;
        if constexpr (kRaw) {
          static_cast<Acc*>(p.y)[row * p.ldy + col] = acc[i][j][c];
        } else {
          const float v = static_cast<float>(acc[i][j][c]) * p.x_scale[row] * p.w_scale[col];
          static_cast<__half*>(p.y)[row * p.ldy + col] = __float2half_rn(v);
        }
      }
}

// Per row, s = max|x| / qmax (s = 1 for an all-zero row), computed in f32. int8: q = rint(x / s) with
// qmax 127; fp8: q = e4m3(x / s) rounded to nearest even, saturated, with qmax 448 (the largest e4m3).
template <bool kFp8>
__global__ void quantize_per_token_kernel(const __half* __restrict__ x, int64_t ldx, int k, uint8_t* __restrict__ q,
                                          int64_t ldq, float* __restrict__ scales) {
  const int row = blockIdx.x;
  const __half* xr = x + row * ldx;
  float amax = 0.f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(__half2float(xr[i])));
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = row_scale<kFp8>(amax);
  if (threadIdx.x == 0) scales[row] = s;
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const float v = __fdiv_rn(__half2float(xr[i]), s);
    q[row * ldq + i] = static_cast<uint8_t>(quantize_code<kFp8>(v));
  }
}

// Same result, for rows of 8-half vectors (16-byte aligned x rows, 8-byte aligned q rows): every
// load of the row is issued up front and kept in registers for the second pass, so a row costs one
// memory latency instead of k / blockDim dependent rounds.
template <bool kFp8, int kVec>
__global__ void __launch_bounds__(256) quantize_per_token_vec_kernel(const __half* __restrict__ x, int64_t ldx, int k,
                                                                     uint8_t* __restrict__ q, int64_t ldq,
                                                                     float* __restrict__ scales) {
  const int row = blockIdx.x, nvec = k / 8;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * ldx);
  uint4 v[kVec];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int idx = threadIdx.x + i * 256;
    v[i] = idx < nvec ? xr[idx] : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const __half2* h = reinterpret_cast<const __half2*>(&v[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(h[j]);
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  __shared__ float warp_max[8];
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = row_scale<kFp8>(amax);
  if (threadIdx.x == 0) scales[row] = s;
  uint2* qr = reinterpret_cast<uint2*>(q + row * ldq);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int idx = threadIdx.x + i * 256;
    if (idx >= nvec) break;
    const __half2* h = reinterpret_cast<const __half2*>(&v[i]);
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(h[j]);
      const uint32_t a = quantize_code<kFp8>(__fdiv_rn(f.x, s)), b = quantize_code<kFp8>(__fdiv_rn(f.y, s));
      packed[j / 2] |= (a | b << 8) << (16 * (j % 2));
    }
    qr[idx] = make_uint2(packed[0], packed[1]);
  }
}

}  // namespace

namespace {

// The checks both per-token quantizers share: x f16 [m, k] (unit last stride), q of `q_dtype`
// [m, k], scales f32 [m].
void check_quantize_args(const char* op, const Tensor& x, const Tensor& q, ScalarType q_dtype, const Tensor& scales) {
  check_cuda_tensor(x, op, "x");
  check_dtype(x, ScalarType::f16, op, "x");
  check_dim(x, 2, op, "x");
  LOWBIT_CHECK(x.stride(1) == 1, op, ": argument 'x' needs unit stride in the last dim");
  const int64_t m = x.size(0), k = x.size(1);
  check_same_device(q, x, op, "q");
  check_dtype(q, q_dtype, op, "q");
  check_shape(q, {m, k}, op, "q");
  LOWBIT_CHECK(q.stride(1) == 1, op, ": argument 'q' needs unit stride in the last dim");
  check_same_device(scales, x, op, "scales");
  check_dtype(scales, ScalarType::f32, op, "scales");
  check_shape(scales, {m}, op, "scales");
  check_contiguous(scales, op, "scales");
}

// The checks both 8-bit GEMMs share; returns true when y takes the raw accumulators (raw_dtype).
bool check_gemm8_args(const char* op, const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale,
                      const Tensor& y, ScalarType elem, ScalarType raw_dtype) {
  check_cuda_tensor(xq, op, "xq");
  check_dtype(xq, elem, op, "xq");
  check_dim(xq, 2, op, "xq");
  check_contiguous(xq, op, "xq");
  const int64_t m = xq.size(0), k = xq.size(1);
  check_same_device(wq, xq, op, "wq");
  check_dtype(wq, elem, op, "wq");
  check_dim(wq, 2, op, "wq");
  check_contiguous(wq, op, "wq");
  const int64_t n = wq.size(0);
  LOWBIT_CHECK(wq.size(1) == k, op, ": argument 'wq' has k=", wq.size(1), " but 'xq' has k=", k);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, k % kBK == 0, op, ": k must be a multiple of ", kBK, ", got k=", k);
  LOWBIT_CHECK(reinterpret_cast<uintptr_t>(xq.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(wq.data_ptr()) % 16 == 0,
               op, ": 'xq' and 'wq' must start 16-byte aligned");
  check_same_device(y, xq, op, "y");
  LOWBIT_CHECK_TYPE(y.dtype() == ScalarType::f16 || y.dtype() == raw_dtype, op, ": argument 'y' must be f16 (scaled) or ",
                    name_of(raw_dtype), " (raw accumulators), got ", name_of(y.dtype()));
  check_shape(y, {m, n}, op, "y");
  LOWBIT_CHECK(y.stride(1) == 1, op, ": argument 'y' needs unit stride in the last dim");
  const bool raw = y.dtype() == raw_dtype;
  if (!raw) {
    check_same_device(x_scale, xq, op, "x_scale");
    check_dtype(x_scale, ScalarType::f32, op, "x_scale");
    check_shape(x_scale, {m}, op, "x_scale");
    check_contiguous(x_scale, op, "x_scale");
    check_same_device(w_scale, xq, op, "w_scale");
    check_dtype(w_scale, ScalarType::f32, op, "w_scale");
    check_shape(w_scale, {n}, op, "w_scale");
    check_contiguous(w_scale, op, "w_scale");
  }
  return raw;
}

// The mma.sync kernel on checked arguments: Acc int for s8 operands, float for e4m3.
template <typename Acc>
void launch_gemm8(const char* op, const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale,
                  Tensor& y, bool raw, cudaStream_t stream) {
  const int64_t m = xq.size(0), k = xq.size(1), n = wq.size(0);
  W8A8Args p{static_cast<const int8_t*>(xq.data_ptr()), static_cast<const int8_t*>(wq.data_ptr()),
             raw ? nullptr : x_scale.data<float>(), raw ? nullptr : w_scale.data<float>(), y.data_ptr(), y.stride(0),
             static_cast<int>(m), static_cast<int>(n), static_cast<int>(k)};
  const dim3 grid(static_cast<unsigned>((n + kBN - 1) / kBN), static_cast<unsigned>((m + kBM - 1) / kBM));
  auto kernel = raw ? gemm_w8a8_kernel<Acc, true> : gemm_w8a8_kernel<Acc, false>;
  LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

// Which kernel an 8-bit GEMM runs: the one Gemm8Options names (a plan always names one), or for the
// op-level `automatic` the wgmma kernel where it can run (sm_90 with the 90a image) and mma.sync
// elsewhere. A named sm90 kernel that cannot run is an error, never a quiet sm80 run.
bool use_sm90(const char* op, int device, int64_t k, const Gemm8Options& o) {
  if (o.kernel == Gemm8Kernel::sm80) return false;
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, o.kernel != Gemm8Kernel::gemv, op,
                    ": the gemv kernel is W4A8's only; name 'sm80' or 'sm90'");
  const bool usable90 = k > 0 && detail::gemm_w8a8_sm90_usable(op, device);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, o.kernel != Gemm8Kernel::sm90 || usable90, op,
                    ": the sm90 (wgmma) kernel needs an sm_90 device and k > 0");
  return usable90;
}

// Compute capability 8.9 or newer (e4m3 tensor-core instructions).
bool has_fp8_mma(int device) {
  int major = 0, minor = 0;
  LOWBIT_CUDA_CHECK("gemm_fp8", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  LOWBIT_CUDA_CHECK("gemm_fp8", cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor >= 89;
}

// One block per row. Rows of 8-half vectors (up to 8 x 256 x 16 halves) take the vector kernel, the
// rest the scalar loop; both give the same codes and scales.
template <bool kFp8>
void launch_quantize(const char* op, const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream) {
  const int64_t m = x.size(0), k = x.size(1);
  if (m == 0) return;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(x.device().index));
  const bool vec = k % 8 == 0 && k <= 8 * 256 * 16 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                   x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(q.data_ptr()) % 8 == 0 && q.stride(0) % 8 == 0;
  const int per_thread = static_cast<int>((k / 8 + 255) / 256);  // 8-half vectors per thread
  const unsigned blocks = static_cast<unsigned>(m);
  const __half* xp = x.data<__half>();
  uint8_t* qp = static_cast<uint8_t*>(q.data_ptr());
  float* sp = scales.data<float>();
  const int ki = static_cast<int>(k);
  if (!vec) {
    quantize_per_token_kernel<kFp8><<<blocks, 256, 0, stream>>>(xp, x.stride(0), ki, qp, q.stride(0), sp);
  } else if (per_thread <= 1) {
    quantize_per_token_vec_kernel<kFp8, 1><<<blocks, 256, 0, stream>>>(xp, x.stride(0), ki, qp, q.stride(0), sp);
  } else if (per_thread <= 2) {
    quantize_per_token_vec_kernel<kFp8, 2><<<blocks, 256, 0, stream>>>(xp, x.stride(0), ki, qp, q.stride(0), sp);
  } else if (per_thread <= 4) {
    quantize_per_token_vec_kernel<kFp8, 4><<<blocks, 256, 0, stream>>>(xp, x.stride(0), ki, qp, q.stride(0), sp);
  } else if (per_thread <= 8) {
    quantize_per_token_vec_kernel<kFp8, 8><<<blocks, 256, 0, stream>>>(xp, x.stride(0), ki, qp, q.stride(0), sp);
  } else {
    quantize_per_token_vec_kernel<kFp8, 16><<<blocks, 256, 0, stream>>>(xp, x.stride(0), ki, qp, q.stride(0), sp);
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

void quantize_per_token_s8(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream) {
  const char* op = "quantize_per_token_s8";
  check_quantize_args(op, x, q, ScalarType::s8, scales);
  launch_quantize<false>(op, x, q, scales, stream);
}

void gemm_w8a8(const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale, Tensor& y,
               cudaStream_t stream, const Gemm8Options& options) {
  const char* op = "gemm_w8a8";
  const bool raw = check_gemm8_args(op, xq, x_scale, wq, w_scale, y, ScalarType::s8, ScalarType::s32);
  const int64_t m = xq.size(0), k = xq.size(1), n = wq.size(0);
  if (m == 0 || n == 0) return;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(xq.device().index));
  if (use_sm90(op, xq.device().index, k, options)) {
    detail::gemm_w8a8_sm90(xq.data<int8_t>(), wq.data<int8_t>(), raw ? nullptr : x_scale.data<float>(),
                           raw ? nullptr : w_scale.data<float>(), y.data_ptr(), y.stride(0), raw, static_cast<int>(m),
                           static_cast<int>(n), static_cast<int>(k), options, stream);
    return;
  }
  launch_gemm8<int>(op, xq, x_scale, wq, w_scale, y, raw, stream);
}

void quantize_per_token_e4m3(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream) {
  const char* op = "quantize_per_token_e4m3";
  check_quantize_args(op, x, q, ScalarType::e4m3, scales);
  launch_quantize<true>(op, x, q, scales, stream);
}

void gemm_fp8(const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale, Tensor& y,
              cudaStream_t stream, const Gemm8Options& options) {
  const char* op = "gemm_fp8";
  const bool raw = check_gemm8_args(op, xq, x_scale, wq, w_scale, y, ScalarType::e4m3, ScalarType::f32);
  const int64_t m = xq.size(0), k = xq.size(1), n = wq.size(0);
  if (m == 0 || n == 0) return;
  const int dev = xq.device().index;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(dev));
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, has_fp8_mma(dev), op,
                    ": fp8 e4m3 tensor-core GEMMs need compute capability 8.9 or newer (Ada, Hopper)");
  if (use_sm90(op, dev, k, options)) {  // the e4m3 codes travel as bytes; the kernel reads them as e4m3
    detail::gemm_fp8_sm90(static_cast<const int8_t*>(xq.data_ptr()), static_cast<const int8_t*>(wq.data_ptr()),
                          raw ? nullptr : x_scale.data<float>(), raw ? nullptr : w_scale.data<float>(), y.data_ptr(),
                          y.stride(0), raw, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), options,
                          stream);
    return;
  }
  launch_gemm8<float>(op, xq, x_scale, wq, w_scale, y, raw, stream);
}

}  // namespace lowbit::cuda
