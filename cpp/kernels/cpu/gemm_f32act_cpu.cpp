// Float-activation GEMM (w16a16, w8a16 per channel or grouped, fp8, and qoq/liquid dequantized to s8 * channel scale):
// weights are dequantized on the fly into f32 lanes and accumulated in f32 with FMA (w4 has its own
// kernel, gemm_w4_f32act_cpu.cpp).
// Decode (m <= 4) streams each weight once with 2*m (x unroll) accumulators per 8-row tile; prefill
// (m > 4) dequantizes a 16-channel panel once and runs the token rows over it (gemm_microkernel_avx2.h).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "quant/pack_cpu_layout.h"
#include "kernels/cpu/gemm_microkernel_avx2.h"
#include "kernels/cpu/gemm_unpack_avx2.h"

namespace lowbit::cpu {
namespace {

constexpr int kRowBlock = 4;

// ---- loaders: load(kp, lo, hi) gives the 16 weights of pair kp of the current tile --------------
struct F32Loader {
  const float* base;
  int64_t pairs;
  const float* p = nullptr;
  void tile(int64_t t) { p = base + t * pairs * kPairElems; }
  void group(int64_t) {}
  void load(int64_t kp, __m256& lo, __m256& hi) const {
    lo = _mm256_loadu_ps(p + kp * kPairElems);
    hi = _mm256_loadu_ps(p + kp * kPairElems + 8);
  }
};

struct F16Loader {
  const uint16_t* base;
  int64_t pairs;
  const uint16_t* p = nullptr;
  void tile(int64_t t) { p = base + t * pairs * kPairElems; }
  void group(int64_t) {}
  void load(int64_t kp, __m256& lo, __m256& hi) const {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems + 8)));
  }
};

struct BF16Loader {
  const uint16_t* base;
  int64_t pairs;
  const uint16_t* p = nullptr;
  void tile(int64_t t) { p = base + t * pairs * kPairElems; }
  void group(int64_t) {}
  static __m256 widen(__m128i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)); }
  void load(int64_t kp, __m256& lo, __m256& hi) const {
    lo = widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems)));
    hi = widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems + 8)));
  }
};

struct S8Loader {  // w8: s8 weights, per-channel scale applied after the reduction
  const int8_t* base;
  int64_t pairs;
  const int8_t* p = nullptr;
  void tile(int64_t t) { p = base + t * pairs * kPairElems; }
  void group(int64_t) {}
  void load(int64_t kp, __m256& lo, __m256& hi) const {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems));
    lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
  }
};

struct S8GroupLoader {  // grouped w8 (GGUF Q8_0): q * s per lane with the group's scale, exact in f32
  const int8_t* base;
  const float* aux;  // [tiles, groups, 16] lane scales
  int64_t pairs, groups;
  const int8_t* p = nullptr;
  const float* tile_aux = nullptr;
  __m256 slo{}, shi{};
  void tile(int64_t t) {
    p = base + t * pairs * kPairElems;
    tile_aux = aux + t * groups * kPairElems;
  }
  void group(int64_t g) {
    slo = _mm256_loadu_ps(tile_aux + g * kPairElems);
    shi = _mm256_loadu_ps(tile_aux + g * kPairElems + 8);
  }
  void load(int64_t kp, __m256& lo, __m256& hi) const {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems));
    lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), slo);
    hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), shi);
  }
};

struct E4M3Loader {  // fp8 e4m3 -> f16 by bit placement, then x 2^8 (exact, see below)
  const uint8_t* base;
  int64_t pairs;
  const uint8_t* p = nullptr;
  void tile(int64_t t) { p = base + t * pairs * kPairElems; }
  void group(int64_t) {}
  // e4m3 (bias 7) bits s.eeee.mmm placed as f16 (bias 15) s.0eeee.mmm0000000 read as 2^-8 times the
  // e4m3 value, normals and subnormals alike (both exponent fields count from the same zero).
  // The weights carry no NaN (the quantizer saturates to +-448).
  static __m256 times_256(__m128i f16) { return _mm256_mul_ps(_mm256_cvtph_ps(f16), _mm256_set1_ps(256.f)); }
  void load(int64_t kp, __m256& lo, __m256& hi) const {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    lo = times_256(_mm256_castsi256_si128(h));
    hi = times_256(_mm256_extracti128_si256(h, 1));
  }
};

struct U4ToS8Loader {  // qoq / liquid: the integer s8 weight as f32; channel scale applied after
  const uint8_t* base;
  const int16_t* params;
  int64_t pairs, groups;
  const uint8_t* p = nullptr;
  const int16_t* tp = nullptr;
  __m256i mul{}, add{};
  void tile(int64_t t) {
    p = base + t * num_k_quads(2 * pairs) * kQuadBytes;
    tp = params + t * groups * (kU4AuxBytes / 2);
  }
  void group(int64_t g) {
    mul = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp + g * (kU4AuxBytes / 2)));
    add = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp + g * (kU4AuxBytes / 2) + 16));
  }
  void load(int64_t kp, __m256& lo, __m256& hi) const { s16_to_f32(u4_to_s8_lanes(p, kp, mul, add), lo, hi); }
};

// ---- drivers ------------------------------------------------------------------------------------
struct Shape {
  int64_t m, pairs, group_pairs, groups, n;
};

// out[i] = the 8 row sums of tile rows for activation rows x + i*ldx, i < MB. The FMA latency, not
// its throughput, would bound a single accumulator chain per row, so consecutive k pairs rotate
// through U accumulator sets (U * MB * 2 <= 8 registers).
template <int MB, class L>
inline void tile_dot(L& ld, const Shape& s, const float* x, int64_t ldx, __m256* out) {
  constexpr int U = MB == 1 ? 4 : MB == 2 ? 2 : 1;
  __m256 lo[U][MB], hi[U][MB];
  for (int u = 0; u < U; ++u)
    for (int i = 0; i < MB; ++i) lo[u][i] = hi[u][i] = _mm256_setzero_ps();
  auto step = [&](int u, int64_t kp) {
    __m256 wl, wh;
    ld.load(kp, wl, wh);
    for (int i = 0; i < MB; ++i) {
      const __m256 xp = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x + i * ldx + 2 * kp)));
      lo[u][i] = _mm256_fmadd_ps(wl, xp, lo[u][i]);
      hi[u][i] = _mm256_fmadd_ps(wh, xp, hi[u][i]);
    }
  };
  for (int64_t g = 0; g < s.groups; ++g) {
    ld.group(g);
    const int64_t kp_end = std::min(s.pairs, (g + 1) * s.group_pairs);
    int64_t kp = g * s.group_pairs;
    for (; kp + U <= kp_end; kp += U)
      for (int u = 0; u < U; ++u) step(u, kp + u);
    for (; kp < kp_end; ++kp) step(0, kp);
  }
  for (int u = 1; u < U; ++u)
    for (int i = 0; i < MB; ++i) {
      lo[0][i] = _mm256_add_ps(lo[0][i], lo[u][i]);
      hi[0][i] = _mm256_add_ps(hi[0][i], hi[u][i]);
    }
  for (int i = 0; i < MB; ++i) out[i] = reduce_pairs(lo[0][i], hi[0][i]);
}

inline void store_rows(__m256 v, const float* chscale, int64_t t, int64_t n, float* y) {
  if (chscale) v = _mm256_mul_ps(v, _mm256_loadu_ps(chscale + t * kTileRows));
  const int64_t n0 = t * kTileRows;
  if (n0 + kTileRows <= n) {
    _mm256_storeu_ps(y + n0, v);
  } else {
    alignas(32) float tmp[kTileRows];
    _mm256_store_ps(tmp, v);
    for (int64_t r = 0; n0 + r < n; ++r) y[n0 + r] = tmp[r];
  }
}

template <class L>
void rows_block(L& ld, const Shape& s, const float* x, int64_t ldx, int mb, __m256* out) {
  switch (mb) {
    case 1: tile_dot<1>(ld, s, x, ldx, out); break;
    case 2: tile_dot<2>(ld, s, x, ldx, out); break;
    case 3: tile_dot<3>(ld, s, x, ldx, out); break;
    default: tile_dot<4>(ld, s, x, ldx, out); break;
  }
}

// Dequantizes tile t (k pairs in lane order e) into columns [col, col + 8) of the panel buf[k][16].
template <class L>
void dequantize_tile(L& ld, const Shape& s, int64_t t, float* buf, int col) {
  ld.tile(t);
  for (int64_t g = 0; g < s.groups; ++g) {
    ld.group(g);
    const int64_t kp_end = std::min(s.pairs, (g + 1) * s.group_pairs);
    for (int64_t kp = g * s.group_pairs; kp < kp_end; ++kp) {
      __m256 wl, wh;
      ld.load(kp, wl, wh);
      // [r0k0 r0k1 .. r3k1], [r4k0 .. r7k1] -> the k0 and k1 columns of rows 0..7
      const __m256 even = _mm256_shuffle_ps(wl, wh, _MM_SHUFFLE(2, 0, 2, 0));  // r0 r1 r4 r5 | r2 r3 r6 r7
      const __m256 odd = _mm256_shuffle_ps(wl, wh, _MM_SHUFFLE(3, 1, 3, 1));
      const __m256 k0 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0)));
      const __m256 k1 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), _MM_SHUFFLE(3, 1, 2, 0)));
      _mm256_storeu_ps(buf + (2 * kp) * kPanelCols + col, k0);
      _mm256_storeu_ps(buf + (2 * kp + 1) * kPanelCols + col, k1);
    }
  }
}

template <class L>
void run(L loader, const Shape& s, const float* x, int64_t ldx, const float* chscale, float* y, int64_t ldy) {
  const int64_t tiles = num_row_tiles(s.n);
  if (s.m <= kRowBlock) {  // decode: stream each weight once
#pragma omp parallel for schedule(static) if (worth_parallel(s.m, s.n, 2 * s.pairs))
    for (int64_t t = 0; t < tiles; ++t) {
      L ld = loader;
      ld.tile(t);
      __m256 out[kRowBlock];
      rows_block(ld, s, x, ldx, static_cast<int>(s.m), out);
      for (int64_t i = 0; i < s.m; ++i) store_rows(out[i], chscale, t, s.n, y + i * ldy);
    }
    return;
  }
  // prefill: dequantize a 16-channel panel once, then all token rows over it
  const int64_t panels = (tiles + 1) / 2, kpad = 2 * s.pairs;
#pragma omp parallel if (worth_parallel(s.m, s.n, 2 * s.pairs))
  {
    L ld = loader;
    std::vector<float> buf(kpad * kPanelCols, 0.f);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t t0 = 2 * p;
      dequantize_tile(ld, s, t0, buf.data(), 0);
      if (t0 + 1 < tiles) dequantize_tile(ld, s, t0 + 1, buf.data(), 8);
      panel_all_rows(buf.data(), kpad, x, ldx, s.m, [&](int64_t i, int half, __m256 v) {
        if (t0 + half < tiles) store_rows(v, chscale, t0 + half, s.n, y + i * ldy);
      });
    }
  }
}

}  // namespace

void gemm_f32act_cpu(const float* x, int64_t ldx, int64_t m, const PackedWeight& w, float* y, int64_t ldy) {
  const int64_t pairs = num_k_pairs(w.k);
  Shape s{m, pairs, pairs, 1, w.n};
  if (w.group > 0) {
    s.group_pairs = w.group / 2;
    s.groups = (pairs + s.group_pairs - 1) / s.group_pairs;
  }
  switch (w.format) {
    case WeightFormat::f32: run(F32Loader{w.data.data<float>(), pairs}, s, x, ldx, nullptr, y, ldy); break;
    case WeightFormat::f16: run(F16Loader{w.data.data<uint16_t>(), pairs}, s, x, ldx, nullptr, y, ldy); break;
    case WeightFormat::bf16: run(BF16Loader{w.data.data<uint16_t>(), pairs}, s, x, ldx, nullptr, y, ldy); break;
    case WeightFormat::w8:
      if (w.group > 0)
        run(S8GroupLoader{w.data.data<int8_t>(), w.aux.data<float>(), pairs, s.groups}, s, x, ldx, nullptr, y, ldy);
      else
        run(S8Loader{w.data.data<int8_t>(), pairs}, s, x, ldx, w.scales.data<float>(), y, ldy);
      break;
    case WeightFormat::e4m3:
      run(E4M3Loader{w.data.data<uint8_t>(), pairs}, s, x, ldx, w.scales.data<float>(), y, ldy);
      break;
    case WeightFormat::w4: gemm_w4_f32act_cpu(x, ldx, m, w, y, ldy); break;
    case WeightFormat::qoq:
    case WeightFormat::liquid:
      if (m <= kRowBlock) {
        gemm_u4s8_f32act_decode_cpu(x, ldx, m, w, y, ldy);
        break;
      }
      run(U4ToS8Loader{w.data.data<uint8_t>(), reinterpret_cast<const int16_t*>(w.aux.data_ptr()), pairs, s.groups},
          s, x, ldx, w.channel_scales.data<float>(), y, ldy);
      break;
  }
}

}  // namespace lowbit::cpu
