// DeviceSampler (model/device_sampler.h).
#include "model/device_sampler.h"

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit {

DeviceSampler::DeviceSampler(int64_t rows, const Device& device) : max_rows(rows) {
  // f64 values in s64 storage (lowbit tensors have no f64 dtype; only the kernel reads them)
  params_host = Tensor::empty({max_rows, 5}, ScalarType::s64);
  params_device = Tensor::empty({max_rows, 5}, ScalarType::s64, device);
  tokens_device = Tensor::empty({max_rows}, ScalarType::s32, device);
  logprobs_device = Tensor::empty({max_rows}, ScalarType::f32, device);
  tokens_host = Tensor::empty({max_rows}, ScalarType::s32);
  logprobs_host = Tensor::empty({max_rows}, ScalarType::f32);
}

void DeviceSampler::stage(const std::vector<RowSampling>& sampling, int64_t rows, const char* op) {
  stage(sampling, rows, static_cast<double*>(params_host.data_ptr()), op);
}

void DeviceSampler::stage(const std::vector<RowSampling>& sampling, int64_t rows, double* params, const char* op) {
  LOWBIT_CHECK(rows >= int64_t(sampling.size()) && rows <= max_rows, op, ": ", rows, " sampled rows (",
               sampling.size(), " requests), the sampler holds ", max_rows);
  for (int64_t i = 0; i < rows; ++i) {
    const RowSampling s = i < int64_t(sampling.size()) ? sampling[size_t(i)] : RowSampling{};
    LOWBIT_CHECK(s.temperature >= 0.f && s.top_p > 0.f && s.top_p <= 1.f && s.min_p >= 0.f && s.min_p <= 1.f &&
                     s.uniform >= 0.0 && s.uniform < 1.0,
                 op, ": row ", i, " has sampling parameters out of range");
    double* p = params + i * 5;
    p[0] = s.temperature, p[1] = s.top_k, p[2] = s.top_p, p[3] = s.min_p, p[4] = s.uniform;
  }
#ifdef LOWBIT_WITH_CUDA
  LOWBIT_CUDA_CHECK(op, cudaMemcpyAsync(params_device.data_ptr(), params, size_t(rows) * 5 * sizeof(double),
                                        cudaMemcpyHostToDevice, cuda::current_stream()));
#else
  LOWBIT_NOT_SUPPORTED(op, ": sampling on the GPU needs a CUDA build of lowbit");
#endif
}

#ifdef LOWBIT_WITH_CUDA

void DeviceSampler::sample(const Tensor& logits) const {
  const auto* params = static_cast<const double*>(params_device.data_ptr());
  cuda::sample_rows(cuda::Rows{logits.data_ptr(), logits.dtype(), logits.size(0), logits.size(1), logits.stride(0)},
                    params, tokens_device.data<int32_t>(), logprobs_device.data<float>(), cuda::current_stream());
}

void DeviceSampler::fetch(int64_t n, std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                          const char* op) const {
  const cudaStream_t stream = cuda::current_stream();
  LOWBIT_CUDA_CHECK(op, cudaMemcpyAsync(tokens_host.data_ptr(), tokens_device.data_ptr(), size_t(n) * 4,
                                        cudaMemcpyDeviceToHost, stream));
  LOWBIT_CUDA_CHECK(op, cudaMemcpyAsync(logprobs_host.data_ptr(), logprobs_device.data_ptr(), size_t(n) * 4,
                                        cudaMemcpyDeviceToHost, stream));
  LOWBIT_CUDA_CHECK(op, cudaStreamSynchronize(stream));  // kernel faults surface here
  tokens.assign(tokens_host.data<int32_t>(), tokens_host.data<int32_t>() + n);
  logprobs.assign(logprobs_host.data<float>(), logprobs_host.data<float>() + n);
}

void DeviceSampler::download_async(int64_t n, int32_t* tokens, float* logprobs, const char* op) const {
  const cudaStream_t stream = cuda::current_stream();
  LOWBIT_CUDA_CHECK(op, cudaMemcpyAsync(tokens, tokens_device.data_ptr(), size_t(n) * 4, cudaMemcpyDeviceToHost,
                                        stream));
  LOWBIT_CUDA_CHECK(op, cudaMemcpyAsync(logprobs, logprobs_device.data_ptr(), size_t(n) * 4, cudaMemcpyDeviceToHost,
                                        stream));
}

#else

void DeviceSampler::download_async(int64_t, int32_t*, float*, const char* op) const {
  LOWBIT_NOT_SUPPORTED(op, ": sampling on the GPU needs a CUDA build of lowbit");
}

void DeviceSampler::sample(const Tensor&) const {
  LOWBIT_NOT_SUPPORTED("DeviceSampler: sampling on the GPU needs a CUDA build of lowbit");
}
void DeviceSampler::fetch(int64_t, std::vector<int32_t>&, std::vector<float>&, const char* op) const {
  LOWBIT_NOT_SUPPORTED(op, ": sampling on the GPU needs a CUDA build of lowbit");
}

#endif

}  // namespace lowbit
