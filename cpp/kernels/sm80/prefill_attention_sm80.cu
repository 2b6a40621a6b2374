// Causal paged attention for query rows of any length (prefill, chunked prefill, mixed batches),
// over every KV type kv_write writes (f32/f16/bf16 as is, u8/u4/u2 with per-token (scale, zero)).
// The common case (f16 q/out, head_dim 64/128, f16/u8/u4 caches) takes the tensor-core kernel
// (prefill_attention_tc_sm80.cu); this file keeps the general one and dispatches. Per-channel K
// (a KWindow) has the tensor-core kernel only: the general one throws NotSupported for it.
// Correct first, simple second: one warp per (query token, query head). The warp takes 32 keys at a
// time, one per lane (each lane forms a full q·k dot product), updates an online softmax (flash
// attention's running max and sum, f32) and accumulates P·V with each lane owning head_dim / 32 of
// the output dims. GQA: query head h reads KV head h / (Hq / Hkv).
#include "cuda/float_io.cuh"
#include "kernels/sm80/prefill_attention_tc.h"
#include "kernels/sm90/prefill_attention_sm90.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

constexpr int kWarps = 4, kMaxDim = 256, kMaxPerLane = kMaxDim / 32;
constexpr float kNoScore = -1e30f;  // finite "minus infinity": exp(kNoScore - m) underflows to 0

struct KvSide {
  const void* data;
  const float* params;  // (scale, zero) per row for u8/u4
  ScalarType type;
};

struct PrefillArgs {
  const void* q;
  ScalarType q_type;
  int64_t q_stride_t, q_stride_h;
  void* out;
  ScalarType out_type;
  int64_t out_stride_t, out_stride_h;
  KvSide k, v;
  const int32_t* block_tables;
  const int32_t* seq_info;  // [3, num_seqs]: q_start, q_len, kv_len
  int num_seqs, max_blocks, hq, hkv, block_size, d;
  float scale;
};

// Element i of cache row `row` (a token of one KV head) as f32.
__device__ __forceinline__ float kv_at(const KvSide& s, int64_t row, int d, int i) {
  if (s.type == ScalarType::u8) {
    const float* p = s.params + row * 2;
    return static_cast<float>(static_cast<const uint8_t*>(s.data)[row * d + i]) * p[0] + p[1];
  }
  if (s.type == ScalarType::u4) {
    const float* p = s.params + row * 2;
    const uint8_t byte = static_cast<const uint8_t*>(s.data)[row * ((d + 1) / 2) + i / 2];
    return static_cast<float>((byte >> (4 * (i & 1))) & 0xF) * p[0] + p[1];
  }
  if (s.type == ScalarType::u2) {
    const float* p = s.params + row * 2;
    const uint8_t byte = static_cast<const uint8_t*>(s.data)[row * ((d + 3) / 4) + i / 4];
    return static_cast<float>((byte >> (2 * (i & 3))) & 0x3) * p[0] + p[1];
  }
  return load_any(static_cast<const char*>(s.data) + row * d * float_bytes(s.type), s.type, i);
}

__global__ void __launch_bounds__(kWarps * 32) prefill_attention_kernel(PrefillArgs a) {
  __shared__ float q_smem[kWarps][kMaxDim];
  const int seq = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q_start = a.seq_info[seq], q_len = a.seq_info[a.num_seqs + seq], kv_len = a.seq_info[2 * a.num_seqs + seq];
  const int j = blockIdx.z * kWarps + warp;
  if (j >= q_len) return;  // whole warps leave together; no block-wide barrier follows
  const int64_t t = q_start + j;
  const int pos = kv_len - q_len + j;  // attends to cache positions 0..pos
  const int kvh = h / (a.hq / a.hkv), d = a.d;
  const char* qrow = static_cast<const char*>(a.q) + (t * a.q_stride_t + h * a.q_stride_h) * float_bytes(a.q_type);
  for (int i = lane; i < d; i += 32) q_smem[warp][i] = load_any(qrow, a.q_type, i);
  __syncwarp();
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  auto row_of = [&](int p) -> int64_t {
    return (static_cast<int64_t>(table[p / a.block_size]) * a.hkv + kvh) * a.block_size + p % a.block_size;
  };

  float m = kNoScore, l = 0.f, acc[kMaxPerLane];
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) acc[c] = 0.f;
  for (int base = 0; base <= pos; base += 32) {
    const int key = base + lane;
    float score = kNoScore;
    if (key <= pos) {
      const int64_t row = row_of(key);
      float dot = 0.f;
      for (int i = 0; i < d; ++i) dot += q_smem[warp][i] * kv_at(a.k, row, d, i);
      score = dot * a.scale;
    }
    const float m_new = fmaxf(m, warp_max(score));
    const float alpha = __expf(m - m_new);
    const float p = key <= pos ? __expf(score - m_new) : 0.f;
    l = l * alpha + warp_sum(p);
    m = m_new;
    const int count = min(32, pos + 1 - base);
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) acc[c] *= alpha;
    for (int kk = 0; kk < count; ++kk) {
      const float pk = __shfl_sync(0xffffffffu, p, kk);
      const int64_t row = row_of(base + kk);
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        const int i = lane + 32 * c;
        if (i < d) acc[c] += pk * kv_at(a.v, row, d, i);
      }
    }
  }
  char* orow = static_cast<char*>(a.out) + (t * a.out_stride_t + h * a.out_stride_h) * float_bytes(a.out_type);
  const float inv = 1.f / l;  // l >= 1: the running max's own term contributes exp(0)
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int i = lane + 32 * c;
    if (i < d) store_any(orow, a.out_type, i, acc[c] * inv);
  }
}

KvSide side_of(const Tensor& data, const Tensor& params) {
  return KvSide{data.data_ptr(), params.defined() ? params.data<float>() : nullptr, data.dtype()};
}

}  // namespace

void prefill_attention(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                       const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, int max_q_len,
                       float scale, Tensor& out, cudaStream_t stream, PrefillKernel kernel, const KWindow& window,
                       const PrefillSm90Options& sm90) {
  const char* op = "prefill_attention";
  const int64_t d = q.size(2);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, d > 0 && d <= kMaxDim, op, ": head_dim ", d,
                    " has no kernel (at most ", kMaxDim, ")");
  const int64_t num_seqs = block_tables.size(0);
  if (num_seqs == 0 || max_q_len <= 0) return;
  // A named kernel that cannot run throws inside its launch (never a quiet warp run).
  if (kernel == PrefillKernel::hopper ||
      (kernel == PrefillKernel::automatic && prefill_attention_sm90_supported(q, k_data, v_data, out, window)))
    return prefill_attention_sm90(q, k_data, v_data, k_params, v_params, block_tables, seq_info, max_q_len, scale, out,
                                  stream, window, sm90);
  const bool tc = kernel == PrefillKernel::tensor_core ||
                  (kernel == PrefillKernel::automatic && prefill_attention_tc_supported(q, k_data, v_data, out, window));
  if (tc)
    return prefill_attention_tc(q, k_data, v_data, k_params, v_params, block_tables, seq_info, max_q_len, scale, out,
                                stream, window);
  // The warp kernel reads K per token only: per-channel K would be read with the wrong parameters.
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, !window.defined(), op, ": per-channel K (a K window) runs on the "
                    "tensor-core kernel only (f16 q/out with aligned rows, head_dim 64 or 128 as built, u4 k_data, "
                    "block size a multiple of 16 and at least 32), ",
                    kernel == PrefillKernel::warp ? "but the warp kernel was asked for"
                                                  : "which does not cover these operands");
  PrefillArgs a{};
  a.q = q.data_ptr();
  a.q_type = q.dtype();
  a.q_stride_t = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.out = out.data_ptr();
  a.out_type = out.dtype();
  a.out_stride_t = out.stride(0);
  a.out_stride_h = out.stride(1);
  a.k = side_of(k_data, k_params);
  a.v = side_of(v_data, v_params);
  a.block_tables = block_tables.data<int32_t>();
  a.seq_info = seq_info.data<int32_t>();
  a.num_seqs = static_cast<int>(num_seqs);
  a.max_blocks = static_cast<int>(block_tables.size(1));
  a.hq = static_cast<int>(q.size(1));
  a.hkv = static_cast<int>(k_data.size(1));
  a.block_size = static_cast<int>(k_data.size(2));
  a.d = static_cast<int>(d);
  a.scale = scale;
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(a.hq),
                  static_cast<unsigned>((max_q_len + kWarps - 1) / kWarps));
  prefill_attention_kernel<<<grid, kWarps * 32, 0, stream>>>(a);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
