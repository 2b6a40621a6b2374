// Inner loops of the CPU attention (see attention_simd.h).
#include "kernels/cpu/attention_simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOWBIT_ATTENTION_AVX2 1
#endif

namespace lowbit::cpu::simd {

float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float i = std::floor(x * 1.44269504f + 0.5f);
  const float r = (x - i * 0.693359375f) + i * 2.12194440e-4f;  // ln2 split in two: i * ln2 stays exact
  float p = 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(i) + 127) << 23;
  float two_i;
  std::memcpy(&two_i, &bits, 4);
  return p * two_i;
}

#ifdef LOWBIT_ATTENTION_AVX2

namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();  // two chains hide the FMA latency
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

// acc[0, 8 NV) += sum_j p[j] v[j][0, 8 NV) with the NV accumulators held in registers across j.
template <int NV>
void accumulate_chunk(const float* p, const float* v, int64_t n, int64_t d, float* acc) {
  __m256 a[NV];
  for (int k = 0; k < NV; ++k) a[k] = _mm256_loadu_ps(acc + 8 * k);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* vj = v + j * d;
    for (int k = 0; k < NV; ++k) a[k] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * k), a[k]);
  }
  for (int k = 0; k < NV; ++k) _mm256_storeu_ps(acc + 8 * k, a[k]);
}

}  // namespace

void dot_rows(const float* q, const float* k, int64_t n, int64_t d, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = dot(q, k + j * d, d);
}

float exp_shifted_sum(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {  // exp_nonpositive, eight at a time
    __m256 v = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), _mm256_set1_ps(-87.f));
    const __m256 i = _mm256_floor_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)));
    v = _mm256_fnmadd_ps(i, _mm256_set1_ps(0.693359375f), v);
    v = _mm256_fmadd_ps(i, _mm256_set1_ps(2.12194440e-4f), v);
    __m256 p = _mm256_set1_ps(1.f / 720);
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f / 120));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f / 24));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f / 6));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(i), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    _mm256_storeu_ps(x + j, p);
    acc = _mm256_add_ps(acc, p);
  }
  float s = hsum(acc);
  for (; j < n; ++j) s += (x[j] = exp_nonpositive(x[j] - m));
  return s;
}

void accumulate_rows(const float* p, const float* v, int64_t n, int64_t d, float* acc) {
  int64_t i = 0;
  for (; i + 64 <= d; i += 64) accumulate_chunk<8>(p, v + i, n, d, acc + i);
  if (i + 32 <= d) accumulate_chunk<4>(p, v + i, n, d, acc + i), i += 32;
  if (i + 16 <= d) accumulate_chunk<2>(p, v + i, n, d, acc + i), i += 16;
  if (i + 8 <= d) accumulate_chunk<1>(p, v + i, n, d, acc + i), i += 8;
  for (; i < d; ++i)
    for (int64_t j = 0; j < n; ++j) acc[i] += p[j] * v[j * d + i];
}

#else  // portable loops

void dot_rows(const float* q, const float* k, int64_t n, int64_t d, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    float s = 0.f;
    for (int64_t i = 0; i < d; ++i) s += q[i] * k[j * d + i];
    out[j] = s;
  }
}

float exp_shifted_sum(float* x, int64_t n, float m) {
  float s = 0.f;
  for (int64_t j = 0; j < n; ++j) s += (x[j] = exp_nonpositive(x[j] - m));
  return s;
}

void accumulate_rows(const float* p, const float* v, int64_t n, int64_t d, float* acc) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < d; ++i) acc[i] += p[j] * v[j * d + i];
}

#endif

}  // namespace lowbit::cpu::simd
