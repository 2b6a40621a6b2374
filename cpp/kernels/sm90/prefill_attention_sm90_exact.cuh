// Causal paged prefill attention for Hopper (sm_90a) on wgmma with integer K/V entering the MMAs as exact f16 codes:
// prefill_attention_sm90_exact, a variant of prefill_attention_sm90 (prefill_attention_sm90.cuh: the same CTA, tiles,
// warpgroups, swizzled layout, ping-pong schedule and helpers, which this file reuses). Registered under its own
// name and never chosen automatically until it is measured faster (docs/benchmarks_gpu.md, issue 16 round 6).
// What differs:
//   - the producer stores u8/u4/u2 codes as f16, centered (c - 2^(bits-1), exact integers: byte permutes onto the
//     exponent of 1024 and one f16x2 subtract per pair, no per-value f32 math; the base kernel dequantizes in f32),
//     and each key's (scale, zero) of K and V beside the K tile;
//   - the consumers apply them per key in f32:
//       integer K: S = scale_k · (Q · codes_k) + zero_k · Σ_d q (Σ_d q once per row; the zero includes scale ·
//                  center, both carry the softmax scale in the log2 domain)
//       integer V: P·V = (P · scale_v · 2^bits) · codes_v / 2^bits + Σ_k P · zero_v: P is scaled per key in f32
//                  before its f16 rounding, the zero term added once at the end like l;
//   - K and V tiles have their own stages and barriers: K is released once the softmax has its scores (and the
//     parameters), V after P·V; three V stages, three K stages where they fit in shared memory (f16 K and V, and
//     head_dim 64) and two otherwise.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/sm90/prefill_attention_sm90.cuh"

namespace lowbit::cuda {
namespace prefill_sm90_exact {

using prefill_sm90::chunk_offset;
using prefill_sm90::kConsumerRegs;
using prefill_sm90::kKeys;
using prefill_sm90::kNoScore;
using prefill_sm90::kProducerRegs;
using prefill_sm90::kRows;
using prefill_sm90::kThreads;

constexpr int kSmemLimit = 232448;  // 227 KB of dynamic shared memory per block on sm_90

// Integer V enters P·V as P · scale_v: scale_v is about range / (2^bits - 1), so P · scale_v · 2^bits (about P ·
// range) keeps small probabilities out of f16's subnormals; O is divided by 2^bits at the end (exact).
template <KvType T>
constexpr float v_boost() {
  return T == KvType::f16 ? 1.f : static_cast<float>(1 << kv_bits<T>());
}

// Codes enter the MMAs centered, c - 2^(bits - 1) (exact in f16), and the zero takes scale · 2^(bits - 1): the
// rounding of P · scale_v to f16 then weighs |scale · (c - center)| <= range / 2 rather than up to the range.
template <KvType T>
constexpr uint32_t code_center() {
  return T == KvType::f16 ? 0u : 1u << (kv_bits<T>() - 1);
}

template <int D, KvType KT, KvType VT>
struct Layout {
  static constexpr bool kParams = KT != KvType::f16 || VT != KvType::f16;  // an integer side: per-key parameters
  static constexpr int kBlocks = D / 64;               // 128-byte column blocks of a row
  static constexpr int kQBlockBytes = kRows * 128;      // one column block of the Q tile
  static constexpr int kTileBlockBytes = kKeys * 128;   // one column block of a K or V tile
  static constexpr int kQBytes = kBlocks * kQBlockBytes;
  static constexpr int kTileBytes = kBlocks * kTileBlockBytes;
  // A K stage: the tile, then per key (scale_k, zero_k, scale_v, zero_v) f32 where a side is integer.
  static constexpr int kParamBytes = kParams ? kKeys * 16 : 0;
  static constexpr int kKStageBytes = kTileBytes + kParamBytes;
  static constexpr int kVStages = 3;
  static constexpr int kBarriers = 1 + 2 * 3 + 2 * kVStages;  // the most there can be
  static constexpr int kKStages =
      1024 + kQBytes + 3 * kKStageBytes + kVStages * kTileBytes + kBarriers * 8 <= kSmemLimit ? 3 : 2;
  static constexpr int kVOffset = kQBytes + kKStages * kKStageBytes;
  static constexpr int kBarrierOffset = kVOffset + kVStages * kTileBytes;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + (1 + 2 * kKStages + 2 * kVStages) * 8;  // + alignment
  static_assert(kSmemBytes <= kSmemLimit, "shared memory");
};

#ifdef LOWBIT_SM90_DEVICE
using namespace sm90;
using attn_math::pack_half2;
using prefill_sm90::cache_row;
using prefill_sm90::copy_f16_rows;
using prefill_sm90::cp_async16;
using prefill_sm90::cp_async_arrive;
using prefill_sm90::desc_sw128;
using prefill_sm90::exp2_ftz;
using prefill_sm90::fence_proxy_async;
using prefill_sm90::fence_regs;
using prefill_sm90::named_arrive;
using prefill_sm90::named_sync;
using prefill_sm90::prefetch_k;
using prefill_sm90::prefetch_v;
using prefill_sm90::rescale_rows;
using prefill_sm90::wgmma_pv;
using prefill_sm90::wgmma_qk;

// ---- producer -------------------------------------------------------------------------------------------

// The codes of one integer side (K or V) of a tile, read the same way as copy_f16_rows: each load instruction of a
// warp covers whole rows of codes (lane l takes 16-byte vector l % kVecs of row l / kVecs of the group), the row's
// cache index by shuffle from the thread that owns it. They are loaded into registers (load_codes) ahead of the
// stage they go to, then stored there as f16 codes (store_codes).
template <int D, KvType T>
struct TileCodes {
  static constexpr int kBits = kv_bits<T>(), kRowBytes = D * kBits / 8, kVecs = kRowBytes / 16;
  static constexpr int kRowsPerLoad = 32 / kVecs, kChunksPerVec = 16 / kBits;  // a vector holds 128 / kBits dims
  static_assert(kRowBytes % 16 == 0 && 32 % kVecs == 0, "rows of codes are read as 16-byte vectors");
  uint4 w[kVecs];  // load i: this lane's vector of the group's row i * kRowsPerLoad + lane / kVecs
};

template <int D, KvType T>
__device__ __forceinline__ void load_codes(TileCodes<D, T>& codes, const uint8_t* data, int p, int64_t row) {
  using C = TileCodes<D, T>;
  const int lane = p & 31, vec = lane % C::kVecs;
#pragma unroll  // every load in flight at once
  for (int i = 0; i < C::kVecs; ++i) {
    const int64_t src_row = __shfl_sync(0xffffffffu, row, i * C::kRowsPerLoad + lane / C::kVecs);
    codes.w[i] = src_row >= 0 ? __ldg(reinterpret_cast<const uint4*>(data + src_row * C::kRowBytes) + vec)
                              : make_uint4(0, 0, 0, 0);
  }
}

// Bytes b0 and b1 of x (codes < 2^bits <= 256) as the f16 pair (b0 - kC0, b1 - kC0), exactly: byte b under the
// exponent byte 0x64 is the f16 1024 + b, and one subtract takes 1024 + kC0 off both halves. kSel = b0 | b1 << 8
// (byte indices of x).
template <uint32_t kSel, uint32_t kC0>
__device__ __forceinline__ uint32_t bytes_f16x2(uint32_t x) {
  uint32_t y;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(y) : "r"(x), "r"(0x64646464u), "n"((kSel & 0xF) | 0x40 | ((kSel >> 8) << 8) | 0x4000));
  asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(y) : "r"(0x64006400u | kC0 | (kC0 << 16)));
  return y;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t y;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(y) : "r"(a), "r"(b), "r"(sel));
  return y;
}

// Stores the loaded codes as f16 (the codes themselves, exact) into 16-byte chunks of the tile at `tile`.
template <int D, KvType T>
__device__ __forceinline__ void store_codes(const TileCodes<D, T>& codes, uint32_t tile, int p) {
  using C = TileCodes<D, T>;
  constexpr int kBits = C::kBits, kTileBlockBytes = kKeys * 128;
  constexpr uint32_t kC0 = code_center<T>();
  const int lane = p & 31, vec = lane % C::kVecs, warp_row0 = p & ~31;
#pragma unroll
  for (int i = 0; i < C::kVecs; ++i) {
    const int rr = i * C::kRowsPerLoad + lane / C::kVecs;  // the group's row of this lane's vector
    const uint32_t words[4] = {codes.w[i].x, codes.w[i].y, codes.w[i].z, codes.w[i].w};
    // Chunk vec * kChunksPerVec + cc (8 dims) as four f16 pairs, stored as soon as it is made.
    auto store = [&](int cc, uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3) {
      const uint32_t dst = tile + chunk_offset<kTileBlockBytes>(warp_row0 + rr, vec * C::kChunksPerVec + cc);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(x0), "r"(x1), "r"(x2), "r"(x3)
                   : "memory");
    };
    if constexpr (kBits == 8) {  // byte i = dim i
#pragma unroll
      for (int cc = 0; cc < 2; ++cc)
        store(cc, bytes_f16x2<0x0100, kC0>(words[2 * cc]), bytes_f16x2<0x0302, kC0>(words[2 * cc]),
              bytes_f16x2<0x0100, kC0>(words[2 * cc + 1]), bytes_f16x2<0x0302, kC0>(words[2 * cc + 1]));
    } else if constexpr (kBits == 4) {  // dim i in nibble i of the little-endian words
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const uint32_t even = words[cc] & 0x0F0F0F0Fu, odd = (words[cc] >> 4) & 0x0F0F0F0Fu;  // dims 2b, 2b + 1
        const uint32_t lo = prmt(even, odd, 0x5140), hi = prmt(even, odd, 0x7362);  // dims 0-3, 4-7 as bytes
        store(cc, bytes_f16x2<0x0100, kC0>(lo), bytes_f16x2<0x0302, kC0>(lo), bytes_f16x2<0x0100, kC0>(hi),
              bytes_f16x2<0x0302, kC0>(hi));
      }
    } else {  // 2 bits: dim i in bits 2 (i % 4) of byte i / 4; a word holds 16 dims (two chunks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t w = words[q];
        const uint32_t d0 = w & 0x03030303u, d1 = (w >> 2) & 0x03030303u;  // byte b: dims 4b, 4b + 1
        const uint32_t d2 = (w >> 4) & 0x03030303u, d3 = (w >> 6) & 0x03030303u;  // dims 4b + 2, 4b + 3
        const uint32_t a01 = prmt(d0, d1, 0x5140), a23 = prmt(d2, d3, 0x5140);  // dims 0 1 4 5, 2 3 6 7
        store(2 * q, bytes_f16x2<0x0100, kC0>(a01), bytes_f16x2<0x0100, kC0>(a23), bytes_f16x2<0x0302, kC0>(a01),
              bytes_f16x2<0x0302, kC0>(a23));
        const uint32_t b01 = prmt(d0, d1, 0x7362), b23 = prmt(d2, d3, 0x7362);  // dims 8 9 12 13, 10 11 14 15
        store(2 * q + 1, bytes_f16x2<0x0100, kC0>(b01), bytes_f16x2<0x0100, kC0>(b23), bytes_f16x2<0x0302, kC0>(b01),
              bytes_f16x2<0x0302, kC0>(b23));
      }
    }
  }
}

// ---- consumer -------------------------------------------------------------------------------------------

// Scores of one consumer thread's two rows (g and g + 8 of its warp) for one tile: the wgmma accumulator layout,
// s[4j + e] = row (e < 2 ? g : g + 8), key 8j + 2 (lane % 4) + e % 2.
struct RowState {
  float m_lo, m_hi, l_lo, l_hi;  // running max (log2 domain, scaled) and this lane's partial row sums
  float z_lo, z_hi;              // integer V: this lane's partial sums of P · zero_v (the zeros' share of O)
};

// (scale, zero) of K (side 0) or V (side 1) of `key` from a tile's parameters (shared address). Loaded where
// used: the compiler would otherwise keep V's 64 values from K's loads alive through the softmax.
__device__ __forceinline__ float2 key_param(uint32_t prm, int key, int side) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(prm + 16 * key + 8 * side));
  return v;
}

// Turns one tile's raw scores s into unnormalized probabilities P (f32, in place) and updates the row max and
// sums; returns in alpha the factors that rescale O (applied by the caller once the previous tile's P·V has
// landed, so that P·V runs under this softmax). Keys past each row's position are masked where `mask`.
// kPositiveScale: the scale is folded into the exponent's FMA (max over raw scores, then 2^(s·c - m)), which
// needs c > 0; otherwise the scores are scaled first.
// kIntK: s holds Q · codes; the score is scale_k · s + zero_k · Σq (both parameters already carry the softmax
// scale in the log2 domain), read per key from `prm` (the tile's (scale_k, zero_k, scale_v, zero_v) per key).
// kIntV: P leaves as P · scale_v (f32, the f16 rounding comes later) and P · zero_v is summed per row.
template <bool kPositiveScale, bool kIntK, bool kIntV>
__device__ __forceinline__ void softmax_scores(float (&s)[64], RowState& st, float& alpha_lo, float& alpha_hi,
                                               int key0, int pos_lo, int pos_hi, bool mask, float scale_log2,
                                               uint32_t prm, float qsum_lo, float qsum_hi) {
  const int t = threadIdx.x & 3;
  constexpr bool kFold = kPositiveScale && !kIntK;  // raw scores, the scale applied in the exponent
  float mx_lo = kNoScore, mx_hi = kNoScore;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if constexpr (kIntK) {
      const float2 p0 = key_param(prm, 8 * j + 2 * t, 0), p1 = key_param(prm, 8 * j + 2 * t + 1, 0);
      s[4 * j] = fmaf(s[4 * j], p0.x, p0.y * qsum_lo);
      s[4 * j + 1] = fmaf(s[4 * j + 1], p1.x, p1.y * qsum_lo);
      s[4 * j + 2] = fmaf(s[4 * j + 2], p0.x, p0.y * qsum_hi);
      s[4 * j + 3] = fmaf(s[4 * j + 3], p1.x, p1.y * qsum_hi);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = kFold || kIntK ? s[4 * j + e] : s[4 * j + e] * scale_log2;
      if (mask && key0 + 8 * j + 2 * t + (e & 1) > (e < 2 ? pos_lo : pos_hi)) x = kNoScore;
      s[4 * j + e] = x;
    }
    mx_lo = fmaxf(mx_lo, fmaxf(s[4 * j], s[4 * j + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  // The 4 lanes of a quad hold a row's 128 scores.
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  // A row's first tile always holds an unmasked key (key 0), so its max is a real score from then on.
  if (kFold) mx_lo *= scale_log2, mx_hi *= scale_log2;
  mx_lo = fmaxf(mx_lo, st.m_lo);
  mx_hi = fmaxf(mx_hi, st.m_hi);
  alpha_lo = exp2_ftz(st.m_lo - mx_lo);
  alpha_hi = exp2_ftz(st.m_hi - mx_hi);
  st.m_lo = mx_lo;
  st.m_hi = mx_hi;
  const float c = kFold ? scale_log2 : 1.f;
  float sum_lo = 0.f, sum_hi = 0.f, zs_lo = 0.f, zs_hi = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    s[4 * j] = exp2_ftz(fmaf(s[4 * j], c, -mx_lo));
    s[4 * j + 1] = exp2_ftz(fmaf(s[4 * j + 1], c, -mx_lo));
    s[4 * j + 2] = exp2_ftz(fmaf(s[4 * j + 2], c, -mx_hi));
    s[4 * j + 3] = exp2_ftz(fmaf(s[4 * j + 3], c, -mx_hi));
    sum_lo += s[4 * j] + s[4 * j + 1];
    sum_hi += s[4 * j + 2] + s[4 * j + 3];
    if constexpr (kIntV) {
      const float2 p0 = key_param(prm, 8 * j + 2 * t, 1), p1 = key_param(prm, 8 * j + 2 * t + 1, 1);
      zs_lo = fmaf(s[4 * j], p0.y, fmaf(s[4 * j + 1], p1.y, zs_lo));
      zs_hi = fmaf(s[4 * j + 2], p0.y, fmaf(s[4 * j + 3], p1.y, zs_hi));
      s[4 * j] *= p0.x;
      s[4 * j + 1] *= p1.x;
      s[4 * j + 2] *= p0.x;
      s[4 * j + 3] *= p1.x;
    }
  }
  st.l_lo = st.l_lo * alpha_lo + sum_lo;
  st.l_hi = st.l_hi * alpha_hi + sum_hi;
  if constexpr (kIntV) {
    st.z_lo = st.z_lo * alpha_lo + zs_lo;
    st.z_hi = st.z_hi * alpha_hi + zs_hi;
  }
}

template <int D, KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads, 1) prefill_attention_sm90_exact_kernel(const PrefillTcArgs a) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(!kv_per_channel<KT>() && !kv_per_channel<VT>(), "per-token K and V");
  using L = Layout<D, KT, VT>;
  constexpr int kKS = L::kKStages, kVS = L::kVStages;
  constexpr bool kF16K = KT == KvType::f16, kF16V = VT == KvType::f16;
  constexpr int kO = D / 2;  // O accumulators per thread: 64 rows x D over 128 threads
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  uint64_t* full_k = q_full + 1;
  uint64_t* empty_k = full_k + kKS;
  uint64_t* full_v = empty_k + kKS;
  uint64_t* empty_v = full_v + kVS;
  const uint32_t q_smem = smem_u32(smem);
  auto k_tile = [&](int stage) { return q_smem + L::kQBytes + stage * L::kKStageBytes; };
  auto v_tile = [&](int stage) { return q_smem + L::kVOffset + stage * L::kTileBytes; };
  // Per key (scale_k, zero_k, scale_v, zero_v) of a K stage's tile (where a side is integer).
  auto params = [&](int stage) {
    return reinterpret_cast<float4*>(smem + L::kQBytes + stage * L::kKStageBytes + L::kTileBytes);
  };

  const int h = blockIdx.x, seq = blockIdx.z;
  const int q_tile = gridDim.y - 1 - blockIdx.y;  // the longest causal ranges start first
  const int ns = a.num_seqs;
  const int q_start = a.seq_info[seq], q_len = a.seq_info[ns + seq], kv_len = a.seq_info[2 * ns + seq];
  const int row0 = q_tile * kRows;
  if (row0 >= q_len) return;  // the whole CTA leaves before any barrier
  const int kvh = h / (a.hq / a.hkv);
  const int first_pos = kv_len - q_len;  // cache position of query row 0
  const int num_tiles = (first_pos + min(row0 + kRows, q_len) - 1) / kKeys + 1;
  const int32_t* pages = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 128);
    // Every producer thread publishes its rows of a side: by cp.async completion (f16) or by an arrival after
    // its stores (integer codes, and the parameters beside an f16 K tile: one more arrival each).
    for (int s = 0; s < kKS; ++s) {
      mbar_init(&full_k[s], 128 * (kF16K && L::kParams ? 2 : 1));
      mbar_init(&empty_k[s], 256);  // every consumer thread releases
    }
    for (int s = 0; s < kVS; ++s) {
      mbar_init(&full_v[s], 128);
      mbar_init(&empty_v[s], 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // Producer: thread p owns row p of the Q tile and of every K/V tile.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    const int p = threadIdx.x;
    {
      const int r = row0 + p;
      const bool valid = r < q_len;
      const __half* src = a.q + (valid ? static_cast<int64_t>(q_start + r) * a.q_stride_t + h * a.q_stride_h : 0);
#pragma unroll
      for (int c = 0; c < D / 8; ++c)
        cp_async16(q_smem + chunk_offset<L::kQBlockBytes>(p, c), src + 8 * c, valid);
    }
    cp_async_arrive(q_full);
    constexpr bool kAheadK = prefetch_k<D, KT, VT>(), kAheadV = prefetch_v<D, KT, VT>();
    auto row_of = [&](int t) { return t * kKeys + p < kv_len ? cache_row(a, pages, kvh, t * kKeys + p) : int64_t{-1}; };
    // This thread's key's parameters as the consumers apply them: K's carry the softmax scale, V's scale the
    // boost (v_boost), both zeros the codes' center; keys past kv_len get zeros.
    auto params_of = [&](int64_t row) {
      float2 pk = make_float2(0.f, 0.f), pv = make_float2(0.f, 0.f);
      if (row >= 0) {
        if constexpr (!kF16K) pk = __ldg(reinterpret_cast<const float2*>(a.k_params) + row);
        if constexpr (!kF16V) pv = __ldg(reinterpret_cast<const float2*>(a.v_params) + row);
      }
      // Centered codes (code_center): zero + scale · center, in f32.
      const float zk = fmaf(pk.x, static_cast<float>(code_center<KT>()), pk.y);
      const float zv = fmaf(pv.x, static_cast<float>(code_center<VT>()), pv.y);
      return make_float4(pk.x * a.scale_log2, zk * a.scale_log2, pv.x * v_boost<VT>(), zv);
    };
    TileCodes<D, KT> kc;  // the next tile's codes of a side loaded ahead
    TileCodes<D, VT> vc;
    int64_t next_row = row_of(0);
    float4 next_params = make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (L::kParams) next_params = params_of(next_row);
    if constexpr (kAheadK) load_codes<D, KT>(kc, a.k, p, next_row);
    if constexpr (kAheadV) load_codes<D, VT>(vc, a.v, p, next_row);
    for (int t = 0; t < num_tiles; ++t) {
      const int ks = t % kKS, vs = t % kVS;
      const int64_t row = next_row;
      const float4 prm = next_params;
      if (t + 1 < num_tiles) {
        next_row = row_of(t + 1);
        if constexpr (L::kParams) next_params = params_of(next_row);
      }
      TileCodes<D, KT> kcur;
      TileCodes<D, VT> vcur;
      if constexpr (kAheadK) kcur = kc;
      if constexpr (kAheadV) vcur = vc;
      if (t + 1 < num_tiles) {  // the next tile's codes load under this tile's stores
        if constexpr (kAheadK) load_codes<D, KT>(kc, a.k, p, next_row);
        if constexpr (kAheadV) load_codes<D, VT>(vc, a.v, p, next_row);
      }
      mbar_wait(&empty_k[ks], ((t / kKS) & 1) ^ 1);  // the first round passes at once
      if constexpr (kF16K) {
        copy_f16_rows<D, true, false>(a.k, a.v, k_tile(ks), 0, p, row);
        cp_async_arrive(&full_k[ks]);
      } else {
        if constexpr (!kAheadK) load_codes<D, KT>(kcur, a.k, p, row);
        store_codes<D, KT>(kcur, k_tile(ks), p);
      }
      if constexpr (L::kParams) params(ks)[p] = prm;
      if constexpr (!kF16K) fence_proxy_async();  // the codes are read by wgmma
      if constexpr (!kF16K || L::kParams) mbar_arrive(&full_k[ks]);

      mbar_wait(&empty_v[vs], ((t / kVS) & 1) ^ 1);
      if constexpr (kF16V) {
        copy_f16_rows<D, false, true>(a.k, a.v, 0, v_tile(vs), p, row);
        cp_async_arrive(&full_v[vs]);
      } else {
        if constexpr (!kAheadV) load_codes<D, VT>(vcur, a.v, p, row);
        store_codes<D, VT>(vcur, v_tile(vs), p);
        fence_proxy_async();
        mbar_arrive(&full_v[vs]);
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // no copy outlives its thread
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    const int cw = threadIdx.x / 32 - 4 * wg;  // warp in its warpgroup
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int wg_row0 = row0 + 64 * (wg - 1);  // the warpgroup's first query row
    const bool wg_live = wg_row0 < q_len;
    const int wg_last_key = first_pos + min(wg_row0 + 63, q_len - 1);  // the last key a stored row sees
    const int r_lo = wg_row0 + 16 * cw + g, r_hi = r_lo + 8;
    const int pos_lo = first_pos + r_lo, pos_hi = pos_lo + 8;
    const uint32_t q_wg = q_smem + (wg - 1) * 64 * 128;  // the warpgroup's 64 rows in each column block

    float o[kO];
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
    RowState st{kNoScore, kNoScore, 0.f, 0.f, 0.f, 0.f};
    // Rounds r = 0..num_tiles. Round r issues Q·Kᵀ of tile r, then P·V of tile r - 1 (two commit groups), waits for
    // the first, turns tile r's scores into P while P·V runs and releases tile r's K stage, then waits for P·V,
    // releases tile r - 1's V stage and rescales O by the new row maxima. The two warpgroups also take turns
    // issuing (named barriers 2 and 3, warpgroup 1 first), so one's MMAs run while the other does its softmax
    // (FlashAttention-3's ping-pong and intra-warpgroup overlap). A warpgroup's rows see a prefix of n tiles:
    // round 0 (Q·Kᵀ only), rounds 1..n-1 (both) and round n (P·V only) are separate code, because ptxas
    // serializes every wgmma when one may be in flight across a branch; the rounds after n only keep the turns
    // paired and release their stages. A stage is released only after its `full` barrier was seen (so a release
    // never counts toward an earlier fill's phase). Warpgroup 2 passes no turn after its last round.
    const int me = wg - 1;
    if (me == 1) named_arrive(2);
    const int n = wg_live ? min(num_tiles, wg_last_key / kKeys + 1) : 0;
    const bool positive_scale = a.scale_log2 > 0.f;
    float s[64];
    uint32_t pa[32];  // P of the previous tile as the A fragments of its 8 k16 steps
    float alpha_lo, alpha_hi;

    auto wait_k = [&](int t) { mbar_wait(&full_k[t % kKS], (t / kKS) & 1); };
    auto wait_v = [&](int t) { mbar_wait(&full_v[t % kVS], (t / kVS) & 1); };
    auto release_k = [&](int t) { mbar_arrive(&empty_k[t % kKS]); };
    auto release_v = [&](int t) { mbar_arrive(&empty_v[t % kVS]); };
    auto pass_turn = [&](int r) {
      if (!(me == 1 && r == num_tiles)) named_arrive(2 + (me ^ 1));
    };
    auto issue_qk = [&](int t) {
      uint32_t kt = k_tile(t % kKS), qt = q_wg;
      // Opaque here: the descriptors are made at each issue, not hoisted out of the loop into spilled registers.
      asm volatile("" : "+r"(qt));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t col = (kk & 3) << 5;  // k16 step within the 128-byte row
        wgmma_qk(s, desc_sw128(qt + (kk >> 2) * L::kQBlockBytes + col),
                 desc_sw128(kt + (kk >> 2) * L::kTileBlockBytes + col), kk > 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int t) {
      const uint32_t vt = v_tile(t % kVS);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int b = 0; b < L::kBlocks; ++b)
          wgmma_pv(*reinterpret_cast<float(*)[32]>(o + 32 * b), pa + 4 * kk,
                   desc_sw128(vt + b * L::kTileBlockBytes + kk * 2048));
      }
      wgmma_commit();
    };

    mbar_wait(q_full, 0);
    // Integer K: Σ_d q of the thread's two rows (the zeros' share of the scores), in f32 from the Q tile; the 4
    // lanes of a quad each sum a quarter of the rows' 16-byte chunks.
    float qsum_lo = 0.f, qsum_hi = 0.f;
    if constexpr (!kF16K) {
      const int q_lo = 64 * me + 16 * cw + g;
#pragma unroll
      for (int c = t4; c < D / 8; c += 4) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const uint4 w = *reinterpret_cast<const uint4*>(smem + chunk_offset<L::kQBlockBytes>(q_lo + 8 * hi, c));
          const uint32_t words[4] = {w.x, w.y, w.z, w.w};
          float sum = 0.f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[e]));
            sum += f.x + f.y;
          }
          (hi ? qsum_hi : qsum_lo) += sum;
        }
      }
      qsum_lo = attn_math::quad_sum(qsum_lo);
      qsum_hi = attn_math::quad_sum(qsum_hi);
    }
    auto softmax = [&](int t) {
      const int key0 = t * kKeys;
      // The mask only where the tile reaches past the warpgroup's first row (that covers keys past kv_len).
      const bool mask = key0 + kKeys - 1 > first_pos + wg_row0;
      const uint32_t prm = smem_u32(params(t % kKS));
      if (kF16K && positive_scale)
        softmax_scores<true, !kF16K, !kF16V>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, mask, a.scale_log2,
                                             prm, qsum_lo, qsum_hi);
      else
        softmax_scores<false, !kF16K, !kF16V>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, mask, a.scale_log2,
                                              prm, qsum_lo, qsum_hi);
    };
    auto rescale_and_pack_p = [&]() {
      rescale_rows<kO>(o, alpha_lo, alpha_hi);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        pa[4 * kk] = pack_half2(s[8 * kk], s[8 * kk + 1]);
        pa[4 * kk + 1] = pack_half2(s[8 * kk + 2], s[8 * kk + 3]);
        pa[4 * kk + 2] = pack_half2(s[8 * kk + 4], s[8 * kk + 5]);
        pa[4 * kk + 3] = pack_half2(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };
    // Tile t's K stage is free once its scores are in registers (f16), or once the softmax has read its
    // parameters (integer sides).
    auto scores_then_release = [&](int t) {
      if constexpr (!L::kParams) release_k(t);
      softmax(t);
      if constexpr (L::kParams) release_k(t);
    };

    int r = 0;
    if (n > 0) {
      wait_k(0);
      named_sync(2 + me);
      issue_qk(0);
      pass_turn(0);
      wgmma_wait<0>();
      fence_regs(s);
      scores_then_release(0);
      rescale_and_pack_p();
      for (r = 1; r < n; ++r) {
        wait_k(r);
        wait_v(r - 1);
        named_sync(2 + me);
        issue_qk(r);
        issue_pv(r - 1);
        pass_turn(r);
        wgmma_wait<1>();  // Q·Kᵀ landed (groups complete in order); P·V may still run
        fence_regs(s);
        scores_then_release(r);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);  // P's registers stay P's until the wgmmas that read them are done
        release_v(r - 1);
        rescale_and_pack_p();
      }
      if (n < num_tiles) wait_k(n), wait_v(n);  // seen before the rounds below release them
      wait_v(n - 1);
      named_sync(2 + me);
      issue_pv(n - 1);
      pass_turn(n);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release_v(n - 1);
      r = n + 1;
    }
    for (; r <= num_tiles; ++r) {  // tiles past this warpgroup's rows
      if (r < num_tiles) wait_k(r), wait_v(r);
      named_sync(2 + me);
      pass_turn(r);
      if (r > 0) release_k(r - 1), release_v(r - 1);
    }

    // O / l as f16 (integer V: O / boost + Σ P · zero_v); rows past q_len are not stored.
    const float l_lo = attn_math::quad_sum(st.l_lo), l_hi = attn_math::quad_sum(st.l_hi);
    const float inv_lo = 1.f / l_lo, inv_hi = 1.f / l_hi;  // l >= 1: the row max's own term is exp2(0)
    const float z_lo = kF16V ? 0.f : attn_math::quad_sum(st.z_lo), z_hi = kF16V ? 0.f : attn_math::quad_sum(st.z_hi);
    constexpr float kUnboost = 1.f / v_boost<VT>();
    auto out_value = [&](float acc, float z, float inv) { return kF16V ? acc * inv : fmaf(acc, kUnboost, z) * inv; };
    // Accumulator 4j + e of a 64-column block b: dim 64b + 8j + 2 t4 + e % 2 of row (e < 2 ? r_lo : r_hi).
    if (r_lo < q_len) {
      __half* out = a.out + static_cast<int64_t>(q_start + r_lo) * a.out_stride_t + h * a.out_stride_h + 2 * t4;
#pragma unroll
      for (int j = 0; j < kO / 4; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) =
            pack_half2(out_value(o[4 * j], z_lo, inv_lo), out_value(o[4 * j + 1], z_lo, inv_lo));
    }
    if (r_hi < q_len) {
      __half* out = a.out + static_cast<int64_t>(q_start + r_hi) * a.out_stride_t + h * a.out_stride_h + 2 * t4;
#pragma unroll
      for (int j = 0; j < kO / 4; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) =
            pack_half2(out_value(o[4 * j + 2], z_hi, inv_hi), out_value(o[4 * j + 3], z_hi, inv_hi));
    }
  }
}
#else
template <int D, KvType KT, KvType VT>
__global__ void prefill_attention_sm90_exact_kernel(const PrefillTcArgs) {}  // the sm_90a image is the only real one
#endif  // LOWBIT_SM90_DEVICE

}  // namespace prefill_sm90_exact

// Launches the (head_dim, K, V) instance of the exact-code variant: grid (query heads, query tiles of 128, sequences).
template <int D, KvType KT, KvType VT>
void launch_prefill_attention_sm90_exact(const PrefillTcArgs& a, dim3 grid, cudaStream_t stream) {
  using namespace prefill_sm90_exact;
  constexpr int bytes = Layout<D, KT, VT>::kSmemBytes;
  auto kernel = prefill_attention_sm90_exact_kernel<D, KT, VT>;
  LOWBIT_CUDA_CHECK("prefill_attention", cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                              bytes));
  kernel<<<grid, kThreads, bytes, stream>>>(a);
}

}  // namespace lowbit::cuda

// The explicit instances of head_dim D and K type K with every V type (one prefill_attention_sm90_exact_d*_k*.cu
// each).
#define LOWBIT_PREFILL_SM90_EXACT_INSTANCE(D, K, V)                                                    \
  template void launch_prefill_attention_sm90_exact<D, KvType::K, KvType::V>(const PrefillTcArgs&, dim3, \
                                                                               cudaStream_t);
#define LOWBIT_PREFILL_SM90_EXACT_INSTANCES(D, K) \
  namespace lowbit::cuda {                        \
  LOWBIT_PREFILL_SM90_EXACT_INSTANCE(D, K, f16)   \
  LOWBIT_PREFILL_SM90_EXACT_INSTANCE(D, K, u8)    \
  LOWBIT_PREFILL_SM90_EXACT_INSTANCE(D, K, u4)    \
  LOWBIT_PREFILL_SM90_EXACT_INSTANCE(D, K, u2)    \
  }
