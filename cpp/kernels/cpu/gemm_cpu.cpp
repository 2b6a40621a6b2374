// CPU linear: activation conversion / quantization, the GEMM kernel, then the epilogue
// (activation and channel scales, bias, output dtype).
#include <cmath>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/gemm_layout_cpu.h"

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

}  // namespace

void quantize_rows_s8(const float* x, int64_t ldx, int64_t m, int64_t k, int16_t* xq, int64_t ldq, float* scales) {
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * ldx;
    float amax = 0.f;
    for (int64_t c = 0; c < k; ++c) amax = std::fmax(amax, std::fabs(row[c]));
    const float s = amax > 0.f ? amax / 127.f : 1.f;
    scales[i] = s;
    for (int64_t c = 0; c < k; ++c) {
      const float q = std::nearbyint(row[c] / s);  // round half to even
      xq[i * ldq + c] = static_cast<int16_t>(std::fmin(127.f, std::fmax(-127.f, q)));
    }
    for (int64_t c = k; c < ldq; ++c) xq[i * ldq + c] = 0;
  }
}

void linear_cpu(const Tensor& x, const PackedWeight& w, const Tensor& bias, Tensor& y, ops::LinearActivation act) {
  const int64_t m = x.size(0), k = w.k, n = w.n, ldx = 2 * num_k_pairs(k);
  const bool y_direct = y.dtype() == ScalarType::f32 && y.stride(1) == 1;
  std::vector<float> y_buf(y_direct ? 0 : m * n);
  float* yf = y_direct ? y.data<float>() : y_buf.data();
  const int64_t ldy = y_direct ? y.stride(0) : n;

  if (act == ops::LinearActivation::float16) {
    if (x.dtype() == ScalarType::f32 && x.stride(1) == 1 && k % 2 == 0) {
      gemm_f32act_cpu(x.data<float>(), x.stride(0), m, w, yf, ldy);
    } else {
      const std::vector<float> xf = padded_f32_rows(x, ldx);
      gemm_f32act_cpu(xf.data(), ldx, m, w, yf, ldy);
    }
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

}  // namespace lowbit::cpu
