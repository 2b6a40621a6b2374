// The merge of the Hopper prefill kernel's key split (prefill_split_plan.h): each split wrote a row's unnormalized
// O_s and (m_s, l_s) (max in the log2 domain, sum of 2^(score - m_s)); the row's output is
// sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s with M = max_s m_s, in f32, rounded once to f16. A split that saw
// none of a row's keys wrote l_s = 0 and O_s = 0 (its m_s is a finite stand-in for minus infinity).
#include <cuda_fp16.h>

#include "kernels/sm90/prefill_attention_sm90.h"
#include "kernels/sm90/prefill_split_plan.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr int kWarps = 8;  // one (query token, head) per warp

template <int D>
__global__ void __launch_bounds__(kWarps * 32) prefill_attention_split_merge_kernel(const PrefillTcArgs a) {
  constexpr int kPer = D / 32;  // dims per lane
  const int lane = threadIdx.x & 31;
  const int seq = blockIdx.y, ns = a.num_seqs;
  const int q_start = a.seq_info[seq], q_len = a.seq_info[ns + seq];
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int pos = static_cast<int>(item / a.hq), head = static_cast<int>(item % a.hq);
  if (pos >= q_len) return;
  const int64_t row = static_cast<int64_t>(q_start + pos) * a.hq + head;  // in one split's [tokens, hq]
  const int64_t split_stride = static_cast<int64_t>(a.split_tokens) * a.hq;
  // Lane s < splits holds split s's (m, l).
  float2 ml = make_float2(-3.0e38f, 0.f);
  if (lane < a.splits) ml = a.split_ml[lane * split_stride + row];
  float mx = ml.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float w = lane < a.splits ? exp2f(ml.x - mx) : 0.f;
  float l = w * ml.y;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  float acc[kPer] = {};
  for (int s = 0; s < a.splits; ++s) {
    const float ws = __shfl_sync(0xffffffffu, w, s);
    const float* src = a.split_o + (s * split_stride + row) * D + kPer * lane;
    if constexpr (kPer == 4) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      acc[0] = fmaf(ws, v.x, acc[0]), acc[1] = fmaf(ws, v.y, acc[1]);
      acc[2] = fmaf(ws, v.z, acc[2]), acc[3] = fmaf(ws, v.w, acc[3]);
    } else {
      const float2 v = *reinterpret_cast<const float2*>(src);
      acc[0] = fmaf(ws, v.x, acc[0]), acc[1] = fmaf(ws, v.y, acc[1]);
    }
  }
  const float inv = 1.f / l;  // l > 0: every row sees its own key in some split
  __half* out = a.out + static_cast<int64_t>(q_start + pos) * a.out_stride_t + head * a.out_stride_h + kPer * lane;
#pragma unroll
  for (int i = 0; i < kPer; i += 2)
    *reinterpret_cast<__half2*>(out + i) = __floats2half2_rn(acc[i] * inv, acc[i + 1] * inv);
}

}  // namespace

void prefill_attention_split_merge(const PrefillTcArgs& a, int head_dim, int max_q_len, cudaStream_t stream) {
  const int64_t items = static_cast<int64_t>(max_q_len) * a.hq;
  const dim3 grid(static_cast<unsigned>((items + kWarps - 1) / kWarps), static_cast<unsigned>(a.num_seqs));
  if (head_dim == 128)
    prefill_attention_split_merge_kernel<128><<<grid, kWarps * 32, 0, stream>>>(a);
  else
    prefill_attention_split_merge_kernel<64><<<grid, kWarps * 32, 0, stream>>>(a);
}

}  // namespace lowbit::cuda
