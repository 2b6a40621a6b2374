// RoPE on the GPU (same math as cpp/kernels/cpu/rope_cpu.cpp): pair (a, b) at position p turns by
// p * inv_freq[i]; neox pairs (i, i + rd/2), GPT-J pairs (2i, 2i+1). The frequency table comes from
// the host (llama3/linear scaling already applied, in double); the angle and its sine/cosine are
// computed in double because p * inv_freq reaches 1e5+ rad, where f32 loses ~1e-2.
#include "cuda/float_io.cuh"
#include "cuda/rope_turn.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

constexpr int kMaxHalf = kMaxRopeHalf;

struct RopeArgs {
  void* x;
  ScalarType dtype;
  int64_t stride_t, stride_h;  // elements
  int heads, half;
  bool neox;
  const int32_t* positions;
  double inv_freq[kMaxHalf];
};

// Grid (token, head); each thread turns pairs i = threadIdx.x, threadIdx.x + blockDim.x, ...
__global__ void rope_kernel(RopeArgs a) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const double pos = static_cast<double>(a.positions[t]);
  char* row = static_cast<char*>(a.x) + (t * a.stride_t + h * a.stride_h) * float_bytes(a.dtype);
  for (int i = threadIdx.x; i < a.half; i += blockDim.x)
    rope_turn_pair(row, a.dtype, pos, a.inv_freq[i], i, a.half, a.neox);
}

void launch(Tensor& x, RopeArgs& a, cudaStream_t stream) {
  if (!x.defined() || x.size(0) == 0 || x.size(1) == 0) return;
  a.x = x.data_ptr();
  a.dtype = x.dtype();
  a.stride_t = x.stride(0);
  a.stride_h = x.stride(1);
  a.heads = static_cast<int>(x.size(1));
  LOWBIT_CHECK(x.size(0) < (1LL << 31) && x.size(1) < 65536, "rope: too many tokens or heads: ", x.str());
  const dim3 grid(static_cast<unsigned>(x.size(0)), static_cast<unsigned>(x.size(1)));
  const int threads = a.half >= 64 ? 64 : 32;
  rope_kernel<<<grid, threads, 0, stream>>>(a);
  LOWBIT_CUDA_CHECK_LAUNCH("rope");
}

}  // namespace

void rope(Tensor& q, Tensor& k, const Tensor& positions, const std::vector<double>& inv_freq, bool neox,
          cudaStream_t stream) {
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, !inv_freq.empty() && inv_freq.size() <= size_t(kMaxHalf),
                    "rope: rotary_dim ", 2 * inv_freq.size(), " has no GPU kernel (supported: 2..", 2 * kMaxHalf, ")");
  RopeArgs a{};
  a.half = static_cast<int>(inv_freq.size());
  a.neox = neox;
  a.positions = positions.data<int32_t>();
  for (size_t i = 0; i < inv_freq.size(); ++i) a.inv_freq[i] = inv_freq[i];
  launch(q, a, stream);
  launch(k, a, stream);
}

}  // namespace lowbit::cuda
