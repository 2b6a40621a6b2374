// The merge of decode attention's splits (flash-decoding's second kernel): its two kernels (one block per head; a
// head's columns over several blocks at small batches) and the rule between them, in a header of their own so that
// tools/bench_decode_merge.cu can time them alone. decode_attention_sm80.cu launches them.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/pdl.cuh"

namespace lowbit::cuda::decode_merge {

constexpr float kNoScore = -1e30f;  // finite "minus infinity": exp(kNoScore - m) underflows to 0

// One block per (sequence, head), for larger batches (merge_spread 1). out = Σ_s e^{m_s - M} o_s / Σ_s e^{m_s - M} l_s
// over the splits of one (sequence, head), in split order (the same bits every run). The block reads the splits in
// parallel: each thread loads one split's (m, l) per chunk of kCombineChunk splits, and groups of d/4 threads (one
// float4 column each) take every groups-th split of the chunk, several loads in flight per thread; the groups' sums
// meet in shared memory. Its first version (one thread per dim walking every split, one dependent load at a time) took
// ~13 us at 1 x 128K (66 splits, inferred from the op minus its decode kernel); this one 5.3-5.6 us there, 2.5 at
// 16 x 32K (512 heads, 4 splits) and 4.2 at 64 x 8K (2048 heads, 2 splits) (H200; docs/benchmarks_gpu.md). The spread
// kernel below took 3.0, 3.2 and 7.0 us there: at 64 x 8K its 72 registers let 7 blocks share an SM where this one's
// 32 let 16, so 2048 blocks take ~2 waves (inferred, not profiled); the 16 x 32K loss is not explained.
// d: a multiple of 4, <= 512.
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
                                                                         int64_t out_stride_b, int64_t out_stride_h,
                                                                         bool pdl) {
  pdl_allow_dependents();
  __shared__ float scratch[kCombineThreads / 32];
  __shared__ float weight[kCombineChunk];
  __shared__ __align__(16) float group_sum[4 * kCombineThreads];
  const int b = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int64_t slot0 = (static_cast<int64_t>(b) * hq + h) * splits;
  const float2* stats = part_stats + slot0;
  if (pdl) pdl_wait_for_producers();  // a programmatic dependent of the decode kernel (cuda/pdl.cuh)
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

// A head's columns over several blocks, for small batches (merge_spread > 1).
// out = Σ_s e^{m_s - M} o_s / Σ_s e^{m_s - M} l_s over the splits of one (sequence, head), in a fixed order (the same
// bits every run). Block (b, h, part) writes columns [part, part + 1) * d / spread of head h: its cols float4 columns
// are read by groups of cols threads, group g taking splits g, g + groups, ... (kMergeUnroll of them per round, their
// (max, sum) and float4 columns loaded together, all in flight: the stats no longer wait for a block-wide max before
// the columns are read). Each thread keeps its own running (max, sum, numerator) in registers (online softmax over its
// splits; one round covers kMergeUnroll * groups splits); the groups meet once in shared memory, rescaled to their common
// max in one fixed order. At small batches a head's columns are spread over up to kMaxSpread blocks (merge_spread):
// 1 x 128K (32 heads, 66 splits) ran 32 blocks of several dependent rounds each in the version before (5.3-5.6 us on an
// H200, docs/benchmarks_gpu.md); here 128 blocks, one round of loads each: 3.0 / 2.8 us (kv4 / kv2 splits, H200).
// d: a multiple of 4, <= 512.
constexpr int kMergeThreads = 128, kMergeUnroll = 8, kMaxSpread = 8;

__global__ void __launch_bounds__(kMergeThreads) combine_splits_spread_kernel(const float* __restrict__ part_out,
                                                                              const float2* __restrict__ part_stats,
                                                                              int splits, int hq, int d, __half* out,
                                                                              int64_t out_stride_b,
                                                                              int64_t out_stride_h, bool pdl) {
  pdl_allow_dependents();
  __shared__ float group_m[kMergeThreads], group_l[kMergeThreads];
  __shared__ __align__(16) float group_sum[4 * kMergeThreads];
  const int b = blockIdx.x, h = blockIdx.y, part = blockIdx.z, tid = threadIdx.x;
  const int row4 = d / 4, cols = row4 / gridDim.z;  // float4s per split row; this block's share of them
  const int groups = kMergeThreads / cols, group = tid / cols, col = tid % cols;
  const int64_t slot0 = (static_cast<int64_t>(b) * hq + h) * splits;
  const float2* stats = part_stats + slot0;
  const float4* po = reinterpret_cast<const float4*>(part_out + slot0 * d) + part * cols + col;
  // Launched as a programmatic dependent of the decode kernel (cuda/pdl.cuh): nothing above reads its partials.
  if (pdl) pdl_wait_for_producers();
  float m = kNoScore, den = 0.f;
  float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
  if (group < groups) {
    for (int s0 = group; s0 < splits; s0 += kMergeUnroll * groups) {
      float2 st[kMergeUnroll];
      float4 x[kMergeUnroll];
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u) {  // L2 loads (.cg): the partials were written by the kernel before
        const int s = s0 + u * groups;
        st[u] = s < splits ? __ldcg(stats + s) : make_float2(kNoScore, 0.f);
        x[u] = s < splits ? __ldcg(po + static_cast<int64_t>(s) * row4) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float mb = m;  // empty splits (l = 0) take no part in the max
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u) mb = st[u].y > 0.f ? fmaxf(mb, st[u].x) : mb;
      const float a = __expf(m - mb);  // exactly 1 when the max stays
      num.x *= a; num.y *= a; num.z *= a; num.w *= a;
      den *= a;
#pragma unroll
      for (int u = 0; u < kMergeUnroll; ++u) {
        const float w = st[u].y > 0.f ? __expf(st[u].x - mb) : 0.f;
        num.x += w * x[u].x; num.y += w * x[u].y; num.z += w * x[u].z; num.w += w * x[u].w;
        den += w * st[u].y;
      }
      m = mb;
    }
  }
  reinterpret_cast<float4*>(group_sum)[tid] = num;  // = [group][col] (threads past groups * cols: unused)
  if (col == 0 && group < groups) {  // every thread of a group holds the same (max, sum)
    group_m[group] = m;
    group_l[group] = den;
  }
  __syncthreads();
  const int width = 4 * cols;
  for (int i = tid; i < width; i += kMergeThreads) {
    float mx = kNoScore;
    for (int g = 0; g < groups; ++g) mx = fmaxf(mx, group_m[g]);
    float o = 0.f, l = 0.f;
    for (int g = 0; g < groups; ++g) {
      const float w = __expf(group_m[g] - mx);
      o += w * group_sum[g * width + i];
      l += w * group_l[g];
    }
    out[b * out_stride_b + h * out_stride_h + part * width + i] = __float2half_rn(l > 0.f ? o / l : 0.f);
  }
}

// Blocks per head of the merge: doubled while the doubled grid still fits one block per SM (so 1 x 128K's
// 32 heads take 4 each on a 132-SM card; 16 x 32K's 512 heads and larger batches keep 1), at most kMaxSpread and
// only while the float4 columns divide evenly. 1: combine_splits_kernel, else combine_splits_spread_kernel.
inline int merge_spread(int64_t heads, int d, int64_t sms) {
  int spread = 1;
  while (spread < kMaxSpread && (d / 4) % (2 * spread) == 0 && heads * spread * 2 <= sms) spread *= 2;
  return spread;
}

}  // namespace lowbit::cuda::decode_merge
