// RoPE (RoFormer): pair (a, b) of features at position p turns by angle p * inv_freq[i]:
//   a' = a cos - b sin,  b' = b cos + a sin.
// neox pairs feature i with i + rotary_dim/2 (HF rotate_half); GPT-J pairs 2i with 2i+1.
#include "kernels/cpu/rope_cpu.h"

#include <cmath>

#include "kernels/cpu/kv_quant_cpu.h"

namespace lowbit::cpu {

std::vector<double> rope_inv_freq(const RopeConfig& cfg, int rotary_dim) {
  const int half = rotary_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv[i] = std::pow(static_cast<double>(cfg.theta), -2.0 * i / rotary_dim);
  if (cfg.llama3) {
    // Llama-3.1: long wavelengths are slowed down by `factor`, short ones kept, the band between
    // the two wavelength limits interpolated smoothly.
    const double pi = 3.14159265358979323846;
    const double old_len = cfg.original_max_position;
    const double low_wavelen = old_len / cfg.low_freq_factor;
    const double high_wavelen = old_len / cfg.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * pi / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f /= cfg.factor;
      } else {
        const double smooth = (old_len / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor);
        f = (1 - smooth) * f / cfg.factor + smooth * f;
      }
    }
  }
  for (double& f : inv) f /= cfg.linear_factor;
  return inv;
}

namespace {

void rotate_heads(Tensor& x, int64_t t, const float* cos_t, const float* sin_t, int rotary_dim, bool neox,
                  std::vector<float>& row) {
  const int64_t H = x.size(1), D = x.size(2);
  const int half = rotary_dim / 2;
  const int64_t elem = bytes_for(x.dtype(), 1);
  char* base = static_cast<char*>(x.data_ptr());
  for (int64_t h = 0; h < H; ++h) {
    void* p = base + (t * x.stride(0) + h * x.stride(1)) * elem;
    load_row_f32(p, x.dtype(), D, row.data());
    float* r = row.data();
    for (int i = 0; i < half; ++i) {
      const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
      const float a = r[ia], b = r[ib];
      r[ia] = a * cos_t[i] - b * sin_t[i];
      r[ib] = b * cos_t[i] + a * sin_t[i];
    }
    store_row_f32(r, x.dtype(), rotary_dim, p);  // features past rotary_dim are left untouched
  }
}

}  // namespace

void rope_cpu(Tensor& q, Tensor& k, const Tensor& positions, const RopeConfig& cfg) {
  const Tensor& any = q.defined() ? q : k;
  const int64_t T = any.size(0);
  const int64_t D = any.size(2);
  const int rotary_dim = cfg.rotary_dim > 0 ? cfg.rotary_dim : static_cast<int>(D);
  const int half = rotary_dim / 2;
  const std::vector<double> inv = rope_inv_freq(cfg, rotary_dim);
  const int32_t* pos = positions.data<int32_t>();
  // A decode step rotates a handful of rows: not worth waking the thread team.
#pragma omp parallel if (T * D >= (1 << 12))
  {
    std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half)), row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      // Angles in double: p * inv_freq reaches 1e5+ rad at long positions, where f32 loses ~1e-2.
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(pos[t]) * inv[i];
        cos_t[i] = static_cast<float>(std::cos(angle));
        sin_t[i] = static_cast<float>(std::sin(angle));
      }
      if (q.defined()) rotate_heads(q, t, cos_t.data(), sin_t.data(), rotary_dim, cfg.neox, row);
      if (k.defined()) rotate_heads(k, t, cos_t.data(), sin_t.data(), rotary_dim, cfg.neox, row);
    }
  }
}

}  // namespace lowbit::cpu
