// Decode (m <= 4) for qoq/liquid weights with float activations. The s8 weight of a group is
// q*s + add (integers, quant/pack_cpu_layout.h), so per group and row
//   sum_k (q*s + add) * x = s * sum_k q*x + add * sum_k x,
// and the kernel only accumulates q*x: each k quad is one 16-byte load spread into 32 nibble bytes,
// then per k one byte shuffle puts rows 0..7 into int32 lanes for the conversion and FMA.
// The channel scale is applied at the end. Prefill goes through gemm_f32act_cpu's panel path.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "quant/pack_cpu_layout.h"

namespace lowbit::cpu {
namespace {

constexpr int kRowBlock = 4;

// vpshufb control for k j of a quad: in each 128-bit half, byte 4r + j -> the low byte of int32 lane r.
inline __m256i pick_k(int j) {
  const char z = static_cast<char>(0x80);
  const char a = static_cast<char>(j), b = static_cast<char>(4 + j), c = static_cast<char>(8 + j),
             d = static_cast<char>(12 + j);
  return _mm256_setr_epi8(a, z, z, z, b, z, z, z, c, z, z, z, d, z, z, z, a, z, z, z, b, z, z, z, c, z, z, z, d, z, z, z);
}

template <int MB>
void tile_decode(const uint8_t* td, const uint8_t* ta, int64_t quads, int64_t group_quads, int64_t groups,
                 const float* x, int64_t ldx, const float* sumx, __m256* out) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i pick[4] = {pick_k(0), pick_k(1), pick_k(2), pick_k(3)};
  __m256 acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256 part[2][MB];  // two accumulator sets: even and odd k, against the FMA latency
    for (int i = 0; i < MB; ++i) part[0][i] = part[1][i] = _mm256_setzero_ps();
    const int64_t q_end = std::min(quads, (g + 1) * group_quads);
    for (int64_t qd = g * group_quads; qd < q_end; ++qd) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(td + qd * kQuadBytes));
      const __m256i wq = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1), mask);
      for (int j = 0; j < 4; ++j) {
        const __m256 v = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(wq, pick[j]));
        for (int i = 0; i < MB; ++i)
          part[j & 1][i] = _mm256_fmadd_ps(v, _mm256_set1_ps(x[i * ldx + 4 * qd + j]), part[j & 1][i]);
      }
    }
    const __m256 mul = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ta + g * kU4AuxBytes + 64)));
    const __m256 add = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ta + g * kU4AuxBytes + 96)));
    for (int i = 0; i < MB; ++i)
      acc[i] = _mm256_fmadd_ps(_mm256_add_ps(part[0][i], part[1][i]), mul,
                               _mm256_fmadd_ps(add, _mm256_set1_ps(sumx[i * groups + g]), acc[i]));
  }
  for (int i = 0; i < MB; ++i) out[i] = acc[i];
}

}  // namespace

void gemm_u4s8_f32act_decode_cpu(const float* x, int64_t ldx, int64_t m, const PackedWeight& w, float* y, int64_t ldy) {
  const int64_t quads = num_k_quads(w.k), group_quads = w.group / 4, groups = (w.k + w.group - 1) / w.group;
  const int64_t tiles = num_row_tiles(w.n), ldx4 = 4 * quads;
  // x rows padded to whole quads (zeros), and per-group sums of x.
  std::vector<float> xp(m * ldx4, 0.f), sumx(m * groups, 0.f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < w.k; ++c) {
      xp[i * ldx4 + c] = x[i * ldx + c];
      sumx[i * groups + c / w.group] += x[i * ldx + c];
    }
  const uint8_t* data = w.data.data<uint8_t>();
  const uint8_t* aux = w.aux.data<uint8_t>();
  const float* cs = w.channel_scales.data<float>();
#pragma omp parallel for schedule(static) if (worth_parallel(m, w.n, w.k))
  for (int64_t t = 0; t < tiles; ++t) {
    const uint8_t* td = data + t * quads * kQuadBytes;
    const uint8_t* ta = aux + t * groups * kU4AuxBytes;
    __m256 out[kRowBlock];
    switch (m) {
      case 1: tile_decode<1>(td, ta, quads, group_quads, groups, xp.data(), ldx4, sumx.data(), out); break;
      case 2: tile_decode<2>(td, ta, quads, group_quads, groups, xp.data(), ldx4, sumx.data(), out); break;
      case 3: tile_decode<3>(td, ta, quads, group_quads, groups, xp.data(), ldx4, sumx.data(), out); break;
      default: tile_decode<4>(td, ta, quads, group_quads, groups, xp.data(), ldx4, sumx.data(), out); break;
    }
    const __m256 scale = _mm256_loadu_ps(cs + t * kTileRows);
    const int64_t n0 = t * kTileRows;
    for (int64_t i = 0; i < m; ++i) {
      alignas(32) float tmp[kTileRows];
      _mm256_store_ps(tmp, _mm256_mul_ps(out[i], scale));
      for (int64_t r = 0; r < kTileRows && n0 + r < w.n; ++r) y[i * ldy + n0 + r] = tmp[r];
    }
  }
}

}  // namespace lowbit::cpu
