// The Hopper prefill kernel's dequantized copy (prefill_attention_sm90.cu, dequant_copy): a per-token u8 / u4 / u2
// cache's keys of the launch's sequences, dequantized once into a compact f16 paged copy, so the f16 instance runs
// over it instead of every CTA dequantizing every prefix tile it visits (each kv head's tiles are visited by G x the
// query tiles CTAs: 8 at a 256-token chunk with Llama-3-8B heads, 32 at 1024).
//
// The values are the fused producer's, bit for bit: u4 / u2 code * scale + zero in f32 (one FFMA, as placed_code
// and the pre-multiplied scale make it there), rounded once to f16; u8 as f16 (code - 128) * f16(scale) +
// f16(zero + 128 scale) in one f16 FMA (u8_pair). Rows past a sequence's kv_len are not written (the kernel never
// reads them).
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/sm80/attention_math.cuh"
#include "kernels/sm90/prefill_attention_sm90.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 256;

// One 16-byte vector of codes (16 / 32 / 64 dims) of a cache row into its f16 row `dst` (offset by the vector).
template <KvType T>
__device__ __forceinline__ void dequant_vector(uint4 w, float2 sz, __half* dst) {
  constexpr int kBits = kv_bits<T>(), kDims = 128 / kBits;
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint32_t h[kDims / 2];
  if constexpr (kBits == 8) {
    const __half s = __float2half_rn(sz.x), z = __float2half_rn(fmaf(128.f, sz.x, sz.y));
#pragma unroll
    for (int i = 0; i < kDims; i += 2) {
      const uint32_t b = words[i / 4] >> (8 * (i % 4));
      const __half lo = __hfma(__float2half_rn(static_cast<float>(static_cast<int>(b & 0xFFu) - 128)), s, z);
      const __half hi = __hfma(__float2half_rn(static_cast<float>(static_cast<int>((b >> 8) & 0xFFu) - 128)), s, z);
      h[i / 2] = static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
    }
  } else {  // dim i at bits kBits * i of the little-endian words
    constexpr int kPerWord = 32 / kBits;
    constexpr uint32_t kMask = (1u << kBits) - 1;
#pragma unroll
    for (int i = 0; i < kDims; i += 2) {
      const uint32_t x = words[i / kPerWord] >> (kBits * (i % kPerWord));
      h[i / 2] = attn_math::pack_half2(__fmaf_rn(static_cast<float>(x & kMask), sz.x, sz.y),
                                       __fmaf_rn(static_cast<float>((x >> kBits) & kMask), sz.x, sz.y));
    }
  }
  uint4* out = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int j = 0; j < kDims / 8; ++j) out[j] = make_uint4(h[4 * j], h[4 * j + 1], h[4 * j + 2], h[4 * j + 3]);
}

struct CopyArgs {
  const uint8_t* src[2];  // K, V codes [blocks, Hkv, bs, D * bits / 8]
  const float2* params[2];
  __half* dst[2];         // [num_seqs * max_blocks, Hkv, bs, D]
  const int32_t* block_tables;
  const int32_t* seq_info;
  int32_t* table_out;     // [num_seqs, max_blocks]: page g of the copy is g
  int num_seqs, max_blocks, hkv, block_size;
};

// One page of the copy per block (blockIdx.x = seq * max_blocks + block), K (blockIdx.y 0) or V (1).
template <int D, KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads) prefill_attention_dequant_copy_kernel(const CopyArgs a) {
  const int g = blockIdx.x, side = blockIdx.y;
  if (side == 0 && threadIdx.x == 0) a.table_out[g] = g;
  const int seq = g / a.max_blocks, block = g % a.max_blocks;
  const int kv_len = a.seq_info[2 * a.num_seqs + seq], key0 = block * a.block_size;
  if (key0 >= kv_len) return;
  const int page = a.block_tables[g];
  const int rows = min(a.block_size, kv_len - key0);
  auto run = [&](auto tag) {
    constexpr KvType T = decltype(tag)::value;
    constexpr int kVecs = D * kv_bits<T>() / 8 / 16, kDims = 128 / kv_bits<T>();
    const int items = a.hkv * a.block_size * kVecs;
    for (int i = threadIdx.x; i < items; i += kThreads) {
      const int vec = i % kVecs, hr = i / kVecs, r = hr % a.block_size, h = hr / a.block_size;
      if (r >= rows) continue;
      const int64_t src_row = (static_cast<int64_t>(page) * a.hkv + h) * a.block_size + r;
      const int64_t dst_row = (static_cast<int64_t>(g) * a.hkv + h) * a.block_size + r;
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(a.src[side] + src_row * (D * kv_bits<T>() / 8)) + vec);
      dequant_vector<T>(w, __ldg(a.params[side] + src_row), a.dst[side] + dst_row * D + vec * kDims);
    }
  };
  if (side == 0)
    run(std::integral_constant<KvType, KT>{});
  else
    run(std::integral_constant<KvType, VT>{});
}

template <int D, KvType KT, KvType VT>
void launch_copy(const CopyArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.num_seqs * a.max_blocks), 2);
  prefill_attention_dequant_copy_kernel<D, KT, VT><<<grid, kThreads, 0, stream>>>(a);
}

template <int D, KvType KT>
void launch_for_v(const CopyArgs& a, KvType vt, cudaStream_t stream) {
  if (vt == KvType::u8) launch_copy<D, KT, KvType::u8>(a, stream);
  if (vt == KvType::u4) launch_copy<D, KT, KvType::u4>(a, stream);
  if (vt == KvType::u2) launch_copy<D, KT, KvType::u2>(a, stream);
}

template <int D>
void launch_for_k(const CopyArgs& a, KvType kt, KvType vt, cudaStream_t stream) {
  if (kt == KvType::u8) launch_for_v<D, KvType::u8>(a, vt, stream);
  if (kt == KvType::u4) launch_for_v<D, KvType::u4>(a, vt, stream);
  if (kt == KvType::u2) launch_for_v<D, KvType::u2>(a, vt, stream);
}

}  // namespace

bool prefill_dequant_copy_covers(int head_dim, KvType kt, KvType vt) {
  auto per_token_int = [](KvType t) { return t == KvType::u8 || t == KvType::u4 || t == KvType::u2; };
  return (head_dim == 64 || head_dim == 128) && per_token_int(kt) && per_token_int(vt);
}

void prefill_dequant_copy(const PrefillTcArgs& a, int head_dim, KvType kt, KvType vt, __half* k_out, __half* v_out,
                          int32_t* table_out, cudaStream_t stream) {
  LOWBIT_CHECK(prefill_dequant_copy_covers(head_dim, kt, vt), "prefill_attention: the dequantized copy reads ",
               "per-token u8 / u4 / u2 K and V at head_dim 64 or 128");
  CopyArgs c{};
  c.src[0] = a.k, c.src[1] = a.v;
  c.params[0] = reinterpret_cast<const float2*>(a.k_params), c.params[1] = reinterpret_cast<const float2*>(a.v_params);
  c.dst[0] = k_out, c.dst[1] = v_out;
  c.block_tables = a.block_tables, c.seq_info = a.seq_info, c.table_out = table_out;
  c.num_seqs = a.num_seqs, c.max_blocks = a.max_blocks, c.hkv = a.hkv, c.block_size = a.block_size;
  if (head_dim == 64)
    launch_for_k<64>(c, kt, vt, stream);
  else
    launch_for_k<128>(c, kt, vt, stream);
}

}  // namespace lowbit::cuda
