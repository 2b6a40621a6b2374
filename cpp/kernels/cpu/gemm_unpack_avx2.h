// AVX2 helpers that turn one (tile, k pair) block of the packed layout into 16 weights in lane order
// e = row * 2 + kk (see gemm_layout_cpu.h).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace lowbit::cpu {

// 8 bytes of u4 pairs -> 16 bytes (b0 & 15, b0 >> 4, b1 & 15, ...), i.e. the u4 values in order e.
inline __m128i unpack_u4_pairs(const uint8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm_unpacklo_epi8(_mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask));
}

// u4 -> s8 (as int16 lanes) by the group's integer affine map with 8-bit wrap: sext8(q * mul + add).
// QoQ: mul = s, add = -z*s. Liquid: mul = s, add = a - 128 (see gemm_layout_cpu.h).
inline __m256i u4_to_s8_lanes(const uint8_t* p, __m256i mul, __m256i add) {
  const __m256i q = _mm256_cvtepu8_epi16(unpack_u4_pairs(p));
  const __m256i v = _mm256_add_epi16(_mm256_mullo_epi16(q, mul), add);
  return _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
}

// 16 int16 lanes -> two 8-lane f32 vectors (lanes 0..7, 8..15).
inline void s16_to_f32(__m256i v, __m256& lo, __m256& hi) {
  lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)));
}

// Row sums of the two pair accumulators: lo = rows 0..3 x (k0, k1), hi = rows 4..7 -> [r0 .. r7].
inline __m256 reduce_pairs(__m256 lo, __m256 hi) {
  const __m256 h = _mm256_hadd_ps(lo, hi);  // r0 r1 r4 r5 r2 r3 r6 r7
  return _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

}  // namespace lowbit::cpu
