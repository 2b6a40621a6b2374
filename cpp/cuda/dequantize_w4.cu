// Dequantizes arch-neutral group-wise u4 weights (WeightFormat::w4) to f16/bf16 on the GPU:
// w = (q - zero) * scale, computed in f32 and rounded once. Each thread handles 8 consecutive
// elements of the flattened [n, k] matrix (one 32-bit word of packed nibbles when aligned).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"

namespace lowbit::cuda {
namespace {

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void dequantize_w4_kernel(const uint8_t* __restrict__ q, const __half* __restrict__ scales,
                                     const __half* __restrict__ zeros, int64_t n, int64_t k, int group,
                                     int64_t groups, T* __restrict__ out) {
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  const int64_t total = n * k;
  if (first >= total) return;
  int64_t row = first / k, col = first % k;
  for (int i = 0; i < 8 && first + i < total; ++i) {
    const int64_t e = first + i;
    const int v = (q[e >> 1] >> ((e & 1) * 4)) & 0xF;
    const int64_t p = row * groups + col / group;
    const float zero = zeros ? __half2float(zeros[p]) : 8.f;
    out[e] = from_float<T>((static_cast<float>(v) - zero) * __half2float(scales[p]));
    if (++col == k) {
      col = 0;
      ++row;
    }
  }
}

}  // namespace

void dequantize_w4(const Tensor& q, const Tensor& scales, const Tensor& zeros, int group, Tensor& out,
                   cudaStream_t stream) {
  const char* op = "dequantize_w4";
  check_cuda_tensor(q, op, "q");
  check_dtype(q, ScalarType::u4, op, "q");
  check_dim(q, 2, op, "q");
  check_contiguous(q, op, "q");
  LOWBIT_CHECK(group > 0, op, ": argument 'group' must be positive, got ", group);
  const int64_t n = q.size(0), k = q.size(1), groups = (k + group - 1) / group;
  check_same_device(scales, q, op, "scales");
  check_dtype(scales, ScalarType::f16, op, "scales");
  check_shape(scales, {n, groups}, op, "scales");
  check_contiguous(scales, op, "scales");
  if (zeros.defined()) {
    check_same_device(zeros, q, op, "zeros");
    check_dtype(zeros, ScalarType::f16, op, "zeros");
    check_shape(zeros, {n, groups}, op, "zeros");
    check_contiguous(zeros, op, "zeros");
  }
  check_same_device(out, q, op, "out");
  LOWBIT_CHECK_TYPE(out.dtype() == ScalarType::f16 || out.dtype() == ScalarType::bf16, op,
                    ": argument 'out' must be f16 or bf16, got ", name_of(out.dtype()));
  check_shape(out, {n, k}, op, "out");
  check_contiguous(out, op, "out");
  if (n * k == 0) return;

  LOWBIT_CUDA_CHECK(op, cudaSetDevice(q.device().index));
  const int threads = 256;
  const int64_t blocks = (n * k + threads * 8 - 1) / (threads * 8);
  const auto* zp = zeros.defined() ? zeros.data<__half>() : nullptr;
  if (out.dtype() == ScalarType::f16)
    dequantize_w4_kernel<__half><<<blocks, threads, 0, stream>>>(q.data<uint8_t>(), scales.data<__half>(), zp, n, k,
                                                                 group, groups, out.data<__half>());
  else
    dequantize_w4_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
        q.data<uint8_t>(), scales.data<__half>(), zp, n, k, group, groups, out.data<__nv_bfloat16>());
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
