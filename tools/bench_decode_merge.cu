// Times the split merge of decode attention alone (decode_merge_sm80.cuh) against the version before it (one block
// per (sequence, head), stats chunk, block max, then float4 columns; kept below as `before`), on random partials at
// the split counts decode_attention picks for Llama-3-8B heads (32 q heads, head_dim 128) on a 132-SM card, and checks
// that both give the same outputs. Each timing: a CUDA graph of 100 launches (no host launch cost between them),
// median of 7 replays, per launch: the kernel plus the gap between two graph nodes. Build and run on the device:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I include -I cpp \
//     tools/bench_decode_merge.cu -o /tmp/dm && /tmp/dm
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/sm80/decode_merge_sm80.cuh"

using namespace lowbit::cuda;

namespace before {
using decode_merge::kNoScore;
constexpr int kCombineThreads = 128, kCombineChunk = kCombineThreads;

__device__ inline float block_reduce(float x, bool max_op, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = max_op ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // scratch free (an earlier reduction's readers are done)
  if ((threadIdx.x & 31) == 0) scratch[warp] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) x = max_op ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

__global__ void __launch_bounds__(kCombineThreads) combine_splits_kernel(const float* __restrict__ part_out,
                                                                         const float2* __restrict__ part_stats,
                                                                         int splits, int hq, int d, __half* out,
                                                                         int64_t out_stride_b, int64_t out_stride_h) {
  pdl_allow_dependents();
  __shared__ float scratch[kCombineThreads / 32];
  __shared__ float weight[kCombineChunk];
  __shared__ __align__(16) float group_sum[4 * kCombineThreads];
  const int b = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int64_t slot0 = (static_cast<int64_t>(b) * hq + h) * splits;
  const float2* stats = part_stats + slot0;
  float m = kNoScore;
  for (int s = tid; s < splits; s += kCombineThreads) m = fmaxf(m, __ldg(stats + s).x);
  m = block_reduce(m, true, scratch);
  const int cols = d / 4, groups = kCombineThreads / cols, group = tid / cols, col = tid % cols;
  float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
  float den = 0.f;
  for (int c0 = 0; c0 < splits; c0 += kCombineChunk) {
    const int cn = min(kCombineChunk, splits - c0);
    __syncthreads();  // the previous chunk's weights are read
    if (tid < cn) {
      const float2 st = __ldg(stats + c0 + tid);
      const float w = st.y > 0.f ? __expf(st.x - m) : 0.f;
      weight[tid] = w;
      den += w * st.y;
    }
    __syncthreads();
    if (group < groups) {
      const float4* po = reinterpret_cast<const float4*>(part_out + (slot0 + c0) * d) + col;
#pragma unroll 4
      for (int s = group; s < cn; s += groups) {
        const float w = weight[s];
        const float4 x = __ldg(po + static_cast<int64_t>(s) * cols);
        num.x += w * x.x; num.y += w * x.y; num.z += w * x.z; num.w += w * x.w;
      }
    }
  }
  den = block_reduce(den, false, scratch);
  if (group < groups) reinterpret_cast<float4*>(group_sum)[group * cols + col] = num;
  __syncthreads();
  for (int i = tid; i < d; i += kCombineThreads) {
    float o = 0.f;
    for (int g = 0; g < groups; ++g) o += group_sum[g * d + i];
    out[b * out_stride_b + h * out_stride_h + i] = __float2half_rn(den > 0.f ? o / den : 0.f);
  }
}
}  // namespace before

template <typename Launch>
float time_us(Launch launch) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 3; ++i) launch(s);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < 100; ++i) launch(s);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&ge, g, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < 8; ++r) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (r) ts.push_back(ms * 10.f);  // 100 launches: us per launch
  }
  std::sort(ts.begin(), ts.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return ts[ts.size() / 2];
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct Cfg { int b, hq, splits, d; };
  // 1 x 128K (66 splits), 16 x 32K (4), 64 x 8K (2); then other small batches and head dims.
  for (Cfg c : {Cfg{1, 32, 66, 128}, Cfg{16, 32, 4, 128}, Cfg{64, 32, 2, 128}, Cfg{2, 32, 33, 128}, Cfg{4, 32, 17, 128},
                Cfg{1, 32, 66, 64}, Cfg{1, 16, 130, 256}}) {
    const size_t rows = size_t(c.b) * c.hq * c.splits;
    std::vector<float> po(rows * c.d), st(rows * 2);
    std::mt19937 rng(c.b * 7 + c.splits);
    std::normal_distribution<float> nd;
    for (auto& x : po) x = nd(rng);
    for (size_t r = 0; r < rows; ++r) {
      st[2 * r] = 3.f * nd(rng);
      st[2 * r + 1] = 1.f + std::fabs(nd(rng)) * 20.f;
    }
    float *dpo, *dst;
    __half *o_old, *o_new;
    cudaMalloc(&dpo, po.size() * 4);
    cudaMalloc(&dst, st.size() * 4);
    cudaMalloc(&o_old, size_t(c.b) * c.hq * c.d * 2);
    cudaMalloc(&o_new, size_t(c.b) * c.hq * c.d * 2);
    cudaMemcpy(dpo, po.data(), po.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dst, st.data(), st.size() * 4, cudaMemcpyHostToDevice);
    const int spread = decode_merge::merge_spread(int64_t(c.b) * c.hq, c.d, sms);
    const int64_t sb = int64_t(c.hq) * c.d, sh = c.d;
    auto run_old = [&](cudaStream_t s) {
      before::combine_splits_kernel<<<dim3(c.b, c.hq), before::kCombineThreads, 0, s>>>(
          dpo, reinterpret_cast<const float2*>(dst), c.splits, c.hq, c.d, o_old, sb, sh);
    };
    auto run_new = [&](cudaStream_t s) {
      decode_merge::combine_splits_kernel<<<dim3(c.b, c.hq, spread), decode_merge::kMergeThreads, 0, s>>>(
          dpo, reinterpret_cast<const float2*>(dst), c.splits, c.hq, c.d, o_new, sb, sh);
    };
    const float t_old = time_us(run_old), t_new = time_us(run_new);
    std::vector<__half> a(size_t(c.b) * c.hq * c.d), b(a.size());
    cudaMemcpy(a.data(), o_old, a.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), o_new, b.size() * 2, cudaMemcpyDeviceToHost);
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double x = __half2float(a[i]), y = __half2float(b[i]);
      num += (x - y) * (x - y);
      den += x * x;
    }
    const cudaError_t e = cudaGetLastError();
    printf("B=%-3d hq=%d splits=%-3d d=%-3d spread %d: before %6.2f us, after %6.2f us, rel diff %.1e%s%s\n", c.b,
           c.hq, c.splits, c.d, spread, t_old, t_new, std::sqrt(num / den), e ? " error: " : "",
           e ? cudaGetErrorString(e) : "");
    cudaFree(dpo); cudaFree(dst); cudaFree(o_old); cudaFree(o_new);
  }
  return 0;
}
