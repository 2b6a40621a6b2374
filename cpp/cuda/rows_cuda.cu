// Row-wise kernels of the forward pass on the GPU: RMSNorm (+ fused residual add), SiLU·mul,
// embedding gather, bias add, cast to f32. One block per row; f32 math, one rounding per output
// like the CPU kernels (cpp/kernels/cpu/elementwise_cpu.cpp).
#include <cmath>

#include "cuda/float_io.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 256;

// Block-wide sum; every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float s = lane < kThreads / 32 ? partial[lane] : 0.f;
  return warp_sum(s);
}

// rsqrt(mean(v^2) + eps) over the row, with the square sum accumulated in f32 per thread and the
// final mean and root in double (the CPU sums in double; the difference is far below f16/bf16 ulps).
__device__ float inv_rms(float ss, int64_t cols, float eps) {
  const float total = block_sum(ss);
  return static_cast<float>(1.0 / sqrt(static_cast<double>(total) / static_cast<double>(cols) + eps));
}

__global__ void rms_norm_kernel(Rows x, Rows w, float eps, Rows out) {
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

__global__ void add_rms_norm_kernel(Rows res, Rows x, Rows w, float eps, Rows out) {
  const int64_t r = blockIdx.x;
  void* rr = static_cast<char*>(res.base) + r * res.stride * float_bytes(res.dtype);
  const void* xr = static_cast<const char*>(x.base) + r * x.stride * float_bytes(x.dtype);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < x.cols; i += kThreads) {
    store_any(rr, res.dtype, i, load_any(rr, res.dtype, i) + load_any(xr, x.dtype, i));
    const float v = load_any(rr, res.dtype, i);  // normalize what the residual now holds (rounded)
    ss += v * v;
  }
  const float inv = inv_rms(ss, x.cols, eps);
  void* orow = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
  for (int64_t i = threadIdx.x; i < x.cols; i += kThreads)
    store_any(orow, out.dtype, i, load_any(rr, res.dtype, i) * inv * load_any(w.base, w.dtype, i));
}

__global__ void silu_mul_kernel(Rows gu, Rows out) {
  const int64_t r = blockIdx.x, inter = out.cols;
  const void* g = static_cast<const char*>(gu.base) + r * gu.stride * float_bytes(gu.dtype);
  void* o = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
  for (int64_t i = threadIdx.x; i < inter; i += kThreads) {
    const float a = load_any(g, gu.dtype, i);
    store_any(o, out.dtype, i, a / (1.f + expf(-a)) * load_any(g, gu.dtype, inter + i));
  }
}

__global__ void embedding_kernel(const int32_t* ids, Rows table, Rows out) {
  const int64_t r = blockIdx.x;
  const int32_t id = ids[r];
  void* o = static_cast<char*>(out.base) + r * out.stride * float_bytes(out.dtype);
  const bool ok = id >= 0 && id < table.rows;
  const void* t = static_cast<const char*>(table.base) + (ok ? id : 0) * table.stride * float_bytes(table.dtype);
  for (int64_t i = threadIdx.x; i < out.cols; i += kThreads)
    store_any(o, out.dtype, i, ok ? load_any(t, table.dtype, i) : NAN);
}

__global__ void add_bias_kernel(Rows y, Rows bias) {
  const int64_t r = blockIdx.x;
  void* yr = static_cast<char*>(y.base) + r * y.stride * float_bytes(y.dtype);
  for (int64_t i = threadIdx.x; i < y.cols; i += kThreads)
    store_any(yr, y.dtype, i, load_any(yr, y.dtype, i) + load_any(bias.base, bias.dtype, i));
}

__global__ void cast_kernel(Rows x, Rows out) {
  const int64_t r = blockIdx.x;
  const void* xr = static_cast<const char*>(x.base) + r * x.stride * float_bytes(x.dtype);
  float* o = static_cast<float*>(out.base) + r * out.stride;
  for (int64_t i = threadIdx.x; i < x.cols; i += kThreads) o[i] = load_any(xr, x.dtype, i);
}

unsigned grid_of(int64_t rows, const char* op) {
  LOWBIT_CHECK(rows < (1LL << 31), op, ": too many rows (", rows, ")");
  return static_cast<unsigned>(rows);
}

}  // namespace

void rms_norm(const Rows& x, const Rows& weight, float eps, const Rows& out, cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0) return;
  rms_norm_kernel<<<grid_of(x.rows, "rms_norm"), kThreads, 0, stream>>>(x, weight, eps, out);
  LOWBIT_CUDA_CHECK_LAUNCH("rms_norm");
}

void add_rms_norm(const Rows& residual, const Rows& x, const Rows& weight, float eps, const Rows& out,
                  cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0) return;
  add_rms_norm_kernel<<<grid_of(x.rows, "add_rms_norm"), kThreads, 0, stream>>>(residual, x, weight, eps, out);
  LOWBIT_CUDA_CHECK_LAUNCH("add_rms_norm");
}

void silu_mul(const Rows& gate_up, const Rows& out, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return;
  silu_mul_kernel<<<grid_of(out.rows, "silu_mul"), kThreads, 0, stream>>>(gate_up, out);
  LOWBIT_CUDA_CHECK_LAUNCH("silu_mul");
}

void embedding(const int32_t* ids, const Rows& table, const Rows& out, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return;
  embedding_kernel<<<grid_of(out.rows, "embedding"), kThreads, 0, stream>>>(ids, table, out);
  LOWBIT_CUDA_CHECK_LAUNCH("embedding");
}

void add_bias(const Rows& y, const Rows& bias, cudaStream_t stream) {
  if (y.rows == 0 || y.cols == 0) return;
  add_bias_kernel<<<grid_of(y.rows, "add_bias"), kThreads, 0, stream>>>(y, bias);
  LOWBIT_CUDA_CHECK_LAUNCH("add_bias");
}

void cast_rows_to_f32(const Rows& x, const Rows& out, cudaStream_t stream) {
  LOWBIT_CHECK_TYPE(out.dtype == ScalarType::f32, "cast_rows_to_f32: 'out' must be f32, got ", name_of(out.dtype));
  if (x.rows == 0 || x.cols == 0) return;
  cast_kernel<<<grid_of(x.rows, "cast_rows_to_f32"), kThreads, 0, stream>>>(x, out);
  LOWBIT_CUDA_CHECK_LAUNCH("cast_rows_to_f32");
}

}  // namespace lowbit::cuda
