// Decode attention over the paged KV cache (one query token per sequence), K/V in f16, u8 or u4
// with per-token (scale, zero) f32 parameters (include/lowbit/kv/kv_cache.h).
//
// Grid (sequence, kv head, split): the query heads of one GQA group are processed together so each
// K/V byte is read once for the whole group. A block owns `split_tokens` consecutive positions:
//   1. scores: D/8 lanes share a token, each dotting 8 dims against every query head of the group;
//      for integer K, q·(k*s + z) = s*(q·k) + z*Σq, so the raw integers are dotted;
//   2. softmax statistics over the split (max, sum) in shared memory;
//   3. values: the same lanes accumulate p*v for their 8 dims (p*s*v + p*z for integer V).
// With more than one split per sequence (long contexts, few sequences) each split writes its
// unnormalized output with (max, sum) and a combine kernel merges them (flash-decoding).
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 128, kWarpsPerBlock = kThreads / 32;
constexpr int kMaxSplitTokens = 512;
enum class KvType { f16, u8, u4 };

// Loads 8 consecutive elements (starting at element `e` of a row-major [.., D] array) as floats:
// f16 values, or the raw integers of u8/u4.
template <KvType T>
__device__ inline void load8(const void* base, int64_t e, float (&v)[8]) {
  if constexpr (T == KvType::f16) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const __half*>(base) + e);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  } else if constexpr (T == KvType::u8) {
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(base) + e);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = static_cast<float>((u.x >> (8 * i)) & 0xFF);
      v[4 + i] = static_cast<float>((u.y >> (8 * i)) & 0xFF);
    }
  } else {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(base) + e / 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = static_cast<float>((u >> (4 * i)) & 0xF);  // low nibble first
  }
}

struct AttnArgs {
  const __half* q;  // [B, Hq, D]
  const void* k;
  const void* v;
  const float* k_params;
  const float* v_params;  // [blocks, Hkv, bs, 2]
  const int* block_tables;
  const int* seq_lens;
  __half* out;        // [B, Hq, D]
  float* part_out;    // [B, Hq, splits, D]
  float* part_stats;  // [B, Hq, splits, 2] = (max, sum)
  int64_t q_stride_b, q_stride_h, out_stride_b, out_stride_h;
  int hq, hkv, group, block_size, max_blocks, split_tokens;
  float scale;
};

template <KvType KT, KvType VT, int D, int G>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(AttnArgs p) {
  constexpr int kLanesPerToken = D / 8, kTokensPerWarp = 32 / kLanesPerToken;
  constexpr int kTokensPerStep = kTokensPerWarp * kWarpsPerBlock;
  __shared__ float scores[G][kMaxSplitTokens];
  __shared__ float reduce_buf[kWarpsPerBlock][G];
  __shared__ float out_buf[kWarpsPerBlock][G][D];

  const int b = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int sub = lane / kLanesPerToken, d0 = (lane % kLanesPerToken) * 8;
  const int len = p.seq_lens[b];
  const int start = split * p.split_tokens, end = min(start + p.split_tokens, len);
  const int n = max(end - start, 0);
  const int groups = p.group;

  // Query slice of every head in the group, pre-multiplied by the softmax scale, and Σq per head.
  float qv[G][8], qsum[G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    const int head = kvh * groups + min(h, groups - 1);
    const __half* src = p.q + b * p.q_stride_b + head * p.q_stride_h + d0;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      qv[h][e] = h < groups ? __half2float(src[e]) * p.scale : 0.f;
      s += qv[h][e];
    }
#pragma unroll
    for (int o = kLanesPerToken / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    qsum[h] = s;
  }

  auto kv_index = [&](int t) -> int64_t {  // row index of token t in [blocks, Hkv, bs]
    const int blk = p.block_tables[b * p.max_blocks + t / p.block_size];
    return (static_cast<int64_t>(blk) * p.hkv + kvh) * p.block_size + t % p.block_size;
  };

  // 1. scores
  for (int base = warp * kTokensPerWarp; base < n; base += kTokensPerStep) {
    const int i = base + sub;
    const bool valid = i < n;
    float kf[8] = {};
    float ks = 1.f, kz = 0.f;
    if (valid) {
      const int64_t row = kv_index(start + i);
      load8<KT>(p.k, row * D + d0, kf);
      if constexpr (KT != KvType::f16) {
        const float2 sz = *reinterpret_cast<const float2*>(p.k_params + row * 2);
        ks = sz.x;
        kz = sz.y;
      }
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(qv[h][e], kf[e], dot);
#pragma unroll
      for (int o = kLanesPerToken / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (valid && lane % kLanesPerToken == 0) scores[h][i] = KT == KvType::f16 ? dot : ks * dot + kz * qsum[h];
    }
  }
  __syncthreads();

  // 2. softmax statistics of the split, per head
  float mx[G], sum[G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float m = -FLT_MAX;
    for (int i = threadIdx.x; i < n; i += kThreads) m = fmaxf(m, scores[h][i]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) reduce_buf[warp][h] = m;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float m = reduce_buf[0][h];
    for (int w = 1; w < kWarpsPerBlock; ++w) m = fmaxf(m, reduce_buf[w][h]);
    mx[h] = m;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float e = __expf(scores[h][i] - mx[h]);
      scores[h][i] = e;
      s += e;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) reduce_buf[warp][h] = s;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float s = 0.f;
    for (int w = 0; w < kWarpsPerBlock; ++w) s += reduce_buf[w][h];
    sum[h] = s;
  }

  // 3. values
  float acc[G][8] = {}, pz[G] = {};
  for (int base = warp * kTokensPerWarp; base < n; base += kTokensPerStep) {
    const int i = base + sub;
    if (i >= n) continue;
    const int64_t row = kv_index(start + i);
    float vf[8];
    load8<VT>(p.v, row * D + d0, vf);
    float vs = 1.f, vz = 0.f;
    if constexpr (VT != KvType::f16) {
      const float2 sz = *reinterpret_cast<const float2*>(p.v_params + row * 2);
      vs = sz.x;
      vz = sz.y;
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float pr = scores[h][i];
      const float ps = pr * vs;
      pz[h] = fmaf(pr, vz, pz[h]);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(ps, vf[e], acc[h][e]);
    }
  }
  // Reduce over the tokens of a warp (lanes with the same dims), then over warps.
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float a = acc[h][e] + pz[h];
#pragma unroll
      for (int o = kLanesPerToken; o < 32; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      acc[h][e] = a;
    }
    if (sub == 0)
#pragma unroll
      for (int e = 0; e < 8; ++e) out_buf[warp][h][d0 + e] = acc[h][e];
  }
  __syncthreads();
  const int num_splits = gridDim.z;
  for (int idx = threadIdx.x; idx < groups * D; idx += kThreads) {
    const int h = idx / D, d = idx % D;
    if (h >= G) break;
    float o = 0.f;
    for (int w = 0; w < kWarpsPerBlock; ++w) o += out_buf[w][h][d];
    const int head = kvh * groups + h;
    if (num_splits == 1) {
      float denom = 0.f;
#pragma unroll
      for (int hh = 0; hh < G; ++hh)
        if (hh == h) denom = sum[hh];
      p.out[b * p.out_stride_b + head * p.out_stride_h + d] = __float2half_rn(denom > 0.f ? o / denom : 0.f);
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * p.hq + head) * num_splits + split;
      p.part_out[slot * D + d] = o;
      if (d == 0) {
        float m = -FLT_MAX, s = 0.f;
#pragma unroll
        for (int hh = 0; hh < G; ++hh)
          if (hh == h) {
            m = n > 0 ? mx[hh] : -FLT_MAX;
            s = sum[hh];
          }
        p.part_stats[slot * 2] = m;
        p.part_stats[slot * 2 + 1] = s;
      }
    }
  }
}

// out = Σ_s e^{m_s - M} o_s / Σ_s e^{m_s - M} l_s over the splits of one (sequence, head).
__global__ void combine_splits_kernel(const float* __restrict__ part_out, const float* __restrict__ part_stats,
                                      int splits, int hq, int d, __half* out, int64_t out_stride_b,
                                      int64_t out_stride_h) {
  const int b = blockIdx.x, h = blockIdx.y;
  const int64_t slot0 = (static_cast<int64_t>(b) * hq + h) * splits;
  float m = -FLT_MAX;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, part_stats[(slot0 + s) * 2]);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float num = 0.f, den = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float w = part_stats[(slot0 + s) * 2 + 1] > 0.f ? __expf(part_stats[(slot0 + s) * 2] - m) : 0.f;
      num += w * part_out[(slot0 + s) * d + i];
      den += w * part_stats[(slot0 + s) * 2 + 1];
    }
    out[b * out_stride_b + h * out_stride_h + i] = __float2half_rn(den > 0.f ? num / den : 0.f);
  }
}

KvType kv_type_of(const Tensor& t, const char* op, const char* arg) {
  switch (t.dtype()) {
    case ScalarType::f16: return KvType::f16;
    case ScalarType::u8: return KvType::u8;
    case ScalarType::u4: return KvType::u4;
    default:
      LOWBIT_NOT_SUPPORTED(op, ": argument '", arg, "' must be f16, u8 or u4, got ", name_of(t.dtype()));
  }
}

template <KvType KT, int D, int G>
void launch(const AttnArgs& p, dim3 grid, cudaStream_t stream) {
  decode_attention_kernel<KT, KT, D, G><<<grid, kThreads, 0, stream>>>(p);
}

template <KvType KT>
void launch_for_type(const AttnArgs& p, int d, dim3 grid, cudaStream_t stream) {
  const bool small = p.group <= 4;
  if (d == 64) small ? launch<KT, 64, 4>(p, grid, stream) : launch<KT, 64, 8>(p, grid, stream);
  else small ? launch<KT, 128, 4>(p, grid, stream) : launch<KT, 128, 8>(p, grid, stream);
}

}  // namespace

void decode_attention(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                      const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_lens, int max_seq_len,
                      float scale, Tensor& out, int split_tokens, cudaStream_t stream) {
  const char* op = "decode_attention";
  check_cuda_tensor(q, op, "q");
  check_dtype(q, ScalarType::f16, op, "q");
  check_dim(q, 3, op, "q");
  LOWBIT_CHECK(q.stride(2) == 1, op, ": argument 'q' needs unit stride in the last dim");
  const int64_t batch = q.size(0), hq = q.size(1), d = q.size(2);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, d == 64 || d == 128, op, ": head_dim ", d,
                    " has no kernel (supported: 64, 128)");
  check_same_device(k_data, q, op, "k_data");
  check_same_device(v_data, q, op, "v_data");
  check_dim(k_data, 4, op, "k_data");
  const int64_t blocks = k_data.size(0), hkv = k_data.size(1), bs = k_data.size(2);
  check_shape(k_data, {blocks, hkv, bs, d}, op, "k_data");
  check_shape(v_data, {blocks, hkv, bs, d}, op, "v_data");
  check_contiguous(k_data, op, "k_data");
  check_contiguous(v_data, op, "v_data");
  const KvType kt = kv_type_of(k_data, op, "k_data"), vt = kv_type_of(v_data, op, "v_data");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, kt == vt, op, ": K type ", name_of(k_data.dtype()), " and V type ",
                    name_of(v_data.dtype()), " differ; only equal K/V types have a GPU kernel");
  if (kt != KvType::f16) {
    check_same_device(k_params, q, op, "k_params");
    check_same_device(v_params, q, op, "v_params");
    check_dtype(k_params, ScalarType::f32, op, "k_params");
    check_dtype(v_params, ScalarType::f32, op, "v_params");
    check_shape(k_params, {blocks, hkv, bs, 2}, op, "k_params");
    check_shape(v_params, {blocks, hkv, bs, 2}, op, "v_params");
    check_contiguous(k_params, op, "k_params");
    check_contiguous(v_params, op, "v_params");
  }
  LOWBIT_CHECK(hkv > 0 && hq % hkv == 0, op, ": q heads (", hq, ") must be a multiple of kv heads (", hkv, ")");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, hq / hkv <= 8, op, ": GQA group of ", hq / hkv,
                    " query heads per kv head has no kernel (at most 8)");
  check_same_device(block_tables, q, op, "block_tables");
  check_dtype(block_tables, ScalarType::s32, op, "block_tables");
  check_dim(block_tables, 2, op, "block_tables");
  LOWBIT_CHECK(block_tables.size(0) == batch, op, ": argument 'block_tables' has ", block_tables.size(0),
               " rows, expected one per sequence (", batch, ")");
  check_contiguous(block_tables, op, "block_tables");
  check_same_device(seq_lens, q, op, "seq_lens");
  check_dtype(seq_lens, ScalarType::s32, op, "seq_lens");
  check_shape(seq_lens, {batch}, op, "seq_lens");
  const int64_t max_blocks = block_tables.size(1);
  LOWBIT_CHECK(max_seq_len >= 0 && max_seq_len <= max_blocks * bs, op, ": max_seq_len ", max_seq_len,
               " does not fit the block table (", max_blocks, " blocks of ", bs, " tokens)");
  check_same_device(out, q, op, "out");
  check_dtype(out, ScalarType::f16, op, "out");
  check_shape(out, {batch, hq, d}, op, "out");
  LOWBIT_CHECK(out.stride(2) == 1, op, ": argument 'out' needs unit stride in the last dim");
  LOWBIT_CHECK(split_tokens >= 0 && split_tokens <= kMaxSplitTokens, op, ": split_tokens must be in [0, ",
               kMaxSplitTokens, "], got ", split_tokens);
  if (batch == 0) return;

  const int dev = q.device().index;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(dev));
  if (split_tokens == 0) {
    // Enough blocks to fill the GPU ~4 times over, splits of 64..512 tokens.
    const int64_t want = 4LL * multiprocessor_count(dev);
    const int64_t splits_wanted = std::max<int64_t>(1, (want + batch * hkv - 1) / (batch * hkv));
    split_tokens = static_cast<int>(std::clamp<int64_t>((max_seq_len + splits_wanted - 1) / splits_wanted, 64,
                                                        kMaxSplitTokens));
  }
  const int splits = std::max(1, (max_seq_len + split_tokens - 1) / split_tokens);

  AttnArgs p{};
  p.q = q.data<__half>();
  p.k = k_data.data_ptr();
  p.v = v_data.data_ptr();
  p.k_params = kt == KvType::f16 ? nullptr : k_params.data<float>();
  p.v_params = kt == KvType::f16 ? nullptr : v_params.data<float>();
  p.block_tables = block_tables.data<int>();
  p.seq_lens = seq_lens.data<int>();
  p.out = out.data<__half>();
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.hq = static_cast<int>(hq);
  p.hkv = static_cast<int>(hkv);
  p.group = static_cast<int>(hq / hkv);
  p.block_size = static_cast<int>(bs);
  p.max_blocks = static_cast<int>(max_blocks);
  p.split_tokens = split_tokens;
  p.scale = scale;
  Tensor part_out, part_stats;
  if (splits > 1) {
    part_out = Tensor::empty({batch, hq, splits, d}, ScalarType::f32, q.device());
    part_stats = Tensor::empty({batch, hq, splits, 2}, ScalarType::f32, q.device());
    p.part_out = part_out.data<float>();
    p.part_stats = part_stats.data<float>();
  }
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(hkv), static_cast<unsigned>(splits));
  switch (kt) {
    case KvType::f16: launch_for_type<KvType::f16>(p, static_cast<int>(d), grid, stream); break;
    case KvType::u8: launch_for_type<KvType::u8>(p, static_cast<int>(d), grid, stream); break;
    case KvType::u4: launch_for_type<KvType::u4>(p, static_cast<int>(d), grid, stream); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (splits > 1) {
    combine_splits_kernel<<<dim3(batch, hq), 128, 0, stream>>>(p.part_out, p.part_stats, splits, p.hq,
                                                               static_cast<int>(d), p.out, p.out_stride_b,
                                                               p.out_stride_h);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda
