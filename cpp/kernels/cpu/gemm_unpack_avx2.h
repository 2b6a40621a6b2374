// AVX2 helpers that turn one (tile, k pair) block of the packed layout into 16 weights in lane order
// e = row * 2 + kk (see quant/pack_cpu_layout.h).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace lowbit::cpu {

// One (tile, k quad) block of qoq/liquid u4 (16 bytes, quant/pack_cpu_layout.h) -> the 16 u4 values of
// k pair h (0 or 1) of the quad, as bytes in pair order e = row * 2 + kk.
inline __m128i unpack_u4_pair_from_quad(const uint8_t* quad, int h) {
  // pshufb controls per h: rows 0..3 come from the low nibbles, rows 4..7 from the high ones;
  // 0x80 zeroes a byte. Row r of pair h sits at byte 4 * (r % 4) + 2h (+1 for the second k).
  alignas(16) static constexpr uint8_t kPick[2][2][16] = {
      {{0, 1, 4, 5, 8, 9, 12, 13, 128, 128, 128, 128, 128, 128, 128, 128},
       {128, 128, 128, 128, 128, 128, 128, 128, 0, 1, 4, 5, 8, 9, 12, 13}},
      {{2, 3, 6, 7, 10, 11, 14, 15, 128, 128, 128, 128, 128, 128, 128, 128},
       {128, 128, 128, 128, 128, 128, 128, 128, 2, 3, 6, 7, 10, 11, 14, 15}}};
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quad));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  return _mm_or_si128(_mm_shuffle_epi8(lo, _mm_load_si128(reinterpret_cast<const __m128i*>(kPick[h][0]))),
                      _mm_shuffle_epi8(hi, _mm_load_si128(reinterpret_cast<const __m128i*>(kPick[h][1]))));
}

// k pair kp of a qoq/liquid tile (data of the tile) -> s8 weights as int16 lanes in pair order:
// sext8(q * mul + add). QoQ: mul = s, add = -z*s. Liquid: mul = s, add = a - 128 (quant/pack_cpu_layout.h).
inline __m256i u4_to_s8_lanes(const uint8_t* tile_data, int64_t kp, __m256i mul, __m256i add) {
  const __m256i q = _mm256_cvtepu8_epi16(unpack_u4_pair_from_quad(tile_data + (kp / 2) * 16, static_cast<int>(kp % 2)));
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
