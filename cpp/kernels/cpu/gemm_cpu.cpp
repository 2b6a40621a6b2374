// CPU linear: activation conversion / quantization, the GEMM kernel, then the epilogue
// (activation and channel scales, bias, output dtype).
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "quant/pack_cpu_layout.h"

namespace lowbit::cpu {
namespace {

float load_float(const void* base, ScalarType t, int64_t i) {
  switch (t) {
    case ScalarType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case ScalarType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

void store_float(void* base, ScalarType t, int64_t i, float v) {
  switch (t) {
    case ScalarType::f16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(v); break;
    case ScalarType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

// x rows as f32 with an even, zero-padded length (the kernels read k in pairs).
std::vector<float> padded_f32_rows(const Tensor& x, int64_t ldx) {
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<float> out(m * ldx, 0.f);
  const int64_t es = bytes_for(x.dtype(), 1);
  for (int64_t i = 0; i < m; ++i) {
    const char* row = static_cast<const char*>(x.data_ptr()) + i * x.stride(0) * es;
    for (int64_t c = 0; c < k; ++c) out[i * ldx + c] = load_float(row, x.dtype(), c);
  }
  return out;
}

// Adds the bias to the f32 result rows and writes them to y in its dtype (when y is not them already).
void finish_output(float* yf, int64_t ldy, int64_t m, int64_t n, const Tensor& bias, Tensor& y, bool y_direct) {
  const int64_t es = bytes_for(y.dtype(), 1);
  for (int64_t i = 0; i < m; ++i) {
    float* row = yf + i * ldy;
    if (bias.defined()) {
      const int64_t bs = bias.stride(0);
      for (int64_t c = 0; c < n; ++c) row[c] += load_float(bias.data_ptr(), bias.dtype(), c * bs);
    }
    if (!y_direct) {
      char* out = static_cast<char*>(y.data_ptr()) + i * y.stride(0) * es;
      for (int64_t c = 0; c < n; ++c) store_float(out, y.dtype(), c * y.stride(1), row[c]);
    }
  }
}

}  // namespace

void quantize_rows_s8(const float* x, int64_t ldx, int64_t m, int64_t k, int16_t* xq, int64_t ldq, float* scales) {
  const __m256 sign = _mm256_set1_ps(-0.f), lim = _mm256_set1_ps(127.f), nlim = _mm256_set1_ps(-127.f);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * ldx;
    int16_t* q = xq + i * ldq;
    __m256 vmax = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(row + c)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float amax = 0.f;
    for (float v : lanes) amax = std::fmax(amax, v);
    for (; c < k; ++c) amax = std::fmax(amax, std::fabs(row[c]));
    const float s = amax > 0.f ? amax / 127.f : 1.f;
    scales[i] = s;
    // q = round_half_even(x / s): a true division (not x * (1/s)) so that every path rounds alike.
    const __m256 vs = _mm256_set1_ps(s);
    for (c = 0; c + 8 <= k; c += 8) {
      __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(row + c), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm256_min_ps(lim, _mm256_max_ps(nlim, v));
      const __m256i w = _mm256_cvtps_epi32(v);
      const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c), packed);
    }
    for (; c < k; ++c) q[c] = static_cast<int16_t>(std::fmin(127.f, std::fmax(-127.f, std::nearbyint(row[c] / s))));
    for (c = k; c < ldq; ++c) q[c] = 0;
  }
}

// In place: each row of x becomes the e4m3 values of x / s (as f32), s = max|x| / 448 (1 for a zero
// row), rounded to nearest even as the GPU quantizer does.
static void quantize_rows_e4m3(float* x, int64_t ldx, int64_t m, int64_t k, float* scales) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = x + i * ldx;
    float amax = 0.f;
    for (int64_t c = 0; c < k; ++c) amax = std::fmax(amax, std::fabs(row[c]));
    const float s = amax > 0.f ? amax / 448.f : 1.f;
    scales[i] = s;
    for (int64_t c = 0; c < k; ++c) row[c] = e4m3_bits_to_f32(f32_to_e4m3_bits(row[c] / s));
  }
}

void linear_cpu(const Tensor& x, const PackedWeight& w, const Tensor& bias, Tensor& y, ActivationMode act) {
  const int64_t m = x.size(0), k = w.k, n = w.n, ldx = 2 * num_k_pairs(k);
  const bool y_direct = y.dtype() == ScalarType::f32 && y.stride(1) == 1;
  std::vector<float> y_buf(y_direct ? 0 : m * n);
  float* yf = y_direct ? y.data<float>() : y_buf.data();
  const int64_t ldy = y_direct ? y.stride(0) : n;

  if (act == ActivationMode::float16) {
    if (x.dtype() == ScalarType::f32 && x.stride(1) == 1 && k % 2 == 0) {
      gemm_f32act_cpu(x.data<float>(), x.stride(0), m, w, yf, ldy);
    } else {
      const std::vector<float> xf = padded_f32_rows(x, ldx);
      gemm_f32act_cpu(xf.data(), ldx, m, w, yf, ldy);
    }
  } else if (act == ActivationMode::fp8_per_token) {
    // y = s_x[token] * (the e4m3 GEMM of x's e4m3 codes): products of two e4m3 values are exact, so
    // only f32 summation order separates this from the GPU.
    std::vector<float> xf = padded_f32_rows(x, ldx);
    std::vector<float> sx(m);
    quantize_rows_e4m3(xf.data(), ldx, m, k, sx.data());
    gemm_f32act_cpu(xf.data(), ldx, m, w, yf, ldy);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < n; ++c) yf[i * ldy + c] *= sx[i];
  } else {  // int8_per_token: y = float(acc) * s_x[token] * s_w[channel]
    const std::vector<float> xf = padded_f32_rows(x, ldx);
    std::vector<int16_t> xq(m * ldx);
    std::vector<float> sx(m);
    quantize_rows_s8(xf.data(), ldx, m, k, xq.data(), ldx, sx.data());
    std::vector<int32_t> acc(m * n);
    gemm_s8act_cpu(xq.data(), ldx, m, w, acc.data());
    const float* sw = w.format == WeightFormat::w8 ? w.scales.data<float>() : w.channel_scales.data<float>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < n; ++c) yf[i * ldy + c] = static_cast<float>(acc[i * n + c]) * sx[i] * sw[c];
  }

  finish_output(yf, ldy, m, n, bias, y, y_direct);
}

void linear_fmpq_cpu(const FmpqActivation& x, const PackedWeight& w, const Tensor& bias, Tensor& y) {
  const int64_t m = x.q.size(0), k = w.k, n = w.n, ldx = 2 * num_k_pairs(k);
  const int64_t blocks = (k + kFmpqBlockK - 1) / kFmpqBlockK;
  const bool y_direct = y.dtype() == ScalarType::f32 && y.stride(1) == 1;
  std::vector<float> y_buf(y_direct ? 0 : m * n);
  float* yf = y_direct ? y.data<float>() : y_buf.data();
  const int64_t ldy = y_direct ? y.stride(0) : n;

  const Tensor q = x.q.contiguous(), sx = x.scales.contiguous();
  std::vector<int16_t> xq(m * ldx, 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < k; ++c) xq[i * ldx + c] = q.data<int8_t>()[i * k + c];
  std::vector<int32_t> acc(m * blocks * n);
  gemm_s8act_blocked_cpu(xq.data(), ldx, m, w, kFmpqBlockK, acc.data());
  const float* sw = w.format == WeightFormat::w8 ? w.scales.data<float>() : w.channel_scales.data<float>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < n; ++c) {
      float sum = 0.f;
      for (int64_t b = 0; b < blocks; ++b)
        sum += static_cast<float>(acc[(i * blocks + b) * n + c]) * sx.data<float>()[i * blocks + b];
      yf[i * ldy + c] = sum * sw[c];
    }
  finish_output(yf, ldy, m, n, bias, y, y_direct);
}

}  // namespace lowbit::cpu
