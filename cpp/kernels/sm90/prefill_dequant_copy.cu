// The Hopper prefill kernel's dequantized copy (prefill_attention_sm90.cu, dequant_copy): a per-token u8 / u4 / u2
// cache's keys of the launch's sequences, dequantized once into a compact f16 paged copy, so the f16 instance runs
// over it instead of every CTA dequantizing every prefix tile it visits (each kv head's tiles are visited by G x the
// query tiles CTAs: 8 at a 256-token chunk with Llama-3-8B heads, 32 at 1024).
//
// The values are the fused producer's, bit for bit: u4 / u2 code * scale + zero in f32 (one FFMA, as placed_code
// and the pre-multiplied scale make it there), rounded once to f16; u8 as f16 (code - 128) * f16(scale) +
// f16(zero + 128 scale) in one f16 FMA (u8_pair). Rows past a sequence's kv_len are not written (the kernel never
// reads them).
//
// Per-channel K (u4c / u2c, prefill_attention_sm90.cu's tail split): the same FFMA with the dim's scale and zero of
// the key's block, and only the keys below the tail split's bound (every query of the chunk sees them as codes).
//
// Layout of the work: a page's rows (Hkv x block_size, contiguous in the cache and in the copy) split into 16-byte
// output chunks of 8 dims; lane i of a warp makes chunk i of the page, so a warp's store is 512 contiguous bytes
// and its code load 64-256 contiguous bytes (2-8 a lane), the row's (scale, zero) a broadcast. A thread keeps its
// chunk column and steps down the rows, kBatch rows' loads issued before their stores.
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/sm90/prefill_attention_sm90.h"
#include "kernels/sm90/prefill_split_plan.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 256, kBatch = 4;
constexpr int kKeyTile = 128;  // the Hopper prefill kernel's keys per tile (kKeys in prefill_attention_sm90.cuh)

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {  // lo in the low half (the lower dim)
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float code_f32(uint32_t c) { return __uint_as_float(0x4B000000u | c) - 8388608.f; }

// The codes of one chunk: 8 bytes (u8), 4 (u4), 2 (u2, in the low half).
template <KvType T>
using Codes = std::conditional_t<T == KvType::u8, uint2, uint32_t>;

template <KvType T>
__device__ __forceinline__ Codes<T> load_codes(const uint8_t* p) {
  if constexpr (T == KvType::u8)
    return __ldg(reinterpret_cast<const uint2*>(p));
  else if constexpr (kv_bits<T>() == 4)  // u4, u4c
    return __ldg(reinterpret_cast<const uint32_t*>(p));
  else
    return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// u8 dims 2j, 2j + 1 of a word: (byte - 128) exact in f16 (1024 + byte less 1152), then one f16x2 FMA.
__device__ __forceinline__ uint32_t u8_pair(uint32_t word, uint32_t sel, __half2 s2, __half2 z2) {
  const uint32_t biased = __byte_perm(word, 0x64646464u, sel);  // sel 0x4140: bytes 0, 1; 0x4342: bytes 2, 3
  const __half2 c = __hsub2(*reinterpret_cast<const __half2*>(&biased), __half2half2(__ushort_as_half(0x6480u)));
  const __half2 r = __hfma2(c, s2, z2);
  return *reinterpret_cast<const uint32_t*>(&r);
}

template <KvType T>
__device__ __forceinline__ uint4 dequant_chunk(Codes<T> w, float2 sz) {
  if constexpr (T == KvType::u8) {
    const __half2 s2 = __float2half2_rn(sz.x), z2 = __float2half2_rn(fmaf(128.f, sz.x, sz.y));
    return make_uint4(u8_pair(w.x, 0x4140, s2, z2), u8_pair(w.x, 0x4342, s2, z2), u8_pair(w.y, 0x4140, s2, z2),
                      u8_pair(w.y, 0x4342, s2, z2));
  } else {  // dim i at bits kBits * i
    constexpr int kBits = kv_bits<T>();
    constexpr uint32_t kMask = (1u << kBits) - 1;
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 8; i += 2)
      h[i / 2] = pack2(__fmaf_rn(code_f32((w >> (kBits * i)) & kMask), sz.x, sz.y),
                       __fmaf_rn(code_f32((w >> (kBits * (i + 1))) & kMask), sz.x, sz.y));
    return make_uint4(h[0], h[1], h[2], h[3]);
  }
}

// One side (K or V) of one page: `page` of the cache into page g of the copy, rows r < rows of each head.
template <int D, KvType T>
__device__ __forceinline__ void copy_page(const uint8_t* __restrict__ src, const float2* __restrict__ params,
                                          __half* __restrict__ dst, int page, int g, int rows, int hkv, int bs) {
  constexpr int kChunks = D / 8, kStep = kThreads / kChunks, kCodeBytes = kv_bits<T>();  // 8 dims x bits / 8
  constexpr int kRowBytes = D * kv_bits<T>() / 8;
  const int c = threadIdx.x % kChunks, total = hkv * bs;
  const int64_t src_row0 = static_cast<int64_t>(page) * total, dst_row0 = static_cast<int64_t>(g) * total;
  const uint8_t* s = src + src_row0 * kRowBytes + c * kCodeBytes;
  const float2* p = params + src_row0;
  uint4* d = reinterpret_cast<uint4*>(dst + dst_row0 * D) + c;
  for (int r0 = threadIdx.x / kChunks; r0 < total; r0 += kBatch * kStep) {
    Codes<T> w[kBatch];
    float2 sz[kBatch];
    bool live[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {  // every load of the batch before any store
      const int r = r0 + b * kStep;
      live[b] = r < total && (rows == bs || r % bs < rows);
      if (live[b]) {
        w[b] = load_codes<T>(s + static_cast<int64_t>(r) * kRowBytes);
        sz[b] = __ldg(p + r);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (live[b]) d[static_cast<int64_t>(r0 + b * kStep) * kChunks] = dequant_chunk<T>(w[b], sz[b]);
  }
}

// Per-channel K (u4c / u2c) of one page: the codes as copy_page reads them, each dim's scale and zero those of the
// page's (block, kv head) row of k_params [blocks, Hkv, 2, D] (scales, then zeros), the same f32 FFMA and one
// rounding (the fused producer's values). A thread's 8 scales and 8 zeros are loaded again only where its row
// moves to another kv head.
template <int D, KvType T>
__device__ __forceinline__ void copy_channel_page(const uint8_t* __restrict__ src, const float* __restrict__ params,
                                                  __half* __restrict__ dst, int page, int g, int rows, int hkv,
                                                  int bs) {
  constexpr int kChunks = D / 8, kStep = kThreads / kChunks, kCodeBytes = kv_bits<T>();
  constexpr int kRowBytes = D * kv_bits<T>() / 8, kBits = kv_bits<T>();
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const int c = threadIdx.x % kChunks, total = hkv * bs;
  const int64_t src_row0 = static_cast<int64_t>(page) * total, dst_row0 = static_cast<int64_t>(g) * total;
  const uint8_t* s = src + src_row0 * kRowBytes + c * kCodeBytes;
  uint4* d = reinterpret_cast<uint4*>(dst + dst_row0 * D) + c;
  int head = -1;
  float sc[8], zr[8];
  for (int r0 = threadIdx.x / kChunks; r0 < total; r0 += kBatch * kStep) {
    Codes<T> w[kBatch];
    bool live[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {  // every load of the batch before any store
      const int r = r0 + b * kStep;
      live[b] = r < total && r % bs < rows;
      if (live[b]) w[b] = load_codes<T>(s + static_cast<int64_t>(r) * kRowBytes);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (!live[b]) continue;
      const int r = r0 + b * kStep;
      if (r / bs != head) {
        head = r / bs;
        const float4* pp = reinterpret_cast<const float4*>(params + (src_row0 / bs + head) * (2 * D) + 8 * c);
        const float4 s0 = __ldg(pp), s1 = __ldg(pp + 1), z0 = __ldg(pp + D / 4), z1 = __ldg(pp + D / 4 + 1);
        sc[0] = s0.x, sc[1] = s0.y, sc[2] = s0.z, sc[3] = s0.w, sc[4] = s1.x, sc[5] = s1.y, sc[6] = s1.z, sc[7] = s1.w;
        zr[0] = z0.x, zr[1] = z0.y, zr[2] = z0.z, zr[3] = z0.w, zr[4] = z1.x, zr[5] = z1.y, zr[6] = z1.z, zr[7] = z1.w;
      }
      uint32_t h[4];
#pragma unroll
      for (int i = 0; i < 8; i += 2)
        h[i / 2] = pack2(__fmaf_rn(code_f32((w[b] >> (kBits * i)) & kMask), sc[i], zr[i]),
                         __fmaf_rn(code_f32((w[b] >> (kBits * (i + 1))) & kMask), sc[i + 1], zr[i + 1]));
      d[static_cast<int64_t>(r) * kChunks] = make_uint4(h[0], h[1], h[2], h[3]);
    }
  }
}

// One page of the copy per block (blockIdx.x = seq * max_blocks + block), K (blockIdx.y 0) or V (1). The
// arguments are plain values: no struct indexed at run time, no stack frame. Per-channel K: only the keys every
// query of the chunk sees as sealed codes, below the tail split's bound (prefill_attention_sm90.cuh: whole key
// tiles below min(first_pos, codes_end(first_pos))); the rest stays with the per-channel kernel.
template <int D, KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads)
    prefill_attention_dequant_copy_kernel(const uint8_t* k_src, const uint8_t* v_src, const float2* k_params,
                                          const float2* v_params, __half* k_dst, __half* v_dst,
                                          const int32_t* block_tables, const int32_t* seq_info, int32_t* table_out,
                                          int num_seqs, int max_blocks, int hkv, int block_size) {
  const int g = blockIdx.x;
  if (blockIdx.y == 0 && threadIdx.x == 0) table_out[g] = g;
  const int seq = g / max_blocks, block = g % max_blocks;
  int limit = seq_info[2 * num_seqs + seq];  // kv_len
  if constexpr (kv_per_channel<KT>()) {
    const int first_pos = limit - seq_info[num_seqs + seq];
    limit = prefill_split::splittable_keys(first_pos, block_size, true) / kKeyTile * kKeyTile;  // the kernel's splittable tiles
  }
  const int key0 = block * block_size;
  if (key0 >= limit) return;
  const int page = block_tables[g], rows = min(block_size, limit - key0);
  if (blockIdx.y == 0) {
    if constexpr (kv_per_channel<KT>())
      copy_channel_page<D, KT>(k_src, reinterpret_cast<const float*>(k_params), k_dst, page, g, rows, hkv,
                               block_size);
    else
      copy_page<D, KT>(k_src, k_params, k_dst, page, g, rows, hkv, block_size);
  } else {
    copy_page<D, VT>(v_src, v_params, v_dst, page, g, rows, hkv, block_size);
  }
}

template <int D, KvType KT, KvType VT>
void launch_copy(const PrefillTcArgs& a, __half* k_out, __half* v_out, int32_t* table_out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.num_seqs * a.max_blocks), 2);
  prefill_attention_dequant_copy_kernel<D, KT, VT><<<grid, kThreads, 0, stream>>>(
      a.k, a.v, reinterpret_cast<const float2*>(a.k_params), reinterpret_cast<const float2*>(a.v_params), k_out, v_out,
      a.block_tables, a.seq_info, table_out, a.num_seqs, a.max_blocks, a.hkv, a.block_size);
}

template <int D, KvType KT>
void launch_for_v(const PrefillTcArgs& a, KvType vt, __half* k, __half* v, int32_t* t, cudaStream_t stream) {
  if (vt == KvType::u8) launch_copy<D, KT, KvType::u8>(a, k, v, t, stream);
  if (vt == KvType::u4) launch_copy<D, KT, KvType::u4>(a, k, v, t, stream);
  if (vt == KvType::u2) launch_copy<D, KT, KvType::u2>(a, k, v, t, stream);
}

template <int D>
void launch_for_k(const PrefillTcArgs& a, KvType kt, KvType vt, __half* k, __half* v, int32_t* t,
                  cudaStream_t stream) {
  if (kt == KvType::u8) launch_for_v<D, KvType::u8>(a, vt, k, v, t, stream);
  if (kt == KvType::u4) launch_for_v<D, KvType::u4>(a, vt, k, v, t, stream);
  if (kt == KvType::u2) launch_for_v<D, KvType::u2>(a, vt, k, v, t, stream);
  if (kt == KvType::u4c) launch_for_v<D, KvType::u4c>(a, vt, k, v, t, stream);
  if (kt == KvType::u2c) launch_for_v<D, KvType::u2c>(a, vt, k, v, t, stream);
}

}  // namespace

bool prefill_dequant_copy_covers(int head_dim, KvType kt, KvType vt) {
  auto per_token_int = [](KvType t) { return t == KvType::u8 || t == KvType::u4 || t == KvType::u2; };
  return (head_dim == 64 || head_dim == 128) && (per_token_int(kt) || kv_per_channel_type(kt)) && per_token_int(vt);
}

void prefill_dequant_copy(const PrefillTcArgs& a, int head_dim, KvType kt, KvType vt, __half* k_out, __half* v_out,
                          int32_t* table_out, cudaStream_t stream) {
  LOWBIT_CHECK(prefill_dequant_copy_covers(head_dim, kt, vt), "prefill_attention: the dequantized copy reads ",
               "per-token u8 / u4 / u2 or per-channel u4 / u2 K and per-token u8 / u4 / u2 V at head_dim 64 or 128");
  if (head_dim == 64)
    launch_for_k<64>(a, kt, vt, k_out, v_out, table_out, stream);
  else
    launch_for_k<128>(a, kt, vt, k_out, v_out, table_out, stream);
}

}  // namespace lowbit::cuda
