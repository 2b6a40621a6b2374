// The prefill (many tokens) f32 microkernel shared by the CPU GEMMs: a weight panel of 16 output
// channels already dequantized into buf[k][16] (two 8-row tiles side by side) times up to 6 token
// rows at a time, 12 accumulators, so each k costs 2 weight loads + 6 broadcasts for 12 FMAs.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace lowbit::cpu {

constexpr int kPanelCols = 16;
constexpr int kPanelRowBlock = 6;

template <int MB>
inline void panel_rows(const float* buf, int64_t k, const float* x, int64_t ldx, __m256 (*out)[2]) {
  __m256 acc[MB][2];
  for (int i = 0; i < MB; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < k; ++c) {
    const __m256 w0 = _mm256_loadu_ps(buf + c * kPanelCols), w1 = _mm256_loadu_ps(buf + c * kPanelCols + 8);
    for (int i = 0; i < MB; ++i) {
      const __m256 xb = _mm256_set1_ps(x[i * ldx + c]);
      acc[i][0] = _mm256_fmadd_ps(w0, xb, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(w1, xb, acc[i][1]);
    }
  }
  for (int i = 0; i < MB; ++i) out[i][0] = acc[i][0], out[i][1] = acc[i][1];
}

// Runs all m token rows over the panel; store(row, half, vector) receives each 8-channel result.
template <typename Store>
inline void panel_all_rows(const float* buf, int64_t k, const float* x, int64_t ldx, int64_t m, Store store) {
  __m256 out[kPanelRowBlock][2];
  for (int64_t i0 = 0; i0 < m; i0 += kPanelRowBlock) {
    const int mb = static_cast<int>(std::min<int64_t>(kPanelRowBlock, m - i0));
    const float* xr = x + i0 * ldx;
    switch (mb) {
      case 1: panel_rows<1>(buf, k, xr, ldx, out); break;
      case 2: panel_rows<2>(buf, k, xr, ldx, out); break;
      case 3: panel_rows<3>(buf, k, xr, ldx, out); break;
      case 4: panel_rows<4>(buf, k, xr, ldx, out); break;
      case 5: panel_rows<5>(buf, k, xr, ldx, out); break;
      default: panel_rows<6>(buf, k, xr, ldx, out); break;
    }
    for (int i = 0; i < mb; ++i) {
      store(i0 + i, 0, out[i][0]);
      store(i0 + i, 1, out[i][1]);
    }
  }
}

}  // namespace lowbit::cpu
