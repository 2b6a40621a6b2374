// Inner loops of the CPU attention: dot product, shifted exponentials with their sum, axpy.
// AVX2+FMA where the build targets it (x86-64-v3), plain loops otherwise.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace lowbit::cpu::simd {

// e^x for x <= 0 (softmax after subtracting the row max): x = n ln2 + r with |r| <= ln2/2, e^r by its
// degree-6 Taylor polynomial (relative error < 2e-7 there, about one f32 ulp), 2^n put in the
// exponent bits. x is clamped at -87 (e^-87 ~ 1.6e-38, the bottom of the normal range).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two: n * ln2 stays exact
  float p = 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return p * two_n;
}

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    i += 8;
  }
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// x[i] = e^(x[i] - m) for x[i] <= m; returns the sum.
inline float exp_shifted_sum(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), _mm256_set1_ps(-87.f));
    const __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)));
    v = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), v);
    v = _mm256_fmadd_ps(k, _mm256_set1_ps(2.12194440e-4f), v);
    __m256 p = _mm256_set1_ps(1.f / 720);
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f / 120));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f / 24));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f / 6));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    _mm256_storeu_ps(x + i, p);
    acc = _mm256_add_ps(acc, p);
  }
  float s = hsum(acc);
  for (; i < n; ++i) s += (x[i] = exp_nonpositive(x[i] - m));
  return s;
}
#else
inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float exp_shifted_sum(float* x, int64_t n, float m) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += (x[i] = exp_nonpositive(x[i] - m));
  return s;
}
#endif

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace lowbit::cpu::simd
