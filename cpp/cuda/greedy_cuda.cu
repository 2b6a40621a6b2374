// Greedy decoding on the GPU: per row of logits, the first index of the largest value (as
// std::max_element on the host picks it) and that token's log-softmax, so a greedy decode step
// downloads 8 bytes per sequence instead of a row of vocab floats.
#include <cfloat>
#include <climits>

#include "cuda/float_io.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 512;

struct Best {
  float value;
  int index;
};
// Larger value wins; among equal values the lower index (NaN never wins: comparisons are false).
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

__global__ void greedy_kernel(Rows logits, int32_t* tokens, float* logprobs) {
  const int64_t r = blockIdx.x;
  const void* row = static_cast<const char*>(logits.base) + r * logits.stride * float_bytes(logits.dtype);
  Best best{-FLT_MAX, INT_MAX};
  for (int64_t i = threadIdx.x; i < logits.cols; i += kThreads)
    best = better(best, Best{load_any(row, logits.dtype, i), static_cast<int>(i)});
  for (int o = 16; o > 0; o >>= 1)
    best = better(best, Best{__shfl_xor_sync(0xffffffffu, best.value, o), __shfl_xor_sync(0xffffffffu, best.index, o)});
  __shared__ Best warp_best[kThreads / 32];
  __shared__ float warp_sum_exp[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  best = warp_best[0];
  for (int w = 1; w < kThreads / 32; ++w) best = better(best, warp_best[w]);
  if (best.index == INT_MAX) best.index = 0;  // an all -inf / NaN row: token 0, logprob NaN below
  // log-softmax of the winner: -(log sum_i exp(l_i - max)).
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < logits.cols; i += kThreads) s += __expf(load_any(row, logits.dtype, i) - best.value);
  s = warp_sum(s);
  if (lane == 0) warp_sum_exp[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sum_exp[w];
    tokens[r] = best.index;
    logprobs[r] = load_any(row, logits.dtype, best.index) - best.value - logf(total);
  }
}

}  // namespace

void greedy_rows(const Rows& logits, int32_t* tokens, float* logprobs, cudaStream_t stream) {
  LOWBIT_CHECK(logits.cols > 0 && logits.cols < (int64_t(1) << 31), "greedy_rows: vocabulary of ", logits.cols,
               " entries is outside 1..2^31-1");
  if (logits.rows == 0) return;
  LOWBIT_CHECK(logits.rows < (int64_t(1) << 31), "greedy_rows: too many rows: ", logits.rows);
  greedy_kernel<<<static_cast<unsigned>(logits.rows), kThreads, 0, stream>>>(logits, tokens, logprobs);
  LOWBIT_CUDA_CHECK_LAUNCH("greedy_rows");
}

}  // namespace lowbit::cuda
