// w4a16 on the CPU: group-wise u4 weights (AWQ/GPTQ semantics w = (q - z) * s) times float
// activations, f32 accumulation. The decode hot path of the CPU engine.
//
// Unpacking is two instructions per k and tile: a broadcast 32-bit load of the tile's 8 nibbles,
// AND with the lane masks 0xF << 4r, and an int -> f32 conversion that yields q * 16^r (layout in
// quant/pack_cpu_layout.h). Decode (m <= 4) accumulates v * x per group and folds the group's scale and
// zero in at its end: sum_k (q - z) s x = s * sum_k q x - z s * sum_k x, with sum_k x computed once per
// call. Prefill (m > 4) dequantizes each 16-channel panel once into a per-thread f32 buffer
// (w = v * mul + add, exactly (q - z) * s rounded once) and runs the token rows over it.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "quant/pack_cpu_layout.h"
#include "kernels/cpu/gemm_microkernel_avx2.h"

namespace lowbit::cpu {
namespace {

constexpr int kRowBlock = 4;
constexpr int kWordBytes = kTileRows / 2;  // 8 nibbles per (tile, k)
constexpr int kAuxLanes = 2 * kTileRows;   // multipliers, addends

struct W4Shape {
  int64_t m, k, n, group, groups;
};

inline __m256i lane_masks() {
  return _mm256_setr_epi32(0xF, 0xF0, 0xF00, 0xF000, 0xF0000, 0xF00000, 0xF000000, static_cast<int>(0xF0000000u));
}

// v_r = q_r * 16^r (row 7: (q - 8) * 2^28), exact in f32.
inline __m256 unpack_word(const uint8_t* p, __m256i masks) {
  int32_t word;
  __builtin_memcpy(&word, p, 4);
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_set1_epi32(word), masks));
}

inline void store_rows(__m256 v, int64_t t, int64_t n, float* y) {
  const int64_t n0 = t * kTileRows;
  if (n0 + kTileRows <= n) {
    _mm256_storeu_ps(y + n0, v);
  } else {
    alignas(32) float tmp[kTileRows];
    _mm256_store_ps(tmp, v);
    for (int64_t r = 0; n0 + r < n; ++r) y[n0 + r] = tmp[r];
  }
}

// Decode: MB token rows against one tile. sumx[i * groups + g] = sum of x row i over group g.
// Consecutive k rotate through U accumulator sets so the FMA latency does not serialize the loop.
template <int MB>
void tile_decode(const uint8_t* data, const float* aux, const W4Shape& s, const float* x, int64_t ldx,
                 const float* sumx, __m256* out) {
  constexpr int U = MB == 1 ? 4 : MB == 2 ? 2 : 1;
  const __m256i masks = lane_masks();
  __m256 acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < s.groups; ++g) {
    __m256 part[U][MB];
    for (int u = 0; u < U; ++u)
      for (int i = 0; i < MB; ++i) part[u][i] = _mm256_setzero_ps();
    const int64_t k_end = std::min(s.k, (g + 1) * s.group);
    int64_t k = g * s.group;
    for (; k + U <= k_end; k += U)
      for (int u = 0; u < U; ++u) {
        const __m256 v = unpack_word(data + (k + u) * kWordBytes, masks);
        for (int i = 0; i < MB; ++i) part[u][i] = _mm256_fmadd_ps(v, _mm256_set1_ps(x[i * ldx + k + u]), part[u][i]);
      }
    for (; k < k_end; ++k) {
      const __m256 v = unpack_word(data + k * kWordBytes, masks);
      for (int i = 0; i < MB; ++i) part[0][i] = _mm256_fmadd_ps(v, _mm256_set1_ps(x[i * ldx + k]), part[0][i]);
    }
    const __m256 mul = _mm256_loadu_ps(aux + g * kAuxLanes), add = _mm256_loadu_ps(aux + g * kAuxLanes + kTileRows);
    for (int i = 0; i < MB; ++i) {
      for (int u = 1; u < U; ++u) part[0][i] = _mm256_add_ps(part[0][i], part[u][i]);
      acc[i] = _mm256_fmadd_ps(part[0][i], mul, _mm256_fmadd_ps(add, _mm256_set1_ps(sumx[i * s.groups + g]), acc[i]));
    }
  }
  for (int i = 0; i < MB; ++i) out[i] = acc[i];
}

void rows_decode(const uint8_t* data, const float* aux, const W4Shape& s, const float* x, int64_t ldx,
                 const float* sumx, int mb, __m256* out) {
  switch (mb) {
    case 1: tile_decode<1>(data, aux, s, x, ldx, sumx, out); break;
    case 2: tile_decode<2>(data, aux, s, x, ldx, sumx, out); break;
    case 3: tile_decode<3>(data, aux, s, x, ldx, sumx, out); break;
    default: tile_decode<4>(data, aux, s, x, ldx, sumx, out); break;
  }
}

}  // namespace

void gemm_w4_f32act_cpu(const float* x, int64_t ldx, int64_t m, const PackedWeight& w, float* y, int64_t ldy) {
  const W4Shape s{m, w.k, w.n, w.group, (w.k + w.group - 1) / w.group};
  const int64_t tiles = num_row_tiles(s.n);
  const uint8_t* data = w.data.data<uint8_t>();
  const float* aux = w.aux.data<float>();
  const int64_t tile_bytes = s.k * kWordBytes, tile_aux = s.groups * kAuxLanes;

  if (m <= kRowBlock) {  // decode
    std::vector<float> sumx(m * s.groups, 0.f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < s.k; ++c) sumx[i * s.groups + c / s.group] += x[i * ldx + c];
#pragma omp parallel for schedule(static) if (worth_parallel(m, s.n, s.k))
    for (int64_t t = 0; t < tiles; ++t) {
      __m256 out[kRowBlock];
      rows_decode(data + t * tile_bytes, aux + t * tile_aux, s, x, ldx, sumx.data(), static_cast<int>(m), out);
      for (int64_t i = 0; i < m; ++i) store_rows(out[i], t, s.n, y + i * ldy);
    }
    return;
  }
  // prefill: dequantize a 16-channel panel once (w = v * mul + add), then all token rows over it
  const int64_t panels = (tiles + 1) / 2;
#pragma omp parallel if (worth_parallel(m, s.n, s.k))
  {
    std::vector<float> buf(s.k * kPanelCols, 0.f);
    const __m256i masks = lane_masks();
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t t0 = 2 * p;
      for (int half = 0; half < 2 && t0 + half < tiles; ++half) {
        const uint8_t* td = data + (t0 + half) * tile_bytes;
        const float* ta = aux + (t0 + half) * tile_aux;
        for (int64_t c = 0; c < s.k; ++c) {
          const float* a = ta + (c / s.group) * kAuxLanes;
          const __m256 v = unpack_word(td + c * kWordBytes, masks);
          _mm256_storeu_ps(buf.data() + c * kPanelCols + 8 * half,
                           _mm256_fmadd_ps(v, _mm256_loadu_ps(a), _mm256_loadu_ps(a + kTileRows)));
        }
      }
      panel_all_rows(buf.data(), s.k, x, ldx, m, [&](int64_t i, int half, __m256 v) {
        if (t0 + half < tiles) store_rows(v, t0 + half, s.n, y + i * ldy);
      });
    }
  }
}

}  // namespace lowbit::cpu
