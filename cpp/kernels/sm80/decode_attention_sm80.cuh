// The decode attention kernel over the paged KV cache (one query token per sequence), K/V in f16, u8, u4 or u2
// with per-token (scale, zero) f32 parameters (include/lowbit/kv/kv_cache.h), on tensor cores.
//
// Grid (sequence, kv head x head slice, split). The query heads of one GQA group (<= 8) are the n8 side
// of mma.sync m16n8k16, so each K/V byte is read once for the whole group; a group of 9-16 heads runs
// as two slices of 8 (two blocks per kv head, each reading the K/V once):
//   scores  Sᵀ[16 tokens, 8 heads] = K[16 tokens, D] · Qᵀ[D, 8 heads]   (K is the A operand)
//   output  Oᵀ[D, 8 heads]        += Vᵀ[D, 16 tokens] · P'ᵀ[16 tokens, 8 heads]
// Integer K/V are fed to the tensor cores as exact f16 integers (magic-number conversion) and
// their parameters are applied outside: q·(k s + z) = s (q·k) + z Σq, and Σ p (v s + z) =
// Σ (p s) v + Σ p z, so P' = p * s_v (BitDecoding-style: dequantize in registers, fold scales).
// The magic numbers are folded too: a code c becomes the exact f16 1024 + c (u4 high nibbles
// 1024 + 16c) with one lop3/prmt and no subtraction, and the known offsets are removed after the
// mma, in f32: q·(1024 + c) = q·c + 1024 Σq, and Σ p'(1024 + c) = Σ p' c + 1024 Σ p'.
// A dot product does not care about the order of its terms, so each lane loads a contiguous run
// of dims (scores) or of dims for 4 tokens (output), and the query / P' operands use the same
// order. Each warp keeps its own online softmax over 16-token tiles (scores in log2 units, the running-max
// update skipped by one vote when no score rises above it); the block's 4 warps merge
// in shared memory; several splits per sequence are merged by a second kernel (flash-decoding).
//
// Per-channel K (KvType::u4c: one (scale, zero) per channel per block of bs tokens) cannot take its scale
// after the mma, since it varies along the dot product: the query is folded instead, once per block,
//   q·(c ⊙ s + z) = (q ⊙ s)·c + q·z,
// so the mma sees the f16 query q ⊙ s and the per-block constant q·z is added to the f32 scores. Each
// warp then walks whole blocks (its bs / 16 tiles in a row) so the fold is paid once per block. Only the
// complete blocks [0, (len / bs) * bs) are read as codes; the newest len % bs keys sit in the f16 window
// (KVCache::k_window) and the grid's last split reads them with the f16-K body (DecodeAttnArgs::k_window).
// u2c is the same at 2 bits.
//
// 2-bit codes (u2, u2c; head_dim a multiple of 64) take the magic-number trick without shifts: field f of a
// byte (bits 2f..2f+1) masked into an f16 1024 is 1024 + 4^f c, so k-step j reads field f = j % 4 of all four
// bytes of a word and the query is multiplied by 4^(3 - f) (exact in f16), which puts every product on the
// same 64x scale, undone after the mma with the offset 1024 Σ(folded q). V's m-tiles read fields (0, 1) or
// (2, 3) and the output rows take their 1 / 4^f after the mma.
//
// This header holds the kernel template; each instance file compiles one (head_dim, K, V) of it and
// decode_attention_sm80.cu dispatches through the generated table (decode_attention_launch.h).
#pragma once
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/pdl.cuh"
#include "kernels/sm80/decode_attention_launch.h"
#include "kernels/sm80/kv_type.cuh"

namespace lowbit::cuda {
namespace decode_attn {

constexpr float kNoScore = -1e30f;  // finite "minus infinity": exp(kNoScore - m) underflows to 0

// The block keeps its scores and running maxima in log2 units (the softmax scale times log2 e folded into one
// multiply), so each exponential is one ex2 (flushing results below 2^-126 to 0: far below f16's P').
__device__ inline float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

__device__ inline uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// A lane's run of bytes (one token's dims) fills whole 32-bit words, little-endian, zero-padded.
constexpr int words_of(int bytes) { return (bytes + 3) / 4; }
// Runs start at multiples of their own length from a 16-byte aligned tensor (lane offsets and row
// strides are multiples of it), so the widest load that divides the length is aligned: 16-byte loads
// for the power-of-two head dims, narrower ones for head_dim 80 and 96 (u4 K at 80: 10 bytes).
constexpr int load_width(int bytes) {
  return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : bytes % 2 == 0 ? 2 : 1;
}

template <int kBytes>
__device__ inline void load_bytes(const uint8_t* p, uint32_t (&r)[words_of(kBytes)]) {
  constexpr int kWidth = load_width(kBytes);
  if constexpr (kWidth == 16) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
    }
  } else if constexpr (kWidth == 8) {
#pragma unroll
    for (int i = 0; i < kBytes / 8; ++i) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
      r[2 * i] = v.x; r[2 * i + 1] = v.y;
    }
  } else if constexpr (kWidth == 4) {
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) r[i] = __ldg(reinterpret_cast<const uint32_t*>(p) + i);
  } else {
#pragma unroll
    for (int w = 0; w < words_of(kBytes); ++w) r[w] = 0;
#pragma unroll
    for (int i = 0; i < kBytes / kWidth; ++i) {
      const uint32_t v = kWidth == 2 ? uint32_t{__ldg(reinterpret_cast<const unsigned short*>(p) + i)}
                                     : uint32_t{__ldg(p + i)};
      r[i * kWidth / 4] |= v << (8 * (i * kWidth % 4));
    }
  }
}

// A run of kBytes (a multiple of 4) from shared memory, in the widest aligned loads (the ring's rows and runs are).
template <int kBytes>
__device__ inline void load_shared(const uint8_t* p, uint32_t (&r)[words_of(kBytes)]) {
  static_assert(kBytes % 4 == 0, "whole words");
  constexpr int kWidth = load_width(kBytes);
#pragma unroll
  for (int i = 0; i < kBytes / kWidth; ++i) {
    if constexpr (kWidth == 16) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
    } else if constexpr (kWidth == 8) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      r[2 * i] = v.x; r[2 * i + 1] = v.y;
    } else {
      r[i] = reinterpret_cast<const uint32_t*>(p)[i];
    }
  }
}

__device__ inline void cp_async16(void* smem, const void* gmem) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}
// Zero-filling forms (src_bytes 0: nothing is read, the destination gets zeros) for rows past the split.
__device__ inline void cp_async16_zfill(void* smem, const void* gmem, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ inline void cp_async8_zfill(void* smem, const void* gmem, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}
// The same with a shared-space address (no conversion per copy).
__device__ inline void cp_async16_s(uint32_t dst, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}
// kL2: an L2 prefetch-size hint (0: none, 128 or 256 bytes): the L2 fetches that much around the 16 bytes from DRAM.
template <int kL2>
__device__ inline void cp_async16_s_hint(uint32_t dst, const void* gmem) {
  if constexpr (kL2 == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
  } else if constexpr (kL2 == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
  } else {
    cp_async16_s(dst, gmem);
  }
}
__device__ inline void cp_async8_s(uint32_t dst, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(gmem) : "memory");
}
// A lane constant the compiler cannot recompute: a shuffle of the value with itself. In the ring loop the compiler
// otherwise rebuilds the lanes' copy and read offsets from the thread index every step (~35 instructions per tile at
// u4/u4), though registers are free to keep them.
__device__ inline uint32_t pin_lane(uint32_t x) {
  uint32_t y;
  asm volatile("shfl.sync.bfly.b32 %0, %1, 0, 0x1f, 0xffffffff;" : "=r"(y) : "r"(x));
  return y;
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory"); }

// Bulk copies into the ring (sm_90: cp.async.bulk through the TMA unit) and the mbarriers that count their bytes. On
// older archs the ring keeps its per-lane copies (kBulkArch); these bodies are then empty and never called.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kBulkArch = true;
#else
constexpr bool kBulkArch = false;
#endif
__device__ inline void mbar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
// The inits visible to the async proxy (the bulk copies' complete_tx) before any copy names the barriers.
__device__ inline void mbar_fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// This thread's arrival on the barrier, once its earlier cp.async copies land (noinc: it is one of the expected
// arrivals; the form that raises the pending count first overflows a barrier of fewer expected arrivals).
__device__ inline void cp_async_mbar_arrive_noinc(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
#endif
}
// Waits for the phase of that parity to complete. The suspend-time hint lets the warp sleep in one try_wait until the
// phase completes rather than re-issue it (measured on an H200: no faster than without it; kept as the intent).
__device__ inline void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n @!done bra WAIT;\n}"
      ::"r"(bar), "r"(parity), "r"(10000000u) : "memory");
#endif
}
// bytes (a multiple of 16; both addresses 16-byte aligned) from global into this CTA's shared memory, counted on bar.
__device__ inline void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

__device__ inline uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {  // (a & b) | c
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
constexpr uint32_t kMagic = 0x64006400;  // f16 pair (1024, 1024)
// The folded forms used by the kernel: codes plus the magic offset, the offsets removed after the mma.
__device__ inline uint32_t nibbles_lo_plus_1024(uint32_t w) {  // low nibble of each half's low byte: 1024 + c
  return lop3_and_or(w, 0x000f000f, kMagic);
}
__device__ inline uint32_t nibbles_hi_plus_1024(uint32_t w) {  // its high nibble: 1024 + 16c
  return lop3_and_or(w, 0x00f000f0, kMagic);
}
__device__ inline uint32_t bytes_plus_1024(uint32_t w, uint32_t sel) {  // two bytes: 1024 + c each
  return __byte_perm(w, 0x64646464, sel);
}

// P' to the B operand of the output mma without shared memory: lane (g, t) holds tokens g (or g + 8), heads 2t, 2t+1
// (the score accumulator's layout); the transpose gives it head g, tokens 2t, 2t+1 (or 2t + 8, 2t + 9).
__device__ inline uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
constexpr uint32_t kOnes = 0x3c003c00;  // f16 pair (1, 1)

__device__ inline void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Query dims that lane t pairs in k-step j of the score mma (relative to its run of D/4 dims):
// f16/u8 read dims in order, u4's nibble trick pairs dim s with s + 4 (k-steps 2i and 2i + 1 share
// word i of the run). An odd last u4 step (head_dim 80) has only its word's low two bytes and pairs
// dim s with s + 2 instead (k_frag).
template <KvType KT, int kSteps>
__device__ inline void q_dims(int j, int& b0_first, int& b0_second, int& b1_first, int& b1_second) {
  if constexpr (kv_bits<KT>() == 2) {
    // Step j: field f = j % 4 of bytes 0/2 (lo) and 1/3 (hi) of word j / 4 (dims 4 * byte + f).
    const int s = 16 * (j >> 2), f = j & 3;
    b0_first = s + f; b0_second = s + 8 + f; b1_first = s + 4 + f; b1_second = s + 12 + f;
  } else if constexpr (KT == KvType::u4 || KT == KvType::u4c) {
    if (kSteps % 2 == 1 && j == kSteps - 1) {
      const int s = 8 * (j >> 1);
      b0_first = s; b0_second = s + 2; b1_first = s + 1; b1_second = s + 3;
    } else {
      const int s = 8 * (j >> 1) + 2 * (j & 1);
      b0_first = s; b0_second = s + 4; b1_first = s + 1; b1_second = s + 5;
    }
  } else {
    b0_first = 4 * j; b0_second = 4 * j + 1; b1_first = 4 * j + 2; b1_second = 4 * j + 3;
  }
}

// 2-bit K: the query multiplier of k-step j, 4^(3 - j % 4): every product lands on the 64x scale.
__device__ constexpr float two_bit_fold(int j) { return static_cast<float>(1 << (6 - 2 * (j & 3))); }

// K A-fragment registers of k-step j from one token's run of D/4 dims (a0/a2 for row g, a1/a3 g+8).
// Integer codes come with their magic offsets (lo: 1024 + c; u4 hi: 1024 + 16c), removed after the mma.
template <KvType KT, int kSteps, int kWords>
__device__ inline void k_frag(const uint32_t (&w)[kWords], int j, uint32_t& lo, uint32_t& hi) {
  if constexpr (KT == KvType::f16) {
    lo = w[2 * j]; hi = w[2 * j + 1];
  } else if constexpr (KT == KvType::u8) {
    lo = bytes_plus_1024(w[j], 0x4140); hi = bytes_plus_1024(w[j], 0x4342);
  } else if constexpr (kv_bits<KT>() == 2) {  // field j % 4 of bytes (0, 2) and (1, 3): 1024 + 4^f c
    const uint32_t word = w[j >> 2], mask = 0x00030003u << (2 * (j & 3));
    lo = lop3_and_or(word, mask, kMagic); hi = lop3_and_or(word >> 8, mask, kMagic);
  } else {
    // The lop3 masks read bytes 0 and 2: steps 2i / 2i + 1 take word i's bytes (0, 2) / (1, 3); an odd
    // last step moves byte 1 into byte 2 (see q_dims).
    const uint32_t word = w[j >> 1];
    const bool odd_last = kSteps % 2 == 1 && j == kSteps - 1;
    const uint32_t x = odd_last ? __byte_perm(word, 0, 0x0100) : (j & 1) ? (word >> 8) : word;
    lo = nibbles_lo_plus_1024(x); hi = nibbles_hi_plus_1024(x);
  }
}

// Vᵀ A-fragment registers of m-tile mt (dims 2mt, 2mt+1 of the lane's run) for tokens (a, b); integer
// codes with their magic offsets as in k_frag (dim0 1024 + c; dim1 1024 + c for u8, 1024 + 16c for u4).
template <KvType VT, int kWords>
__device__ inline void v_frag(const uint32_t (&wa)[kWords], const uint32_t (&wb)[kWords], int mt, uint32_t& dim0,
                              uint32_t& dim1) {
  if constexpr (VT == KvType::f16) {
    dim0 = __byte_perm(wa[mt], wb[mt], 0x5410);
    dim1 = __byte_perm(wa[mt], wb[mt], 0x7632);
  } else if constexpr (VT == KvType::u8) {
    const int byte = (2 * mt) & 3;
    const uint32_t t = __byte_perm(wa[mt >> 1], wb[mt >> 1], byte | (byte + 4) << 4 | (byte + 1) << 8 | (byte + 5) << 12);
    dim0 = bytes_plus_1024(t, 0x4140);
    dim1 = bytes_plus_1024(t, 0x4342);
  } else if constexpr (VT == KvType::u2) {  // byte mt / 2 of the run, fields 2 (mt % 2) and 2 (mt % 2) + 1
    const int byte = (mt >> 1) & 3, shift = 4 * (mt & 1);
    const uint32_t t = __byte_perm(wa[mt >> 3], wb[mt >> 3], byte | byte << 4 | (byte + 4) << 8 | (byte + 4) << 12);
    dim0 = lop3_and_or(t, 0x00030003u << shift, kMagic);        // 1024 + 4^(2 (mt % 2)) c
    dim1 = lop3_and_or(t, 0x000c000cu << shift, kMagic);        // 1024 + 4^(2 (mt % 2) + 1) c
  } else {
    const int byte = mt & 3;
    const uint32_t t = __byte_perm(wa[mt >> 2], wb[mt >> 2], byte | byte << 4 | (byte + 4) << 8 | (byte + 4) << 12);
    dim0 = nibbles_lo_plus_1024(t);
    dim1 = nibbles_hi_plus_1024(t);
  }
}

// One 16-token tile's operands for one lane: K rows g and g+8 with the (scale, zero) of both K and V
// (TileK, loaded one tile ahead), and V tokens 2t, 2t+1, 2t+8, 2t+9 (TileV, the k indices of the output mma's A
// operand in their natural order, loaded at the top of its own tile: the score and softmax work covers its latency,
// and the registers of a second V tile are saved).
template <int kKWords>
struct TileK {
  uint32_t kg[kKWords], kg8[kKWords];
  float2 ksp_g, ksp_g8, vsp_g, vsp_g8;
};
template <int kVWords>
struct TileV {
  uint32_t v[4][kVWords];
};

// The block's shared memory (one set per kernel, whichever body runs). kSub: 16-token tiles per softmax step.
// kRingBytes: the warps' tile rings (RingLayout), which overlay warp_o: the epilogue writes warp_o only after a block
// barrier that follows every warp's loop.
template <int D, int kSub = 1, int kRingBytes = 0>
struct DecodeSmem {
  float warp_m[kWarps][8], warp_l[kWarps][8];
  union {
    __align__(16) float warp_o[kWarps][8][D];
    __align__(16) uint8_t ring[kRingBytes > 0 ? kRingBytes : 16];
  };
};

// With bulk copies (kBulk) the ring's stages are filled by the TMA unit and counted on one mbarrier per stage (per
// warp): they sit outside the union, so the epilogue's warp_o never overwrites a live barrier.
template <int D, int kSub, int kRingBytes, int kBars>
struct DecodeSmemBulk : DecodeSmem<D, kSub, kRingBytes> {
  __align__(8) uint64_t bars[kBars];
};

// One warp's ring of kStages tiles in shared memory (per-token integer K and V, head_dim 128): each stage holds a
// tile's 16 K rows as in the cache, its 16 V rows padded by 16 bytes (so the lanes' reads of rows 2t + {0, 1, 8, 9}
// hit distinct banks), then the 16 K and the 16 V (scale, zero) pairs. kBulk: V unpadded (one bulk copy cannot pad
// rows; the reads avoid the worst conflicts by the token order of bulk_slot_token instead), kBytes a stage's bytes.
template <KvType KT, KvType VT, int D, int kStages, bool kBulk = false>
struct RingLayout {
  static constexpr int kKRow = D * kv_bits<KT>() / 8, kVRow = D * kv_bits<VT>() / 8;
  static constexpr int kVStride = kBulk ? kVRow : kVRow + 16;
  static constexpr int kKOff = 0, kVOff = 16 * kKRow, kPOff = kVOff + 16 * kVStride;
  static constexpr int kStage = kPOff + 32 * 8;
  static constexpr int kWarpBytes = kStages * kStage, kBlockBytes = kStages > 0 ? kWarps * kWarpBytes : 0;
};
// The bulk ring's token order inside a tile: mma slot i (row i of the score tile, k index i of the output mma) holds
// token bulk_slot_token(i): slot 2t is token t, slot 2t + 1 token 7 - t, and slots 8-15 the same plus 8. A dot
// product does not care about the order of its terms, only K, P' and V must agree. With unpadded rows the order keeps
// the lanes' K reads (rows of slots g, g + 8) conflict-free at u4 (16-byte reads, 64-byte rows: slots 2h, 2h + 1 of
// different parity) and u2 (8-byte reads, 32-byte rows: slots 0-3 and 4-7 distinct mod 4), V's reads (rows of slots
// 2t + {0, 1, 8, 9}) conflict-free at u2 (4-byte reads: the four t distinct mod 4) and 2-way at u4 (8-byte reads of
// 64-byte rows: two parities for four t, the least an unpadded row allows), where tokens 2t + {0, 1} would be 4-way.
__host__ __device__ constexpr int bulk_slot_token(int i) {
  return (i & 8) + ((i & 1) ? 7 - ((i & 7) >> 1) : (i & 7) >> 1);
}
// Ring stages of an instance (0: K/V loaded into registers). The ring takes the per-token 4- and 2-bit K and V at
// head_dim 128, whose rows are whole 16-byte chunks and whose four stages fit the 48 KB of static shared memory.
// Measured on an H200 (kernel alone, same call as main's register path, 64 x 8K): u4/u4 181.8 -> 167.9 us, u2/u2
// 155.6 -> 145.4; 3 stages or two score chains no faster, 5 blocks per SM slower. It was predicted to gain ~22% by
// hiding the loads; it hid them, but the loop is bound by its ALU work per tile (docs/gpu_notes.md).
// Its loop runs whole tiles unmasked with the lane constants pinned (209 / 191 SASS instructions per tile for u4/u4 /
// u2/u2, from 270 / 254): measured on an H200 against the loop before in the same call, u2/u2 -14 to -17% at every
// shape, u4/u4 -1% to +3% (-6% at 256 x 1.5K): the 4-bit loop now waits on memory.
template <int D, KvType KT, KvType VT>
constexpr int ring_stages() {
  constexpr bool k_ok = KT == KvType::u4 || KT == KvType::u2, v_ok = VT == KvType::u4 || VT == KvType::u2;
  return D == 128 && k_ok && v_ok ? 4 : 0;
}
// Whether an instance also builds its ring fed by bulk copies (decode_block's kBulk; sm_80 code keeps the lanes'
// copies in both), launched where the split plan sets DecodeAttnArgs::ring_bulk (docs/gpu_notes.md "the ring fed by
// bulk copies"): per-token u4 K and V.
template <int D, KvType KT, KvType VT>
constexpr bool ring_bulk() { return ring_stages<D, KT, VT>() > 0 && KT == KvType::u4 && VT == KvType::u4; }

// One block's work: split `split` of (sequence, kv head slice), written to split slot `slot_split`. window:
// the f16-K body reads the window keys [(len / bs) * bs, len) of per-channel K from p.k_window.
// D: any multiple of 16 (one k-step of the score mma per 16 dims).
// kVAhead: V is loaded one tile ahead with K (integer K and V only), twice the bytes in flight per warp.
// kSub: a warp's step covers kSub consecutive 16-token tiles (per-token K only): their loads are in flight together
// and one running-max update, rescale and P' transpose serve all of them.
// kChains: independent accumulators of the score mma (1 or 2; see score_chains()).
// kVMid: the next tile's V is issued right after this tile's score mma (its K registers are dead by then), so V's
// latency has the softmax and output mma of this tile to hide in. Measured 47% slower for u4/u4 at 4 blocks (it spills
// 8 bytes there: 261.6 vs 177.5 us at 64 x 8K, H200): no instance takes it.
// kRing: stages of the warp's shared-memory ring (0: none; see RingLayout): tile i + kRing - 1 is copied by cp.async
// while tile i is computed, and nothing of it is held in registers until it is used. Any number of stages (past 48 KB
// the kernel takes dynamic shared memory); measured no faster than 4 (docs/gpu_notes.md "what bounds the 4-bit ring").
// kL2: the ring's code copies with an L2 prefetch-size hint of that many bytes (0: none; 128 / 256 measured no faster).
// kBulk: on sm_90, the ring's whole tiles come from four bulk copies issued by lane 0 (K, V and the two parameter
// runs), counted on the stage's mbarrier (Smem::bars), in place of the lanes' 16-byte cp.async; V unpadded, the
// tile's tokens in the order of bulk_slot_token. Other tiles keep the lanes' copies and signal the same barrier.
template <KvType KT, KvType VT, int D, bool kVAhead = false, int kSub = 1, int kChains = 1, bool kVMid = false,
          int kRing = 0, int kL2 = 0, bool kBulk = false, class Smem>
__device__ __forceinline__ void decode_block(const DecodeAttnArgs& p, Smem& sm, int split, int slot_split,
                                             bool window) {
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
  static_assert((kv_bits<KT>() != 2 && kv_bits<VT>() != 2) || D % 64 == 0, "2-bit K/V need head_dim % 64 == 0");
  static_assert(kSub == 1 || kSub == 2, "one or two tiles per softmax step");
  static_assert(kSub == 1 || (!kv_per_channel<KT>() && KT != KvType::f16), "per-token integer K only");
  auto& warp_m = sm.warp_m;
  auto& warp_l = sm.warp_l;
  auto& warp_o = sm.warp_o;
  const uint8_t* const k_base = window ? reinterpret_cast<const uint8_t*>(p.k_window) : p.k;
  constexpr int kKBytes = D / 4 * kv_bits<KT>() / 8;   // a lane's run of D/4 dims of one token
  constexpr int kVBytes = D / 8 * kv_bits<VT>() / 8;   // a lane's run of D/8 dims of one token
  constexpr int kKWords = words_of(kKBytes), kVWords = words_of(kVBytes);
  constexpr int kSteps = D / 16;  // k-steps of the score mma = m-tiles of the output mma

  // Per-token (scale, zero) of K in k_params: u8, u4 and u2 (u4c/u2c keep one pair per channel per block).
  constexpr bool kTokenKParams = KT == KvType::u8 || KT == KvType::u4 || KT == KvType::u2;
  constexpr bool kChannelK = kv_per_channel<KT>();
  // The sm_80 code of per-token u4 K at head_dim 128 (pinned to 128 registers) has fewer to spare than sm_90's: it
  // looks its rows up where it loads, and keeps one score chain if two are asked for (else it spills 4-12 bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kTight = D == 128 && KT == KvType::u4;
#else
  constexpr bool kTight = false;
#endif
  constexpr bool kTwoBitK = kv_bits<KT>() == 2;
  const int b = blockIdx.x, kvh = blockIdx.y / p.slices;
  const int head0 = kvh * p.group + 8 * (blockIdx.y % p.slices);             // this block's first query head
  const int heads = min(8, kvh * p.group + p.group - head0);                  // and how many it serves
  // The ring's warp index comes through a shuffle from lane 0: the compiler then knows it is the same for the whole
  // warp, so the tile indices and their bounds checks are uniform (uniform registers and branches, not per-lane ALU
  // work). The register-path instances keep threadIdx.x / 32: with the shuffle, u4 K with u8 or f16 V at its pinned
  // 128 registers spilled 4-20 bytes more, and u4/u4 on that path ran 2% slower (H200).
  const int warp = kRing > 0 ? __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0)
                             : static_cast<int>(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int len = p.seq_lens[b];
  // The keys this block reads: per-channel K stops at the last complete block; the window body reads what
  // follows it (the f16 window rows).
  const int complete = len / p.block_size * p.block_size;
  const int lo = window ? complete : 0, hi = kChannelK ? complete : len;
  const int start = lo + split * p.split_tokens, end = min(start + p.split_tokens, hi);
  const int n = max(end - start, 0);
  const int* pages = p.block_tables + static_cast<int64_t>(b) * p.max_blocks;  // read through L1 per tile

  // Query as the B operand: column g = head g of the group (zero past the group). q stays exact
  // f16 (the softmax scale is applied to the f32 scores), so K·q has only f32 rounding.
  const int kv_dims = D / 4 * t;  // this lane's run for scores
  uint32_t qf[kSteps][2];
  float qpart = 0.f, qlo_part = 0.f;  // Σq over this lane's dims; over those paired with lo registers
  float qfold_part = 0.f;             // 2-bit K: Σ of the folded query (4^(3 - f) q) over this lane's dims
  const bool live = g < heads;
  const __half* qh = p.q + b * p.q_stride_b + (head0 + (live ? g : 0)) * p.q_stride_h + kv_dims;
  const __half zero = __float2half(0.f);
  // u4c: the warp's staging lives in its warp_o rows (8 D floats, unused until the epilogue): two buffers of
  // a block's per-channel (scale, zero) rows, filled by cp.async one block ahead, then the unfolded query
  // [8 heads][D] (each lane keeps its own head's run of dims there; registers are too few to keep it).
  float* const chan = &warp_o[warp][0][0];
  __half* const q_stage = reinterpret_cast<__half*>(chan + 4 * D) + g * D + kv_dims;
  {
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      int d00, d01, d10, d11;
      q_dims<KT, kSteps>(j, d00, d01, d10, d11);
      const __half2 lo = live ? __halves2half2(qh[d00], qh[d01]) : __halves2half2(zero, zero);
      const __half2 hi = live ? __halves2half2(qh[d10], qh[d11]) : __halves2half2(zero, zero);
      if constexpr (kChannelK) {
        q_stage[d00] = __low2half(lo);
        q_stage[d01] = __high2half(lo);
        q_stage[d10] = __low2half(hi);
        q_stage[d11] = __high2half(hi);
      }
      // u4 K: the lo registers hold 1024 + c and the hi ones 1024 + 16c; q times 16 on the lo side
      // (exact in f16) puts both on the same 16x scale, undone after the mma.
      if constexpr (KT == KvType::u2) {  // both registers on the 64x scale (see two_bit_fold)
        const __half2 fold = __float2half2_rn(two_bit_fold(j));
        qf[j][0] = h2u(__hmul2(lo, fold));
        qf[j][1] = h2u(__hmul2(hi, fold));
      } else {
        qf[j][0] = h2u(KT == KvType::u4 ? __hmul2(lo, __float2half2_rn(16.f)) : lo);
        qf[j][1] = h2u(hi);
      }
      const float2 a = __half22float2(lo), c = __half22float2(hi);
      if constexpr (KT == KvType::u2) qfold_part += two_bit_fold(j) * ((a.x + a.y) + (c.x + c.y));
      qpart += (a.x + a.y) + (c.x + c.y);
      qlo_part += a.x + a.y;
    }
  }
  qpart += __shfl_xor_sync(0xffffffffu, qpart, 1);
  qpart += __shfl_xor_sync(0xffffffffu, qpart, 2);
  qlo_part += __shfl_xor_sync(0xffffffffu, qlo_part, 1);
  qlo_part += __shfl_xor_sync(0xffffffffu, qlo_part, 2);
  // Σq of the two heads this lane's score/output columns hold (2t, 2t+1).
  const float qsum0 = __shfl_sync(0xffffffffu, qpart, (2 * t) * 4), qsum1 = __shfl_sync(0xffffffffu, qpart, (2 * t + 1) * 4);
  // Integer K: the mma gives k_fold * (q·c + k_offset) per head; q·c = mma / k_fold - k_offset.
  // u8: 1024 Σq. u4: (16·1024 Σq_lo + 1024 Σq_hi) / 16 = 1024 Σq_lo + 64 Σq_hi.
  // 2-bit: the mma gives 64 q·c + 1024 Σ(folded q), so k_offset = 16 Σ(folded q).
  constexpr float k_fold = kTwoBitK ? 64.f : KT == KvType::u4 || KT == KvType::u4c ? 16.f : 1.f;
  float k_offset0 = 0.f, k_offset1 = 0.f;
  if constexpr (KT == KvType::u2) {
    qfold_part += __shfl_xor_sync(0xffffffffu, qfold_part, 1);
    qfold_part += __shfl_xor_sync(0xffffffffu, qfold_part, 2);
    k_offset0 = 16.f * __shfl_sync(0xffffffffu, qfold_part, (2 * t) * 4);
    k_offset1 = 16.f * __shfl_sync(0xffffffffu, qfold_part, (2 * t + 1) * 4);
  } else if constexpr (kTokenKParams) {
    const float lo0 = __shfl_sync(0xffffffffu, qlo_part, (2 * t) * 4);
    const float lo1 = __shfl_sync(0xffffffffu, qlo_part, (2 * t + 1) * 4);
    k_offset0 = KT == KvType::u8 ? 1024.f * qsum0 : 1024.f * lo0 + 64.f * (qsum0 - lo0);
    k_offset1 = KT == KvType::u8 ? 1024.f * qsum1 : 1024.f * lo1 + 64.f * (qsum1 - lo1);
  }

  auto row_of = [&](int i) -> int64_t {  // token i of the split -> row in [blocks, Hkv, bs]
    const int tok = start + i;
    const int page_idx = p.block_shift >= 0 ? tok >> p.block_shift : tok / p.block_size;
    const int in_page = p.block_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
    const int page = __ldg(pages + page_idx);
    return (static_cast<int64_t>(page) * p.hkv + kvh) * p.block_size + in_page;
  };
  // The K row of a cache row: itself, or for the window body the same row of the block's window slot
  // (the host gives every block the launch reads a slot; a missing one reads slot 0, never out of bounds).
  auto k_row_of = [&](int64_t row) -> int64_t {
    if constexpr (KT == KvType::f16) {
      if (window) {
        const int64_t page = row / (static_cast<int64_t>(p.hkv) * p.block_size);
        const int slot = max(__ldg(p.window_map + page), 0);
        return row + (slot - page) * static_cast<int64_t>(p.hkv) * p.block_size;
      }
    }
    return row;
  };

  // u4c: cp.async the per-channel (scale, zero) rows of the block holding token i of the split into buffer buf.
  auto stage_params = [&](int i, int buf) {
    if constexpr (kChannelK) {
      const int page = __ldg(pages + (start + i) / p.block_size);
      const float* src = p.k_params + (static_cast<int64_t>(page) * p.hkv + kvh) * 2 * D;
      for (int c = lane; c < D / 2; c += 32) cp_async16(chan + buf * 2 * D + 4 * c, src + 4 * c);
      cp_async_commit();
    }
  };
  // u4c: refold the query with the staged (scale, zero) of buffer buf: qf = q ⊙ s (lo side times 16 as for
  // u4), the magic offsets from the folded sums, and q·z per head.
  float zsum0 = 0.f, zsum1 = 0.f;
  auto fold_query = [&](int buf) {
    if constexpr (kChannelK) {
      const float* sc = chan + buf * 2 * D + kv_dims;
      const float* zr = sc + D;
      float qp = 0.f, ql = 0.f, zp = 0.f;
      // k-step j: lo pairs dims (d00, d01), hi pairs (d10, d11) with the scales of the same dims. u2c: both
      // registers times two_bit_fold(j), qp then sums the folded query (k_offset = 16 qp).
      auto fold_step = [&](int j, float2 a, float2 c, float s00, float s01, float s10, float s11) {
        const __half2 flo = __floats2half2_rn(a.x * s00, a.y * s01);
        const __half2 fhi = __floats2half2_rn(c.x * s10, c.y * s11);
        if constexpr (kTwoBitK) {
          const __half2 fold = __float2half2_rn(two_bit_fold(j));
          qf[j][0] = h2u(__hmul2(flo, fold));
          qf[j][1] = h2u(__hmul2(fhi, fold));
        } else {
          qf[j][0] = h2u(__hmul2(flo, __float2half2_rn(16.f)));
          qf[j][1] = h2u(fhi);
        }
        const float2 fa = __half22float2(flo), fc = __half22float2(fhi);  // the sums of what the mma sees
        if constexpr (kTwoBitK) {
          qp += two_bit_fold(j) * ((fa.x + fa.y) + (fc.x + fc.y));
        } else {
          qp += (fa.x + fa.y) + (fc.x + fc.y);
          ql += fa.x + fa.y;
        }
      };
      if constexpr (kSteps % 2 == 0 && !kTwoBitK) {
        // Steps 2i and 2i + 1 cover dims 8i..8i+7 of the run (q_dims): two 16-byte loads of scales, two of
        // zeros and one of the query per pair of steps.
#pragma unroll
        for (int i = 0; i < kSteps / 2; ++i) {
          const float4 s0 = *reinterpret_cast<const float4*>(sc + 8 * i);
          const float4 s1 = *reinterpret_cast<const float4*>(sc + 8 * i + 4);
          const float4 z0 = *reinterpret_cast<const float4*>(zr + 8 * i);
          const float4 z1 = *reinterpret_cast<const float4*>(zr + 8 * i + 4);
          const uint4 qv = *reinterpret_cast<const uint4*>(q_stage + 8 * i);
          const float2 q01 = __half22float2(*reinterpret_cast<const __half2*>(&qv.x));
          const float2 q23 = __half22float2(*reinterpret_cast<const __half2*>(&qv.y));
          const float2 q45 = __half22float2(*reinterpret_cast<const __half2*>(&qv.z));
          const float2 q67 = __half22float2(*reinterpret_cast<const __half2*>(&qv.w));
          fold_step(2 * i, make_float2(q01.x, q45.x), make_float2(q01.y, q45.y), s0.x, s1.x, s0.y, s1.y);
          fold_step(2 * i + 1, make_float2(q23.x, q67.x), make_float2(q23.y, q67.y), s0.z, s1.z, s0.w, s1.w);
          zp += q01.x * z0.x + q01.y * z0.y + q23.x * z0.z + q23.y * z0.w + q45.x * z1.x + q45.y * z1.y +
                q67.x * z1.z + q67.y * z1.w;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kSteps; ++j) {
          int d00, d01, d10, d11;
          q_dims<KT, kSteps>(j, d00, d01, d10, d11);
          const float2 a = make_float2(__half2float(q_stage[d00]), __half2float(q_stage[d01]));
          const float2 c = make_float2(__half2float(q_stage[d10]), __half2float(q_stage[d11]));
          fold_step(j, a, c, sc[d00], sc[d01], sc[d10], sc[d11]);
          zp += a.x * zr[d00] + a.y * zr[d01] + c.x * zr[d10] + c.y * zr[d11];
        }
      }
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {
        qp += __shfl_xor_sync(0xffffffffu, qp, o);
        ql += __shfl_xor_sync(0xffffffffu, ql, o);
        zp += __shfl_xor_sync(0xffffffffu, zp, o);
      }
      const float qs0 = __shfl_sync(0xffffffffu, qp, (2 * t) * 4), qs1 = __shfl_sync(0xffffffffu, qp, (2 * t + 1) * 4);
      const float l0 = __shfl_sync(0xffffffffu, ql, (2 * t) * 4), l1 = __shfl_sync(0xffffffffu, ql, (2 * t + 1) * 4);
      k_offset0 = kTwoBitK ? 16.f * qs0 : 1024.f * l0 + 64.f * (qs0 - l0);
      k_offset1 = kTwoBitK ? 16.f * qs1 : 1024.f * l1 + 64.f * (qs1 - l1);
      zsum0 = __shfl_sync(0xffffffffu, zp, (2 * t) * 4);
      zsum1 = __shfl_sync(0xffffffffu, zp, (2 * t + 1) * 4);
    }
  };

  // Per head (2t, 2t+1): running max (log2 units), Σp, Σ p z_v, and Σ p' (the f16 P' the mma saw, for the V offset;
  // a tensor-core sum, below: wsum[0] / wsum[1] hold it whole, for the lane's two heads).
  const float scale_log2 = p.scale * kLog2e;
  float m0 = kNoScore, m1 = kNoScore, l0 = 0.f, l1 = 0.f, z0 = 0.f, z1 = 0.f;
  float wsum[4] = {};
  float acc[kSteps][4] = {};
  const int v_dims = D / 8 * g;  // this lane's run for the output
  // Per-token integer K: the score mma starts from -k_fold * k_offset (exact: k_fold is a power of two), so it ends
  // at k_fold (q·c), and the score in log2 units is one fma per element:
  //   s (q·c) scale + z Σq scale = mma * (s scale / k_fold) + z (Σq scale).
  const float init0 = kTokenKParams ? -k_fold * k_offset0 : 0.f, init1 = kTokenKParams ? -k_fold * k_offset1 : 0.f;
  const float qz0 = qsum0 * scale_log2, qz1 = qsum1 * scale_log2;
  constexpr float kScoreMul = 1.f / k_fold;

  using KRegs = TileK<kKWords>;
  using VRegs = TileV<kVWords>;
  constexpr int kKRow = D * kv_bits<KT>() / 8, kVRow = D * kv_bits<VT>() / 8;  // bytes of one token's row
  // This lane's byte offsets inside a tile whose 16 rows are consecutive (one page): K rows g and
  // g + 8 at its run of dims, V rows 2t, 2t+1, 2t+8, 2t+9 at its run; fixed for the whole loop.
  const int k_off = g * kKRow + kv_dims * kv_bits<KT>() / 8;
  const int v_off = 2 * t * kVRow + v_dims * kv_bits<VT>() / 8;
  auto v_row = [](int u) { return (u & 1) + 8 * (u >> 1); };  // V token u of the lane, past 2t
  // A whole tile inside one page takes one page lookup, then every address is the tile's first row
  // plus a lane constant (no per-row index math or bounds checks: most of the loop's integer work).
  // Otherwise (a partial last tile, or pages not aligned to tiles) rows are looked up one by one and
  // rows past the split read as zeros with neutral parameters.
  auto full_tile = [&](int tile) { return p.tile_in_one_page && tile + kTile <= n; };
  // The page of a whole tile is read one step before its K loads are issued (page_ahead below), so those loads do
  // not wait for the lookup; its first row (base) then serves K, both parameter rows and V.
  auto page_of = [&](int tile) -> int {
    const int tok = start + tile;
    return __ldg(pages + (p.block_shift >= 0 ? tok >> p.block_shift : tok / p.block_size));
  };
  auto base_of = [&](int tile, int page) -> int64_t {
    const int tok = start + tile;
    const int in_page = p.block_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
    return (static_cast<int64_t>(page) * p.hkv + kvh) * p.block_size + in_page;
  };
  const float2 none = make_float2(1.f, 0.f);
  // The page of the next step's tile is looked up a step ahead (kRowAhead: one tile per step, per-token K; the
  // per-channel bodies keep their registers for the query fold) and base is its first row; otherwise the loads look
  // their row up here. Per-token u4 K with u8 V at head_dim 128 looks up too: the 3 registers the lookup ahead holds
  // would make it spill at its pinned 128.
  constexpr bool kRowAhead = kSub == 1 && !kChannelK && !(D == 128 && KT == KvType::u4 && VT == KvType::u8) && !kTight;
  auto load_k = [&](int tile, KRegs& r, int64_t base) {
    r.ksp_g = r.ksp_g8 = r.vsp_g = r.vsp_g8 = none;
    if (full_tile(tile)) {
      if constexpr (!kRowAhead) base = row_of(tile);
      const uint8_t* kt = k_base + k_row_of(base) * kKRow + k_off;
      load_bytes<kKBytes>(kt, r.kg);
      load_bytes<kKBytes>(kt + 8 * kKRow, r.kg8);
      if constexpr (kTokenKParams) {
        const float2* kp = reinterpret_cast<const float2*>(p.k_params) + base + g;
        r.ksp_g = __ldg(kp);
        r.ksp_g8 = __ldg(kp + 8);
      }
      if constexpr (VT != KvType::f16) {
        const float2* vp = reinterpret_cast<const float2*>(p.v_params) + base + g;
        r.vsp_g = __ldg(vp);
        r.vsp_g8 = __ldg(vp + 8);
      }
      return;
    }
#pragma unroll
    for (int w = 0; w < kKWords; ++w) r.kg[w] = r.kg8[w] = 0;
    if (tile + g < n) {
      const int64_t rg = row_of(tile + g);
      load_bytes<kKBytes>(k_base + k_row_of(rg) * kKRow + kv_dims * kv_bits<KT>() / 8, r.kg);
      if constexpr (kTokenKParams) r.ksp_g = __ldg(reinterpret_cast<const float2*>(p.k_params) + rg);
      if constexpr (VT != KvType::f16) r.vsp_g = __ldg(reinterpret_cast<const float2*>(p.v_params) + rg);
    }
    if (tile + g + 8 < n) {
      const int64_t rg8 = row_of(tile + g + 8);
      load_bytes<kKBytes>(k_base + k_row_of(rg8) * kKRow + kv_dims * kv_bits<KT>() / 8, r.kg8);
      if constexpr (kTokenKParams) r.ksp_g8 = __ldg(reinterpret_cast<const float2*>(p.k_params) + rg8);
      if constexpr (VT != KvType::f16) r.vsp_g8 = __ldg(reinterpret_cast<const float2*>(p.v_params) + rg8);
    }
  };
  auto load_v = [&](int tile, VRegs& r, int64_t base) {
    if (full_tile(tile)) {
      const uint8_t* vt = p.v + (kRowAhead ? base : row_of(tile)) * kVRow + v_off;
#pragma unroll
      for (int u = 0; u < 4; ++u) load_bytes<kVBytes>(vt + v_row(u) * kVRow, r.v[u]);
      return;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int w = 0; w < kVWords; ++w) r.v[u][w] = 0;
      const int tok = tile + 2 * t + v_row(u);
      if (tok < n) load_bytes<kVBytes>(p.v + row_of(tok) * kVRow + v_dims * kv_bits<VT>() / 8, r.v[u]);
    }
  };

  // Integer K: the next tile's K is issued before this tile is used (its registers are few); f16
  // tiles are large enough that occupancy hides the latency instead.
  constexpr bool kUseRing = kRing > 0;
  constexpr bool kPrefetch = KT != KvType::f16 && VT != KvType::f16 && !kUseRing;
  // The steps this warp visits, in order: every 4th step of kSub tiles; for u4c every 4th block, its bs / 16 tiles
  // in a row (the split starts on a block boundary), so the query is refolded once per block.
  const int tiles_per_block = kChannelK ? p.block_size / kTile : 1;
  auto tile_of = [&](int i) -> int {
    if constexpr (kChannelK)
      return ((i / tiles_per_block) * kWarps + warp) * p.block_size + (i % tiles_per_block) * kTile;
    return (i * kWarps + warp) * kTile * kSub;
  };
  static_assert(!kUseRing || (D == 128 && kTokenKParams && VT != KvType::f16 && kSub == 1 && !kVAhead && !kVMid),
                "the ring takes per-token integer K and V at head_dim 128, one tile per step");
  static_assert(!kVAhead || kPrefetch, "V ahead needs integer K and V");
  static_assert(kSub == 1 || kPrefetch, "two tiles per step need integer K and V");
  static_assert(!kVMid || (kPrefetch && !kVAhead && kSub == 1), "V mid-tile: integer K and V, one tile per step");
  // kRowAhead: the first row of the step's tile (base_cur) and of the next one come from page lookups made a step
  // earlier (of a tile in the split: its page is in the table).
  auto page_ahead = [&](int tile) { return kRowAhead && tile < n ? page_of(tile) : 0; };
  auto base_ahead = [&](int tile, int page) -> int64_t { return kRowAhead ? base_of(tile, page) : 0; };
  int64_t base_cur = 0;
  int page_next = 0;
  if constexpr (!kUseRing) {
    base_cur = base_ahead(tile_of(0), page_ahead(tile_of(0)));
    page_next = page_ahead(tile_of(1));
  }

  // ---- the ring (kUseRing): this warp's stages, a tile's copy and its reads
  constexpr bool kBulkRing = kUseRing && kBulk && kBulkArch;
  using Ring = RingLayout<KT, VT, D, kRing, kBulkRing>;
  uint8_t* const ring = sm.ring + warp * Ring::kWarpBytes;
  // kBulkRing: the warp's kRing barriers (32 arrivals each phase, one per lane), and whether the cache's four tensors
  // are 16-byte aligned, as bulk copies need (else every tile takes the lanes' copies).
  uint32_t ring_bar = 0;
  bool bulk_ok = false;
  if constexpr (kBulkRing) {
    ring_bar = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.bars[warp * kRing]));
    if (lane == 0) {
#pragma unroll
      for (int st = 0; st < kRing; ++st) mbar_init(ring_bar + 8 * st, 32);
      mbar_fence_init();
    }
    __syncwarp();
    bulk_ok = ((reinterpret_cast<uintptr_t>(p.k) | reinterpret_cast<uintptr_t>(p.v) |
                reinterpret_cast<uintptr_t>(p.k_params) | reinterpret_cast<uintptr_t>(p.v_params)) & 15) == 0;
  }
  // Lane constants of a whole tile's copy: K and V chunk `lane` of each 512-byte round (V's lands on its padded row),
  // the lane's parameter row (lanes 0-15 K's, 16-31 V's).
  // Each is pinned (pin_lane): kept in a register, not rebuilt from the thread index every step.
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  // (The bulk ring copies whole tiles without them.)
  constexpr bool kLaneCopies = kUseRing && !kBulkRing;
  const uint32_t ring_lane16 = kLaneCopies ? pin_lane(16 * lane) : 0;  // the lane's chunk in K's and V's rounds
  const uint32_t ring_k_dst = kLaneCopies ? pin_lane(ring_s + Ring::kKOff + 16 * lane) : 0;
  const uint32_t ring_v_dst =
      kLaneCopies ? pin_lane(ring_s + Ring::kVOff + (lane / (Ring::kVRow / 16)) * Ring::kVStride + 16 * (lane % (Ring::kVRow / 16)))
                  : 0;
  const uint32_t ring_p_dst = kLaneCopies ? pin_lane(ring_s + Ring::kPOff + 8 * lane) : 0;
  const uint64_t ring_p_src = reinterpret_cast<uint64_t>(
      (lane < 16 ? reinterpret_cast<const float2*>(p.k_params) : reinterpret_cast<const float2*>(p.v_params)) + (lane & 15));
  const uint64_t ring_p_lane = kLaneCopies ? (uint64_t{pin_lane(static_cast<uint32_t>(ring_p_src >> 32))} << 32) |
                                              pin_lane(static_cast<uint32_t>(ring_p_src))
                                        : 0;
  // The first rows of the whole tiles the ring copies come 32 steps at a time: lane L looks up the row of step
  // base + L (one page read and its index math per lane, once per 32 steps), and each step takes its row with one
  // shuffle (rows_cur: steps [base, base + 32); rows_nxt: the next 32, read a batch early so the shuffle never waits
  // on the page table). Steps whose tile is not whole get 0 and look their rows up in ring_copy.
  auto ring_rows = [&](int base) -> uint32_t {
    const int tile = tile_of(base + lane);
    if (!full_tile(tile)) return 0;
    const int tok = start + tile;
    const uint32_t in_page = p.block_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
    return (static_cast<uint32_t>(page_of(tile)) * p.hkv + kvh) * p.block_size + in_page;
  };
  // Copies tile `tile` of the split into stage `stage` (nothing for a tile past the split). A whole tile in one page
  // is 16 consecutive rows: 16-byte chunks of K and V, lane by lane; otherwise each chunk looks its row up and rows
  // past the split are zero-filled (zero codes, zero parameters: P' = 0 there, and the scores are masked anyway).
  auto ring_copy = [&](int tile, int stage, uint32_t row) {
    if constexpr (kUseRing) {
      if (tile >= n) return;
      uint8_t* const st = ring + stage * Ring::kStage;
      constexpr int kKChunks = Ring::kKRow, kVChunksPerRow = Ring::kVRow / 16, kVChunks = Ring::kVRow;
      const float2* kp = reinterpret_cast<const float2*>(p.k_params);
      const float2* vp = reinterpret_cast<const float2*>(p.v_params);
      const int pr = lane & 15;  // the parameter row of this lane (lanes 0-15 K's, 16-31 V's)
      if constexpr (kBulkRing) {
        if (bulk_ok && full_tile(tile)) {  // 16 consecutive rows: one copy per tensor, all four by lane 0
          const uint32_t bar = ring_bar + 8 * stage;
          mbar_arrive_expect_tx(bar, lane == 0 ? Ring::kStage : 0);  // every lane arrives; lane 0 owes the bytes
          if (lane == 0) {
            const uint32_t dst = ring_s + stage * Ring::kStage;
            bulk_copy(dst + Ring::kKOff, k_base + static_cast<uint64_t>(row) * Ring::kKRow, 16 * Ring::kKRow, bar);
            bulk_copy(dst + Ring::kVOff, p.v + static_cast<uint64_t>(row) * Ring::kVRow, 16 * Ring::kVRow, bar);
            bulk_copy(dst + Ring::kPOff, kp + row, 16 * 8, bar);
            bulk_copy(dst + Ring::kPOff + 16 * 8, vp + row, 16 * 8, bar);
          }
          return;
        }
      } else if (full_tile(tile)) {
        // The tile's first row in 32 bits (ring_rows; the ring's 4- and 2-bit caches hold fewer than 2^32 rows), then
        // one wide multiply-add per tensor from the lane's constant pointers; the rounds' offsets are immediates.
        const uint32_t st_off = stage * Ring::kStage;
        const uint8_t* const ks = k_base + (static_cast<uint64_t>(row) * Ring::kKRow + ring_lane16);
        const uint8_t* const vs = p.v + (static_cast<uint64_t>(row) * Ring::kVRow + ring_lane16);
#pragma unroll
        for (int c0 = 0; c0 < kKChunks; c0 += 32)
          if (kKChunks % 32 == 0 || c0 + lane < kKChunks)
            cp_async16_s_hint<kL2>(ring_k_dst + st_off + 16 * c0, ks + 16 * c0);
#pragma unroll
        for (int c0 = 0; c0 < kVChunks; c0 += 32)
          if (kVChunks % 32 == 0 || c0 + lane < kVChunks)
            cp_async16_s_hint<kL2>(ring_v_dst + st_off + (c0 / kVChunksPerRow) * Ring::kVStride, vs + 16 * c0);
        cp_async8_s(ring_p_dst + st_off, reinterpret_cast<const float2*>(ring_p_lane) + row);
        return;
      }
#pragma unroll
      for (int c0 = 0; c0 < kKChunks; c0 += 32) {
        const int c = c0 + lane, r = c / (Ring::kKRow / 16);
        if (kKChunks % 32 == 0 || c < kKChunks) {
          const bool ok = tile + r < n;
          const uint8_t* src = ok ? k_base + row_of(tile + r) * Ring::kKRow + 16 * (c % (Ring::kKRow / 16)) : p.k;
          cp_async16_zfill(st + Ring::kKOff + 16 * c, src, ok ? 16 : 0);
        }
      }
#pragma unroll
      for (int c0 = 0; c0 < kVChunks; c0 += 32) {
        const int c = c0 + lane, r = c / kVChunksPerRow;
        if (kVChunks % 32 == 0 || c < kVChunks) {
          const bool ok = tile + r < n;
          const uint8_t* src = ok ? p.v + row_of(tile + r) * Ring::kVRow + 16 * (c % kVChunksPerRow) : p.v;
          cp_async16_zfill(st + Ring::kVOff + r * Ring::kVStride + 16 * (c % kVChunksPerRow), src, ok ? 16 : 0);
        }
      }
      const bool ok = tile + pr < n;
      cp_async8_zfill(st + Ring::kPOff + 8 * lane, ok ? (lane < 16 ? kp : vp) + row_of(tile + pr) : kp, ok ? 8 : 0);
      if constexpr (kBulkRing) cp_async_mbar_arrive_noinc(ring_bar + 8 * stage);  // each lane once its copies land
    }
  };
  // The tokens of the lane's slots: g (K rows g, g + 8) and 2t, 2t + 1 (V rows, + 8 for the other two); the bulk ring
  // permutes them (bulk_slot_token), the others hold slot i's token in row i.
  const int g_tok = kBulkRing ? bulk_slot_token(g) : g;
  const int v_tok0 = kBulkRing ? bulk_slot_token(2 * t) : 2 * t, v_tok1 = kBulkRing ? bulk_slot_token(2 * t + 1) : 2 * t + 1;
  const int ring_k_at = kUseRing ? pin_lane(Ring::kKOff + g_tok * Ring::kKRow + kv_dims * kv_bits<KT>() / 8) : 0;
  const int ring_v_at = kUseRing ? pin_lane(Ring::kVOff + v_tok0 * Ring::kVStride + v_dims * kv_bits<VT>() / 8) : 0;
  // The bulk ring's second V row (token 7 - t: not a constant distance from the first).
  const int ring_v_at1 = kBulkRing ? pin_lane(Ring::kVOff + v_tok1 * Ring::kVStride + v_dims * kv_bits<VT>() / 8) : 0;
  const int ring_p_at = kUseRing ? pin_lane(Ring::kPOff + 8 * g_tok) : 0;  // the lane's K parameter row
  auto ring_read_k = [&](int stage, KRegs& r) {
    if constexpr (kUseRing) {
    const uint8_t* const st = ring + stage * Ring::kStage;
    const int k_at = ring_k_at;
    load_shared<kKBytes>(st + k_at, r.kg);
    load_shared<kKBytes>(st + k_at + 8 * Ring::kKRow, r.kg8);
    const float2* pp = reinterpret_cast<const float2*>(st + ring_p_at);
    r.ksp_g = pp[0];
    r.ksp_g8 = pp[8];
    r.vsp_g = pp[16];
    r.vsp_g8 = pp[24];
    }
  };
  auto ring_read_v = [&](int stage, VRegs& r) {
    if constexpr (kBulkRing) {
      const uint8_t* const st = ring + stage * Ring::kStage;
      load_shared<kVBytes>(st + ring_v_at, r.v[0]);
      load_shared<kVBytes>(st + ring_v_at1, r.v[1]);
      load_shared<kVBytes>(st + ring_v_at + 8 * Ring::kVStride, r.v[2]);
      load_shared<kVBytes>(st + ring_v_at1 + 8 * Ring::kVStride, r.v[3]);
    } else if constexpr (kUseRing) {
      const uint8_t* const st = ring + stage * Ring::kStage + ring_v_at;
#pragma unroll
      for (int u = 0; u < 4; ++u) load_shared<kVBytes>(st + v_row(u) * Ring::kVStride, r.v[u]);
    }
  };
  uint32_t rows_cur = 0, rows_nxt = 0;
  // Step i's stage (i >= 0): a mask for a power-of-two ring, else an unsigned remainder (a multiply-high and a
  // subtract).
  auto ring_stage = [](int i) -> int {
    return static_cast<int>(static_cast<unsigned>(i) % static_cast<unsigned>(kRing > 0 ? kRing : 1));
  };
  // The ring's ones operand of the Σ p' mma, pinned: left to itself the compiler rebuilds the four registers every step.
  // A shuffle of a constant (or of any warp-uniform value) folds to it, so each is kOnes plus a zero the compiler can
  // neither know nor prove uniform (hkv >= 1: its sign bit, times the lane).
  uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
  if constexpr (kUseRing) {
    const uint32_t runtime_zero = (static_cast<uint32_t>(p.hkv) >> 31) * static_cast<uint32_t>(lane);
#pragma unroll
    for (int r = 0; r < 4; ++r) ones[r] = pin_lane(kOnes + (r + 1) * runtime_zero);  // four distinct values
    static_assert(kRing - 1 <= 32, "the prologue's copies come from the first batch of rows");
    rows_cur = ring_rows(0);
    rows_nxt = ring_rows(32);
#pragma unroll
    for (int s = 0; s < kRing - 1; ++s) {
      ring_copy(tile_of(s), s, __shfl_sync(0xffffffffu, rows_cur, s));
      if constexpr (!kBulkRing) cp_async_commit();
    }
  }
  // A step's tiles past the split (only the second of two) load zeros and neutral parameters without reading memory.
  KRegs cur[kSub], nxt[kSub];
  VRegs vcur[kSub], vnxt[kSub];
  if (!kUseRing && tile_of(0) < n) {
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      load_k(tile_of(0) + u * kTile, cur[u], base_cur);
      if constexpr (kVAhead || kVMid) load_v(tile_of(0) + u * kTile, vcur[u], base_cur);
    }
    stage_params(tile_of(0), 0);
  }
  // One step of the loop: tile `tile` (step i). kMasked: the step may hold tokens past the split (their scores are
  // masked out of the max and their p are 0); a step of whole tiles skips those compares and selects.
  auto step = [&](const int i, const int tile, auto masked_c) {
    constexpr bool kMasked = decltype(masked_c)::value;
    const int next = tile_of(i + 1);
    int64_t base_next = 0;
    if constexpr (kUseRing) {
      // Copy the tile kRing - 1 steps ahead into the stage freed by the last step, then wait for this step's.
      const int ahead = i + kRing - 1;
      const int ahead_stage = ring_stage(ahead);
      if ((ahead & 31) == 0) {  // a new batch of rows (warp-uniform)
        rows_cur = rows_nxt;
        rows_nxt = ring_rows(ahead + 32);
      }
      ring_copy(tile_of(ahead), ahead_stage, __shfl_sync(0xffffffffu, rows_cur, ahead & 31));
      if constexpr (kBulkRing) {
        // Phase i / kRing of the stage's barrier: this tile's bytes (and the lanes' copies of a partial tile) landed.
        mbar_wait(ring_bar + 8 * ring_stage(i), (static_cast<unsigned>(i) / kRing) & 1);
      } else {
        cp_async_commit();
        cp_async_wait<kRing - 1>();
        __syncwarp();  // every lane's copies of this stage are visible to the warp
      }
      ring_read_k(ring_stage(i), cur[0]);
    } else {
      base_next = base_ahead(next, page_next);
      page_next = page_ahead(tile_of(i + 2));
    }
    if constexpr (!kVAhead && !kVMid && !kUseRing) {
#pragma unroll
      for (int u = 0; u < kSub; ++u) load_v(tile + u * kTile, vcur[u], base_cur);
    }
    if constexpr (kPrefetch) {
      if (next < n) {
#pragma unroll
        for (int u = 0; u < kSub; ++u) {
          load_k(next + u * kTile, nxt[u], base_next);
          if constexpr (kVAhead) load_v(next + u * kTile, vnxt[u], base_next);
        }
      }
    }
    if constexpr (kChannelK) {
      if (i % tiles_per_block == 0) {  // a new block: stage the next one's parameters, fold with this one's
        const int blk = i / tiles_per_block, next_block = tile_of(i + tiles_per_block);
        if (next_block < n) {
          stage_params(next_block, (blk + 1) & 1);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncwarp();  // the lanes' copies of this block's rows are visible to the whole warp
        fold_query(blk & 1);
      }
    }
    bool ok_g[kSub], ok_g8[kSub];
    float s[kSub][4];
    float t0 = kNoScore, t1 = kNoScore;  // this lane's largest scores of the step, heads 2t and 2t+1
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      ok_g[u] = !kMasked || tile + u * kTile + (kUseRing ? g_tok : g) < n;
      ok_g8[u] = !kMasked || tile + u * kTile + (kUseRing ? g_tok : g) + 8 < n;
      const uint32_t(&kg)[kKWords] = cur[u].kg;
      const uint32_t(&kg8)[kKWords] = cur[u].kg8;
      const float2 ksp_g = cur[u].ksp_g, ksp_g8 = cur[u].ksp_g8;
      float* const su = s[u];

      // ---- scores Sᵀ = K Qᵀ: c0/c1 token g heads 2t/2t+1, c2/c3 token g+8; with kChains 2 (experiments only: measured
      // slower, see score_chains()) k-step j goes into accumulator j % 2. Chain 0 starts from the magic offset.
      constexpr int kCh = kTight ? 1 : kChains;
      float sc[kCh][4];
#pragma unroll
      for (int c = 0; c < kCh; ++c) {
        sc[c][0] = sc[c][2] = c == 0 ? init0 : 0.f;
        sc[c][1] = sc[c][3] = c == 0 ? init1 : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        uint32_t a0, a2, a1, a3;
        k_frag<KT, kSteps>(kg, j, a0, a2);
        k_frag<KT, kSteps>(kg8, j, a1, a3);
        mma(sc[j % kCh], a0, a1, a2, a3, qf[j][0], qf[j][1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        su[e] = sc[0][e];
#pragma unroll
        for (int c = 1; c < kCh; ++c) su[e] += sc[c][e];
      }
      if constexpr (kChannelK) {  // (q ⊙ s)·c + q·z with (q ⊙ s)·c = mma / 16 - k_offset
        su[0] = (su[0] * (1.f / k_fold) - k_offset0 + zsum0) * scale_log2;
        su[1] = (su[1] * (1.f / k_fold) - k_offset1 + zsum1) * scale_log2;
        su[2] = (su[2] * (1.f / k_fold) - k_offset0 + zsum0) * scale_log2;
        su[3] = (su[3] * (1.f / k_fold) - k_offset1 + zsum1) * scale_log2;
      } else if constexpr (KT != KvType::f16) {  // s (q·c) + z Σq, in log2 units (init0 / init1 above)
        const float a_g = ksp_g.x * (scale_log2 * kScoreMul), a_g8 = ksp_g8.x * (scale_log2 * kScoreMul);
        su[0] = fmaf(su[0], a_g, ksp_g.y * qz0);
        su[1] = fmaf(su[1], a_g, ksp_g.y * qz1);
        su[2] = fmaf(su[2], a_g8, ksp_g8.y * qz0);
        su[3] = fmaf(su[3], a_g8, ksp_g8.y * qz1);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) su[e] *= scale_log2;
      }
      if (!kMasked && u == 0) {  // whole tiles: the first tile's max needs no kNoScore start
        t0 = fmaxf(su[0], su[2]);
        t1 = fmaxf(su[1], su[3]);
      } else {
        t0 = fmaxf(t0, fmaxf(ok_g[u] ? su[0] : kNoScore, ok_g8[u] ? su[2] : kNoScore));
        t1 = fmaxf(t1, fmaxf(ok_g[u] ? su[1] : kNoScore, ok_g8[u] ? su[3] : kNoScore));
      }
    }
    if constexpr (kVMid) {
      if (next < n) load_v(next, vnxt[0], base_next);
    }
    // ---- online softmax for heads 2t, 2t+1 (max over the step's tokens: lanes with the same t). Once the running
    // maxima settle, a step rarely raises them: one vote decides that, and then the max shuffles, the alphas (exactly
    // 1) and the accumulator rescale are skipped (the same numbers as computing them: n = m, alpha = exp(0) = 1).
    if (__any_sync(0xffffffffu, t0 > m0 || t1 > m1)) {
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {
        t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, o));
        t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, o));
      }
      const float n0 = fmaxf(m0, t0), n1 = fmaxf(m1, t1);
      const float alpha0 = exp2_ftz(m0 - n0), alpha1 = exp2_ftz(m1 - n1);
      m0 = n0;
      m1 = n1;
      l0 *= alpha0; z0 *= alpha0; wsum[0] *= alpha0;
      l1 *= alpha1; z1 *= alpha1; wsum[1] *= alpha1;
      // Skipping a multiply by exactly 1 changes nothing (a warp-uniform branch).
      if (__any_sync(0xffffffffu, alpha0 != 1.f || alpha1 != 1.f)) {
#pragma unroll
        for (int mt = 0; mt < kSteps; ++mt) {
          acc[mt][0] *= alpha0; acc[mt][1] *= alpha1; acc[mt][2] *= alpha0; acc[mt][3] *= alpha1;
        }
      }
    }
    // ---- P' = p * s_v, transposed in registers into the B layout (head g, tokens 2t, 2t+1 | 2t+8, 2t+9 of each tile)
    uint32_t pb[kSub][2];
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      const float2 vsp_g = cur[u].vsp_g, vsp_g8 = cur[u].vsp_g8;
      const float p0 = ok_g[u] ? exp2_ftz(s[u][0] - m0) : 0.f, p1 = ok_g[u] ? exp2_ftz(s[u][1] - m1) : 0.f;
      const float p2 = ok_g8[u] ? exp2_ftz(s[u][2] - m0) : 0.f, p3 = ok_g8[u] ? exp2_ftz(s[u][3] - m1) : 0.f;
      l0 = l0 + p0 + p2;
      l1 = l1 + p1 + p3;
      if constexpr (VT != KvType::f16) {
        z0 = fmaf(p0, vsp_g.y, fmaf(p2, vsp_g8.y, z0));
        z1 = fmaf(p1, vsp_g.y, fmaf(p3, vsp_g8.y, z1));
      }
      pb[u][0] = transpose8x8(h2u(__floats2half2_rn(p0 * vsp_g.x, p1 * vsp_g.x)));
      pb[u][1] = transpose8x8(h2u(__floats2half2_rn(p2 * vsp_g8.x, p3 * vsp_g8.x)));
      // Σ p' per head, exactly as the mma sees P' (for the V codes' magic offset): a ones operand sums the
      // tile's 16 tokens in the tensor core (wsum[0] / wsum[1]: this lane's heads 2t / 2t+1, already whole).
      if constexpr (VT != KvType::f16) mma(wsum, ones[0], ones[1], ones[2], ones[3], pb[u][0], pb[u][1]);
    }
    // ---- Oᵀ += Vᵀ P'ᵀ: m-tile mt holds dims (2mt, 2mt+1) of this lane's run
    if constexpr (kUseRing) ring_read_v(ring_stage(i), vcur[0]);
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
#pragma unroll
      for (int mt = 0; mt < kSteps; ++mt) {
        uint32_t a0, a1, a2, a3;
        v_frag<VT>(vcur[u].v[0], vcur[u].v[1], mt, a0, a1);
        v_frag<VT>(vcur[u].v[2], vcur[u].v[3], mt, a2, a3);
        mma(acc[mt], a0, a1, a2, a3, pb[u][0], pb[u][1]);
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
        cur[u] = nxt[u];
        if constexpr (kVAhead || kVMid) vcur[u] = vnxt[u];
      }
    } else if constexpr (kUseRing) {
      __syncwarp();  // every lane has read this stage before a later step's copy overwrites it
    } else if (next < n) {
      load_k(next, cur[0], base_next);
    }
    base_cur = base_next;
  };
  // The ring instances run whole tiles without masks; only a warp's last step can be partial (the split's last
  // tile), masked in the second loop. The other instances mask every step (their code as it was).
  int i = 0, tile = tile_of(0);
  if constexpr (kUseRing) {
    for (; tile + kTile <= n; tile = tile_of(++i)) step(i, tile, std::false_type{});
  }
  for (; tile < n; tile = tile_of(++i)) step(i, tile, std::true_type{});
  if constexpr (kUseRing) {  // warp_o takes back the rings once every warp is done with its own
    cp_async_wait<0>();
    __syncthreads();
  }
  if constexpr (kChannelK) {  // warp_o takes back the staging rows
    cp_async_wait<0>();
    __syncwarp();
  }
  // ---- per-warp totals (sum over the lanes sharing t), then merge the warps
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    z0 += __shfl_xor_sync(0xffffffffu, z0, o);
    z1 += __shfl_xor_sync(0xffffffffu, z1, o);
  }
  // Integer V: each dim's accumulator is v_fold * (Σ p' c) + 1024 Σ p' (v_fold 16 for u4's odd dims; u2: 4^f
  // for field f, m-tile mt holding fields 2 (mt % 2) and 2 (mt % 2) + 1).
  // Σ p' (wsum) came whole from the tensor core: no shuffles.
  const float v_off0 = 1024.f * wsum[0], v_off1 = 1024.f * wsum[1];
  if (g == 0) {
    warp_m[warp][2 * t] = m0; warp_m[warp][2 * t + 1] = m1;
    warp_l[warp][2 * t] = l0; warp_l[warp][2 * t + 1] = l1;
  }
#pragma unroll
  for (int mt = 0; mt < kSteps; ++mt) {
    const int d = v_dims + 2 * mt;
    if constexpr (VT != KvType::f16) {
      const float even = VT == KvType::u2 && (mt & 1) ? 1.f / 16.f : 1.f;
      const float odd = VT == KvType::u4 ? 1.f / 16.f : VT == KvType::u2 ? ((mt & 1) ? 1.f / 64.f : 1.f / 4.f) : 1.f;
      acc[mt][0] = (acc[mt][0] - v_off0) * even;
      acc[mt][1] = (acc[mt][1] - v_off1) * even;
      acc[mt][2] = (acc[mt][2] - v_off0) * odd;
      acc[mt][3] = (acc[mt][3] - v_off1) * odd;
    }
    warp_o[warp][2 * t][d] = acc[mt][0] + z0;
    warp_o[warp][2 * t + 1][d] = acc[mt][1] + z1;
    warp_o[warp][2 * t][d + 1] = acc[mt][2] + z0;
    warp_o[warp][2 * t + 1][d + 1] = acc[mt][3] + z1;
  }
  __syncthreads();
  const int num_splits = p.num_splits;
  for (int idx = threadIdx.x; idx < heads * D; idx += kThreads) {
    const int h = idx / D, d = idx % D;
    float mx = warp_m[0][h];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, warp_m[w][h]);
    float o = 0.f, l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float e = exp2_ftz(warp_m[w][h] - mx);
      o += e * warp_o[w][h][d];
      l += e * warp_l[w][h];
    }
    const int head = head0 + h;
    if (num_splits == 1) {
      p.out[b * p.out_stride_b + head * p.out_stride_h + d] = __float2half_rn(l > 0.f ? o / l : 0.f);
    } else {
      const int64_t slot = (static_cast<int64_t>(b) * p.hq + head) * num_splits + slot_split;
      p.part_out[slot * D + d] = o;
      if (d == 0) {
        p.part_stats[slot * 2] = mx * kLn2;  // the merge kernel's natural units
        p.part_stats[slot * 2 + 1] = l;
      }
    }
  }
}

// The block's shared memory is static up to 48 KB; a larger ring (more stages) takes it as dynamic shared memory
// (decode_dynamic_smem: the bytes to launch with and to allow, 0 for a static one).
// The ring is sized for its padded layout on every arch (the bulk ring's unpadded stages fit in it), plus the bulk
// ring's barriers.
template <KvType KT, KvType VT, int D, int kSub, int kRing, bool kBulk = false>
using DecodeSmemOf =
    std::conditional_t<(kBulk && kRing > 0), DecodeSmemBulk<D, kSub, RingLayout<KT, VT, D, kRing>::kBlockBytes, kWarps * kRing>,
                       DecodeSmem<D, kSub, RingLayout<KT, VT, D, kRing>::kBlockBytes>>;
constexpr int kStaticSmemMax = 48 * 1024;
template <KvType KT, KvType VT, int D, int kSub, int kRing, bool kBulk = false>
constexpr int decode_dynamic_smem() {
  constexpr int bytes = static_cast<int>(sizeof(DecodeSmemOf<KT, VT, D, kSub, kRing, kBulk>));
  return bytes > kStaticSmemMax ? bytes : 0;
}

// kMinBlocks: resident blocks per SM the register budget must allow (4: 128 registers per thread). Per-channel
// K (u4c, u2c) launches one more split per (sequence, head): its blocks run the f16-K body over the window keys.
template <KvType KT, KvType VT, int D, int kMinBlocks, bool kVAhead = false, int kSub = 1, int kChains = 1,
          bool kVMid = false, int kRing = 0, int kL2 = 0, bool kBulk = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks) decode_attention_kernel(DecodeAttnArgs p) {
  pdl_allow_dependents();  // the o GEMM (which waits for this grid to finish) may launch meanwhile
  using Smem = DecodeSmemOf<KT, VT, D, kSub, kRing, kBulk>;
  const int split = blockIdx.z;
  if constexpr (decode_dynamic_smem<KT, VT, D, kSub, kRing, kBulk>() > 0) {
    static_assert(kRing > 0 && !kv_per_channel<KT>(), "only a ring outgrows static shared memory");
    extern __shared__ __align__(16) uint8_t dyn_smem[];
    Smem& sm = *reinterpret_cast<Smem*>(dyn_smem);
    decode_block<KT, VT, D, kVAhead, kSub, kChains, kVMid, kRing, kL2, kBulk>(p, sm, split, split, false);
  } else {
    __shared__ Smem sm;
    if constexpr (kv_per_channel<KT>()) {
      if (split == gridDim.z - 1) return decode_block<KvType::f16, VT, D>(p, sm, 0, split, true);
    }
    decode_block<KT, VT, D, kVAhead, kSub, kChains, kVMid, kRing, kL2, kBulk>(p, sm, split, split, false);
  }
}

// Resident blocks per SM each instance is built for. 128: with 4 (128 registers) the f16 and u8 kernels spill;
// measured on an H100 at B=64 L=8K, 3 is as fast or faster for them. 256 holds twice the fragments per lane: a
// budget of 1 block per SM (up to 255 registers; 202-255 used on sm_90 without spills, 4 bytes spilled for f16 K
// and V on sm_80) keeps them in registers. 80 runs 4 blocks per SM like 64; 96 runs 3 like 128.
//
// Per-token u4 K at 128 is the exception: with u4, u8 or f16 V it fits 4 blocks (122-128 registers, no spills).
// Its register count decides how many blocks share an SM, so it is pinned here rather than left to the compiler:
// the kernel used 128 registers (4 blocks) until a change elsewhere in it took it to 130 (3 blocks), and u4 at
// B=64 L=8K slowed from 261 to 315 us on an H100 (255 us at 4 blocks again). Per-channel u4 K with u4 V runs 4
// blocks too, at the price of a 4-byte spill (16 on sm_80), measured worth it on an H100: kc4v4 at 64 x 4K 204 ->
// 167 us, 256 x 1.5K 304 -> 270 us (with u8 or f16 V it would spill 84-144 bytes).
// 2-bit K at 128 fits 4 blocks without spills too (u2 K with u2/u4 V: 116-120 registers), but it is not pinned:
// measured on an H200 (u2 K and V, 32/8 heads), 3 blocks were 2-3% faster than 4 at B=64 L=8K, 1 x 128K and
// 256 x 1.5K (213 vs 218, 62 vs 63, 175 vs 177 us), and 5 (spilling) 10-15% slower. The predicted gain of 4
// (more loads in flight, as for u4) did not come: at 2 bits the kernel is bound by its per-tile mma and ALU work,
// which is the same as at 4 bits, not by memory.
//
// Per-channel K with u2 V at 128 is pinned to 4 like kc4v4: u2c K 128 registers, no spills; u4c K a 4-byte spill.
// Measured on an H200 for kc2v2 (u2c K, u2 V), 4 blocks vs 3: 64 x 8K 299 vs 370 us, 1 x 128K 95 vs 147, 16 x 32K
// 390 vs 386, 256 x 1.5K 261 vs 304 (two calls, kv4 the control: 231 / 233 us). kc4v2 (u4c K, u2 V), predicted to
// gain the same way, did: 285 vs 358, 92 vs 137, 363 vs 374, 249 vs 296 us. u2c K with u4 / u8 V would spill 16 /
// 96 bytes at 4: kept at 3.
//
// v_ahead: u2 K and V load V one tile ahead with K (4 more registers at 128): measured 3% faster on the same
// three shapes at 3 blocks (206, 60, 170 us; head_dim 64 takes it unmeasured). Other formats keep V at the top of
// its own tile (u4: no change). Instances with a ring (ring_stages) copy V with K into it instead.
template <KvType KT, KvType VT>
constexpr bool v_ahead() { return KT == KvType::u2 && VT == KvType::u2; }
// sub_tiles: 16-token tiles per softmax step (decode_block's kSub). Every instance takes one. Two (both tiles' loads in
// flight together, one max update / rescale / P' transpose per 32 tokens; 159 registers for u2 K and V at head_dim
// 128, no spills) were predicted to help 2-bit K/V and measured slower on an H200 (tools/bench_decode_attention_
// variants.cu, u2 K and V, 3 blocks, V ahead): 64 x 8K 186 -> 204 us, 1 x 128K 55 -> 72, 16 x 32K 187 -> 197, 256 x
// 1.5K 154 -> 166; u4 K (3 blocks, against 1 tile at 4) and u4 K with u2 V lost 8-30% too. Kept for experiments.
template <int D, KvType KT, KvType VT>
constexpr int sub_tiles() { return 1; }
// score_chains: independent accumulators of the score mma (decode_block's kChains). Two were predicted to help (the
// tile's 8 dependent score mmas as two chains of 4) and measured slower on an H200 in the same call as one (kernel
// alone, tools/bench_decode_attention_variants.cu): u4/u4 64 x 8K 180.1 vs 177.5 us, 1 x 128K 54.0 vs 52.8; u2/u2
// 186.4 vs 148.3, 68.6 vs 45.4. Every instance takes one; the parameter stays for experiments.
template <int D, KvType KT, KvType VT>
constexpr int score_chains() { return 1; }
template <int D, KvType KT, KvType VT>
constexpr int min_blocks() {
  if constexpr (D == 128 && (KT == KvType::u4 || (KT == KvType::u4c && VT == KvType::u4))) return 4;
  if constexpr (D == 128 && VT == KvType::u2 && (KT == KvType::u2c || KT == KvType::u4c)) return 4;
  // The ring's u2 K with u4 V ran 4 blocks per SM unpinned (112 registers); the pinned lane constants (pin_lane) took
  // it to 133 (3 blocks): pinned to 4 (120, no spills). u2/u2 (121 unpinned) still fits 4 without the bound, which
  // would cost it 3 instructions per tile.
  if constexpr (D == 128 && KT == KvType::u2 && VT == KvType::u4) return 4;
  return D <= 80 ? 4 : D <= 128 ? 3 : 1;
}

}  // namespace decode_attn

template <int D, KvType KT, KvType VT>
void launch_decode_attention(const DecodeAttnArgs& p, dim3 grid, cudaStream_t stream) {
  // The ring's two feeds are two kernels; p.ring_bulk (the split plan's choice) picks one where ring_bulk() has both.
  auto launch = [&](auto bulk_c) {
    decode_attn::decode_attention_kernel<KT, VT, D, decode_attn::min_blocks<D, KT, VT>(), decode_attn::v_ahead<KT, VT>() && decode_attn::ring_stages<D, KT, VT>() == 0,
                                        decode_attn::sub_tiles<D, KT, VT>(), decode_attn::score_chains<D, KT, VT>(), false,
                                        decode_attn::ring_stages<D, KT, VT>(), 0, decltype(bulk_c)::value>
        <<<grid, decode_attn::kThreads, 0, stream>>>(p);
  };
  if constexpr (decode_attn::ring_bulk<D, KT, VT>()) {
    if (p.ring_bulk) return launch(std::true_type{});
  }
  launch(std::false_type{});
}

// Resident blocks per SM of that instance on the current device (what its registers and shared memory allow, which
// may be more than min_blocks): the split-KV plan sizes its grid to whole waves of these.
template <int D, KvType KT, KvType VT>
int decode_attention_blocks_per_sm() {
  int blocks = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks,
      decode_attn::decode_attention_kernel<KT, VT, D, decode_attn::min_blocks<D, KT, VT>(), decode_attn::v_ahead<KT, VT>() && decode_attn::ring_stages<D, KT, VT>() == 0,
                                           decode_attn::sub_tiles<D, KT, VT>(), decode_attn::score_chains<D, KT, VT>(), false,
                                           decode_attn::ring_stages<D, KT, VT>(), 0, false>,
      decode_attn::kThreads, 0);
  return err == cudaSuccess ? blocks : 0;
}

}  // namespace lowbit::cuda
