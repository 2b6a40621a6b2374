// Causal paged prefill attention for Hopper (sm_90a) on wgmma: f16 queries and outputs, head_dim 64 or 128,
// K and V each f16, u8, u4 or u2 with per-token (scale, zero) f32 parameters (include/lowbit/kv/kv_cache.h).
// Per-channel K (its f16 window) stays on the mma.sync kernel (prefill_attention_tc_sm80.cuh).
//
// A CTA owns 128 query rows of one (sequence, query head) and walks key tiles of 128 up to the last key its last
// row sees. Three warpgroups (FlashAttention-3's split of work, written for the paged cache):
//   - warpgroup 0, the producer: thread p gathers key row p of a tile from its page (any block size) for K and V.
//     f16 rows go straight into the tile by cp.async; u8/u4/u2 rows are loaded into registers and stored as their
//     codes in f16 (exact integers: two instructions per pair of codes, no dequantizing multiply), the row's
//     (scale, zero) beside the tile. Tiles go through two or three stages: the producer fills tile t + 1 while
//     the consumers compute tile t, and publishes a tile (after a proxy fence, so wgmma's async reads see the
//     writes) on the stage's `full` barrier.
//   - warpgroups 1 and 2, the consumers, 64 query rows each (one wgmma m64):
//       S[64, 128] = Q · Kᵀ     wgmma m64n128k16, Q and K from shared memory (K-major, 128-byte swizzle)
//       integer K: S = scale_key * (Q · codes) + zero_key * Σq per key and row, in f32 (exact codes, no
//       rounding of dequantized K)
//       online softmax per row in f32, log2 domain; the causal mask only where a tile reaches past a row
//       integer V: P·V = (P * scale_key) · codes + Σ P * zero_key: P is scaled per key in f32 before its
//       f16 rounding, the zero term summed per row beside l
//       O[64, D] += P · V       wgmma with P from registers (the S accumulators rounded to f16: the A
//                               fragment layout is the accumulator's) and V from shared memory read
//                               MN-major (the transpose bit), so K and V tiles share one layout
//     and release the stage on its `empty` barrier. Each round of a warpgroup issues P·V of the previous tile and
//     Q·Kᵀ of this one together, then runs this tile's softmax; the two warpgroups take turns issuing (named
//     barriers), so one's softmax overlaps the other's MMAs (FlashAttention-3's ping-pong).
// Every tile in shared memory is [rows][D] f16 as D/64 column blocks of [rows][64] (128 bytes per row, 16-byte
// chunks XOR-swizzled by row % 8): the canonical 128B-swizzle layout wgmma's descriptors read, for Q and K along
// K (head_dim) and for V along N (head_dim again).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/sm80/kv_type.cuh"
#include "kernels/sm80/prefill_attention_tc_launch.h"  // PrefillTcArgs: the same arguments as the mma.sync kernel
#include "kernels/sm90/sm90_common.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace prefill_sm90 {

constexpr int kRows = 128;    // query rows per CTA
constexpr int kKeys = 128;    // keys per tile
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
constexpr float kNoScore = -1e30f;  // finite "minus infinity": exp2(kNoScore - m) underflows to 0
// Integer V codes enter the P·V MMA as P·scale: u8 scales (~range/255) would push small P·scale into f16
// subnormals, so they are stored 2^8 times larger and the sum divided by it at the end (exact powers of two).
template <KvType T>
constexpr float v_scale_boost() { return T == KvType::u8 ? 256.f : 1.f; }

template <int D, KvType KT, KvType VT>
struct Layout {
  static constexpr bool kCodes = KT != KvType::f16 || VT != KvType::f16;  // a side holds integer codes
  static constexpr int kBlocks = D / 64;               // 128-byte column blocks of a row
  static constexpr int kQBlockBytes = kRows * 128;      // one column block of the Q tile
  static constexpr int kTileBlockBytes = kKeys * 128;   // one column block of a K or V tile
  static constexpr int kQBytes = kBlocks * kQBlockBytes;
  static constexpr int kTileBytes = kBlocks * kTileBlockBytes;
  static constexpr int kParamBytes = kCodes ? 2 * kKeys * 8 : 0;  // per key (scale, zero) f32 of K, then of V
  static constexpr int kStageBytes = 2 * kTileBytes + kParamBytes;  // K, V, their parameters
  // Three stages where they fit in the 227 KB (f16 at head_dim 128, every head_dim 64 type), else two.
  static constexpr int kStages = kQBytes + 3 * kStageBytes + 2048 <= 232448 ? 3 : 2;
  static constexpr int kBarrierOffset = kQBytes + kStages * kStageBytes;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + (1 + 2 * kStages) * 8;  // + 1024: alignment slack
};

// Byte offset of 16-byte chunk c (8 halves of the row) of row r in a [rows][D] tile of column blocks.
template <int kBlockBytes>
__device__ __forceinline__ uint32_t chunk_offset(int r, int c) {
  return (c >> 3) * kBlockBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

#ifdef LOWBIT_SM90_DEVICE
using namespace sm90;

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Exact f32 of a code c < 2^23: the float 2^23 + c has c in its mantissa.
__device__ __forceinline__ float code_f32(uint32_t c) { return __uint_as_float(0x4B000000u | c) - 8388608.f; }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {  // zeros when !valid
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
// Generic-proxy writes of this thread (st.shared, landed cp.async) made visible to wgmma's async-proxy reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Descriptor of a 128B-swizzled operand: 8-row groups 1024 bytes apart. For K-major operands (Q, K) the
// leading offset is unused; for V read MN-major it would be the distance between 64-wide column blocks, but each
// wgmma here reads one column block (n = 64 per instruction), so both offsets are the 8-row group stride and
// the descriptor means the same under either reading.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1024 >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

// S += Q · Kᵀ for one k16 step (64 rows x 128 keys), both operands from shared memory.
__device__ __forceinline__ void wgmma_qk(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " LOWBIT_REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : LOWBIT_ACC64("+f", d)
      : "l"(da), "l"(db), "r"(accumulate));
}
// O[:, 64-column block] += P · V for one k16 step (16 keys): P from registers, V MN-major (transpose bit set).
__device__ __forceinline__ void wgmma_pv(float (&d)[32], const uint32_t* a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " LOWBIT_REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : LOWBIT_ACC32("+f", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

template <int R>
__device__ __forceinline__ void fence_regs(uint32_t (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
using sm90::fence_regs;

// The consumer warpgroups' turns (named barriers 2 and 3 over their 256 threads; 0 is __syncthreads').
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }

// ---- producer -------------------------------------------------------------------------------------------

// Cache row (page looked up) of key `pos` of kv head kvh.
__device__ __forceinline__ int64_t cache_row(const PrefillTcArgs& a, const int32_t* pages, int kvh, int pos) {
  return (static_cast<int64_t>(pages[pos / a.block_size]) * a.hkv + kvh) * a.block_size + pos % a.block_size;
}

// Two codes (< 2^10) as an f16 pair holding exactly those integers: 1024 + c has c in its mantissa.
__device__ __forceinline__ uint32_t codes_f16x2(uint32_t lo, uint32_t hi) {
  const uint32_t magic = 0x64006400u | lo | (hi << 16);
  const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&magic), __half2(__half(1024.f), __half(1024.f)));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Key row `key` (this thread's row r of the tile) of one side into the tile at `tile` (shared address). f16 rows
// are copied; integer rows land as their codes in f16 (exact), with (scale * param_mul, zero * param_mul) at
// `param` (the consumers apply them around the MMAs).
template <int D, KvType T>
__device__ __forceinline__ void load_key_row(const PrefillTcArgs& a, const uint8_t* data, const float* params,
                                             uint32_t tile, uint32_t param, float scale_mul, float zero_mul,
                                             const int32_t* pages, int kvh, int r, int key, int kv_len) {
  constexpr int kChunks = D / 8, kTileBlockBytes = kKeys * 128;
  const bool valid = key < kv_len;
  const int64_t row = valid ? cache_row(a, pages, kvh, key) : 0;
  if constexpr (T == KvType::f16) {
    const uint8_t* src = data + row * (D * 2);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) cp_async16(tile + chunk_offset<kTileBlockBytes>(r, c), src + 16 * c, valid);
  } else {
    constexpr int kBits = kv_bits<T>(), kRowBytes = D * kBits / 8, kVecs = kRowBytes / 16;
    static_assert(kRowBytes % 16 == 0, "rows of codes are read as 16-byte vectors");
    uint4 w[kVecs];
    float2 sz = make_float2(0.f, 0.f);  // rows past kv_len: codes 0, scale 0, zero 0
    if (valid) {
      const uint4* src = reinterpret_cast<const uint4*>(data + row * kRowBytes);
#pragma unroll
      for (int i = 0; i < kVecs; ++i) w[i] = __ldg(src + i);
      sz = __ldg(reinterpret_cast<const float2*>(params) + row);
    } else {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) w[i] = make_uint4(0, 0, 0, 0);
    }
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(param), "f"(sz.x * scale_mul), "f"(sz.y * zero_mul)
                 : "memory");
    const uint32_t* words = reinterpret_cast<const uint32_t*>(w);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {  // chunk c = dims 8c..8c+7 -> four f16 pairs
      uint32_t v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // dims 8c + 2e, 8c + 2e + 1
        if constexpr (kBits == 8) {  // byte i = dim i
          const uint32_t x = words[2 * c + e / 2] >> (16 * (e % 2));
          v[e] = codes_f16x2(x & 0xFFu, (x >> 8) & 0xFFu);
        } else if constexpr (kBits == 4) {  // dim i in nibble i of the little-endian words
          const uint32_t x = words[c] >> (8 * e);
          v[e] = codes_f16x2(x & 0xFu, (x >> 4) & 0xFu);
        } else {  // 2 bits: dim i in bits 2 (i % 4) of byte i / 4
          const uint32_t x = words[c / 2] >> (16 * (c % 2) + 4 * e);
          v[e] = codes_f16x2(x & 0x3u, (x >> 2) & 0x3u);
        }
      }
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(tile + chunk_offset<kTileBlockBytes>(r, c)),
                   "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                   : "memory");
    }
  }
}

// ---- consumer -------------------------------------------------------------------------------------------

// Scores of one consumer thread's two rows (g and g + 8 of its warp) for one tile: the wgmma accumulator layout,
// s[4j + e] = row (e < 2 ? g : g + 8), key 8j + 2 (lane % 4) + e % 2.
struct RowState {
  float m_lo, m_hi, l_lo, l_hi;  // running max (log2 domain) and this lane's partial row sums
  float z_lo, z_hi;              // integer V: this lane's partial sums of P * zero (the zero points' share of O)
};

// The (scale, zero) pairs of keys 8j + 2t and 8j + 2t + 1 of a tile's parameters (shared address).
__device__ __forceinline__ float4 key_params(uint32_t param, int j, int t) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(param + (8 * j + 2 * t) * 8));
  return v;
}

// Scores to the log2 domain (integer K: S = scale * (Q · codes) + zero * Σq, both pre-multiplied by the softmax
// scale), the mask (keys past each row's position, where `mask`), the online softmax update; rescales o and the
// zero-point sums; leaves P in s. Integer V: P becomes P * scale (f32, before its f16 rounding) and P * zero is
// summed per row.
template <int kO, bool kIntK, bool kIntV>
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&o)[kO], RowState& st, int key0, int pos_lo,
                                             int pos_hi, bool mask, float scale_log2, uint32_t k_param,
                                             uint32_t v_param, float qsum_lo, float qsum_hi) {
  const int t = threadIdx.x & 3;
  float mx_lo = st.m_lo, mx_hi = st.m_hi;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if constexpr (kIntK) {
      const float4 kp = key_params(k_param, j, t);
      s[4 * j] = fmaf(s[4 * j], kp.x, kp.y * qsum_lo);
      s[4 * j + 1] = fmaf(s[4 * j + 1], kp.z, kp.w * qsum_lo);
      s[4 * j + 2] = fmaf(s[4 * j + 2], kp.x, kp.y * qsum_hi);
      s[4 * j + 3] = fmaf(s[4 * j + 3], kp.z, kp.w * qsum_hi);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = kIntK ? s[4 * j + e] : s[4 * j + e] * scale_log2;
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
  const float alpha_lo = exp2f(st.m_lo - mx_lo), alpha_hi = exp2f(st.m_hi - mx_hi);
  st.m_lo = mx_lo;
  st.m_hi = mx_hi;
  float sum_lo = 0.f, sum_hi = 0.f, zs_lo = 0.f, zs_hi = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    s[4 * j] = exp2f(s[4 * j] - mx_lo);
    s[4 * j + 1] = exp2f(s[4 * j + 1] - mx_lo);
    s[4 * j + 2] = exp2f(s[4 * j + 2] - mx_hi);
    s[4 * j + 3] = exp2f(s[4 * j + 3] - mx_hi);
    sum_lo += s[4 * j] + s[4 * j + 1];
    sum_hi += s[4 * j + 2] + s[4 * j + 3];
    if constexpr (kIntV) {
      const float4 vp = key_params(v_param, j, t);
      zs_lo = fmaf(s[4 * j], vp.y, fmaf(s[4 * j + 1], vp.w, zs_lo));
      zs_hi = fmaf(s[4 * j + 2], vp.y, fmaf(s[4 * j + 3], vp.w, zs_hi));
      s[4 * j] *= vp.x;
      s[4 * j + 1] *= vp.z;
      s[4 * j + 2] *= vp.x;
      s[4 * j + 3] *= vp.z;
    }
  }
  st.l_lo = st.l_lo * alpha_lo + sum_lo;
  st.l_hi = st.l_hi * alpha_hi + sum_hi;
  if constexpr (kIntV) {
    st.z_lo = st.z_lo * alpha_lo + zs_lo;
    st.z_hi = st.z_hi * alpha_hi + zs_hi;
  }
#pragma unroll
  for (int i = 0; i < kO; i += 4) {
    o[i] *= alpha_lo;
    o[i + 1] *= alpha_lo;
    o[i + 2] *= alpha_hi;
    o[i + 3] *= alpha_hi;
  }
}

template <int D, KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads, 1) prefill_attention_sm90_kernel(const PrefillTcArgs a) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(!kv_per_channel<KT>() && !kv_per_channel<VT>(), "per-token K and V");
  using L = Layout<D, KT, VT>;
  constexpr int kStages = L::kStages;
  constexpr bool kIntK = KT != KvType::f16, kIntV = VT != KvType::f16;
  constexpr int kO = D / 2;  // O accumulators per thread: 64 rows x D over 128 threads
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;
  const uint32_t q_smem = smem_u32(smem);
  auto k_tile = [&](int stage) { return q_smem + L::kQBytes + stage * L::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + L::kTileBytes; };
  auto k_param = [&](int stage) { return k_tile(stage) + 2 * L::kTileBytes; };  // integer sides only
  auto v_param = [&](int stage) { return k_param(stage) + kKeys * 8; };

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
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 128);   // every producer thread publishes its rows
      mbar_init(&empty[s], 256);  // every consumer thread releases
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // Producer: thread p owns row p of the Q tile and of every K/V tile.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");  // 56 + 2 x 224 per lane triple
    const int p = threadIdx.x;
    {
      const int r = row0 + p;
      const bool valid = r < q_len;
      const __half* src = a.q + (valid ? static_cast<int64_t>(q_start + r) * a.q_stride_t + h * a.q_stride_h : 0);
#pragma unroll
      for (int c = 0; c < D / 8; ++c)
        cp_async16(q_smem + chunk_offset<L::kQBlockBytes>(p, c), src + 8 * c, valid);
    }
    auto load_tile = [&](int t) {
      const int stage = t % kStages;
      mbar_wait(&empty[stage], ((t / kStages) & 1) ^ 1);  // the first round passes at once
      const int key = t * kKeys + p;
      // K's parameters carry the softmax scale (log2 domain); V's scale the boost (v_scale_boost).
      load_key_row<D, KT>(a, a.k, a.k_params, k_tile(stage), k_param(stage) + 8 * p, a.scale_log2, a.scale_log2,
                          pages, kvh, p, key, kv_len);
      load_key_row<D, VT>(a, a.v, a.v_params, v_tile(stage), v_param(stage) + 8 * p, v_scale_boost<VT>(), 1.f,
                          pages, kvh, p, key, kv_len);
      cp_async_commit();
    };
    load_tile(0);  // one cp.async group with Q's
    for (int t = 0; t < num_tiles; ++t) {
      // Three stages: tile t + 1 is in flight while tile t is published (loading t + 1 waits for the release of
      // tile t - 2, which the consumers give in round t - 1). Two stages: the consumers release tile t - 1 only
      // in round t, after tile t is published, so t is published before t + 1 is loaded.
      if (kStages >= 3 && t + 1 < num_tiles) {
        load_tile(t + 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      fence_proxy_async();
      if (t == 0) mbar_arrive(q_full);
      mbar_arrive(&full[t % kStages]);
      if (kStages < 3 && t + 1 < num_tiles) load_tile(t + 1);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
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
    // Rounds r = 0..num_tiles: round r issues P·V of tile r - 1 and Q·Kᵀ of tile r back to back, waits for both,
    // releases tile r - 1's stage and runs the softmax of tile r. The two warpgroups take turns issuing (named
    // barriers 2 and 3, warpgroup 1 first), so one's MMAs run while the other does its softmax. A warpgroup
    // whose rows see no key of a tile (or that has no stored row) skips the tile's MMAs but keeps every turn,
    // so the turns stay paired; warpgroup 2 passes no turn after its last round (nobody would take it).
    const int me = wg - 1;
    if (me == 1) named_arrive(2);
    auto active = [&](int t) { return wg_live && t * kKeys <= wg_last_key; };  // a prefix of the tiles
    float s[64];
    uint32_t pa[32];  // P of the previous tile as the A fragments of its 8 k16 steps
    mbar_wait(q_full, 0);
    // Integer K: Σ_d q of the thread's two rows (the zero points' share of the scores); the 4 lanes of a quad
    // each sum a quarter of the row's 16-byte chunks.
    float qsum_lo = 0.f, qsum_hi = 0.f;
    if constexpr (kIntK) {
      const int q_lo = 64 * me + 16 * cw + g;
#pragma unroll
      for (int c = t4; c < D / 8; c += 4) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          uint32_t w[4];
          asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                       : "r"(q_smem + chunk_offset<L::kQBlockBytes>(q_lo + 8 * hi, c)));
          float sum = 0.f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[e]));
            sum += f.x + f.y;
          }
          (hi ? qsum_hi : qsum_lo) += sum;
        }
      }
      qsum_lo += __shfl_xor_sync(0xffffffffu, qsum_lo, 1);
      qsum_lo += __shfl_xor_sync(0xffffffffu, qsum_lo, 2);
      qsum_hi += __shfl_xor_sync(0xffffffffu, qsum_hi, 1);
      qsum_hi += __shfl_xor_sync(0xffffffffu, qsum_hi, 2);
    }
    for (int r = 0; r <= num_tiles; ++r) {
      const int stage = r % kStages, prev = (r + kStages - 1) % kStages;
      if (r < num_tiles) mbar_wait(&full[stage], (r / kStages) & 1);
      named_sync(2 + me);
      wgmma_fence();
      if (r > 0 && active(r - 1)) {
        const uint32_t vt = v_tile(prev);
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
          for (int b = 0; b < L::kBlocks; ++b)
            wgmma_pv(*reinterpret_cast<float(*)[32]>(o + 32 * b), pa + 4 * kk,
                     desc_sw128(vt + b * L::kTileBlockBytes + kk * 2048));
        }
      }
      if (r < num_tiles && active(r)) {
        const uint32_t kt = k_tile(stage);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint32_t col = (kk & 3) << 5;  // k16 step within the 128-byte row
          wgmma_qk(s, desc_sw128(q_wg + (kk >> 2) * L::kQBlockBytes + col),
                   desc_sw128(kt + (kk >> 2) * L::kTileBlockBytes + col), kk > 0);
        }
      }
      wgmma_commit();
      if (!(me == 1 && r == num_tiles)) named_arrive(2 + (me ^ 1));
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(o);
      fence_regs(pa);  // P's registers stay P's until the wgmmas that read them are done
      if (r > 0) mbar_arrive(&empty[prev]);
      if (r < num_tiles && active(r)) {
        const int key0 = r * kKeys;
        // The mask only where the tile reaches past the warpgroup's first row (that covers keys past kv_len).
        const bool mask = key0 + kKeys - 1 > first_pos + wg_row0;
        softmax_tile<kO, kIntK, kIntV>(s, o, st, key0, pos_lo, pos_hi, mask, a.scale_log2, k_param(stage),
                                       v_param(stage), qsum_lo, qsum_hi);
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          pa[4 * kk] = pack_half2(s[8 * kk], s[8 * kk + 1]);
          pa[4 * kk + 1] = pack_half2(s[8 * kk + 2], s[8 * kk + 3]);
          pa[4 * kk + 2] = pack_half2(s[8 * kk + 4], s[8 * kk + 5]);
          pa[4 * kk + 3] = pack_half2(s[8 * kk + 6], s[8 * kk + 7]);
        }
      }
    }

    // O / l as f16; rows past q_len are not stored.
    float l_lo = st.l_lo, l_hi = st.l_hi;
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
    const float inv_lo = 1.f / l_lo, inv_hi = 1.f / l_hi;  // l >= 1: the row max's own term is exp2(0)
    // Integer V: O = (accumulated P·scale·codes) / boost + Σ P·zero, per row.
    float z_lo = st.z_lo, z_hi = st.z_hi;
    z_lo += __shfl_xor_sync(0xffffffffu, z_lo, 1);
    z_lo += __shfl_xor_sync(0xffffffffu, z_lo, 2);
    z_hi += __shfl_xor_sync(0xffffffffu, z_hi, 1);
    z_hi += __shfl_xor_sync(0xffffffffu, z_hi, 2);
    constexpr float kUnboost = 1.f / v_scale_boost<VT>();
    // Accumulator 4j + e of a 64-column block b: dim 64b + 8j + 2 t4 + e % 2 of row (e < 2 ? r_lo : r_hi).
    if (r_lo < q_len) {
      __half* out = a.out + static_cast<int64_t>(q_start + r_lo) * a.out_stride_t + h * a.out_stride_h + 2 * t4;
#pragma unroll
      for (int j = 0; j < kO / 4; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_half2(fmaf(o[4 * j], kUnboost, z_lo) * inv_lo,
                                                                    fmaf(o[4 * j + 1], kUnboost, z_lo) * inv_lo);
    }
    if (r_hi < q_len) {
      __half* out = a.out + static_cast<int64_t>(q_start + r_hi) * a.out_stride_t + h * a.out_stride_h + 2 * t4;
#pragma unroll
      for (int j = 0; j < kO / 4; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_half2(fmaf(o[4 * j + 2], kUnboost, z_hi) * inv_hi,
                                                                    fmaf(o[4 * j + 3], kUnboost, z_hi) * inv_hi);
    }
  }
}
#else
template <int D, KvType KT, KvType VT>
__global__ void prefill_attention_sm90_kernel(const PrefillTcArgs) {}  // the sm_90a image is the only real one
#endif  // LOWBIT_SM90_DEVICE

}  // namespace prefill_sm90

// Launches the (head_dim, K, V) instance: grid (query heads, query tiles of 128, sequences).
template <int D, KvType KT, KvType VT>
void launch_prefill_attention_sm90(const PrefillTcArgs& a, dim3 grid, cudaStream_t stream) {
  using namespace prefill_sm90;
  constexpr int bytes = Layout<D, KT, VT>::kSmemBytes;
  auto kernel = prefill_attention_sm90_kernel<D, KT, VT>;
  LOWBIT_CUDA_CHECK("prefill_attention", cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                              bytes));
  kernel<<<grid, kThreads, bytes, stream>>>(a);
}

}  // namespace lowbit::cuda
