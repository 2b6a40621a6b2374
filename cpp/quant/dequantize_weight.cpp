// Float reconstruction of a QuantizedWeight: exactly the values the kernels multiply with.
#include <cstdint>

#include "lowbit/quant/format.h"
#include "weight_checks.h"

namespace lowbit {
namespace {

inline int u4_at(const uint8_t* q, int64_t e) { return (q[e >> 1] >> ((e & 1) * 4)) & 0xF; }

// The s8 value a two-level weight element stands for, computed the way the kernels do.
inline int two_level_s8(bool liquid, int q, int s, int z) {
  if (liquid) {
    // LiquidGEMM Eq. 12: (q*s + a) XOR 0x80 in u8; the byte is the two's-complement s8 value.
    const uint8_t byte = static_cast<uint8_t>(static_cast<uint8_t>(q * s + z) ^ 0x80);
    return static_cast<int8_t>(byte);
  }
  return q * s - z * s;  // QServe §3.1: subtraction after multiplication
}

}  // namespace

Tensor dequantize_weight(const QuantizedWeight& w) {
  constexpr const char* kOp = "dequantize_weight";
  validate_quantized_weight(w, kOp);  // includes the s8 no-overflow invariant of qoq/liquid
  const int64_t n = w.n, k = w.k, groups = w.num_groups();
  Tensor out = Tensor::empty({n, k}, ScalarType::f32);
  float* o = out.data<float>();
  const Tensor q = w.q.contiguous();
  const Tensor s = w.scales.defined() ? w.scales.contiguous() : Tensor();
  const Tensor z = w.zeros.defined() ? w.zeros.contiguous() : Tensor();
  const Tensor cs = w.channel_scales.defined() ? w.channel_scales.contiguous() : Tensor();

  switch (w.format) {
    case WeightFormat::f32:
      out.copy_(q);
      break;
    case WeightFormat::f16:
    case WeightFormat::bf16: {
      const uint16_t* qp = q.data<uint16_t>();
      const bool half = w.format == WeightFormat::f16;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n * k; ++i) o[i] = half ? f16_bits_to_f32(qp[i]) : bf16_bits_to_f32(qp[i]);
      break;
    }
    case WeightFormat::w8: {
      const int8_t* qp = q.data<int8_t>();
      const float* sp = s.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c)  // grouped: one scale per row and group (GGUF Q8_0: q * d)
          o[r * k + c] = static_cast<float>(qp[r * k + c]) * (groups > 0 ? sp[r * groups + c / w.group] : sp[r]);
      break;
    }
    case WeightFormat::e4m3: {
      const uint8_t* qp = q.data<uint8_t>();
      const float* sp = s.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) o[r * k + c] = e4m3_bits_to_f32(qp[r * k + c]) * sp[r];
      break;
    }
    case WeightFormat::w4: {
      const uint8_t* qp = q.data<uint8_t>();
      const uint16_t* sp = s.data<uint16_t>();
      if (w.mins.defined()) {  // w = q*s + m, rounded as GGUF's reference does: the product, then the sum
        const Tensor mc = w.mins.contiguous();
        const uint16_t* mp = mc.data<uint16_t>();
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < k; ++c) {
            const int64_t pi = r * groups + c / w.group;
            volatile float product = static_cast<float>(u4_at(qp, r * k + c)) * f16_bits_to_f32(sp[pi]);  // no fma
            o[r * k + c] = product + f16_bits_to_f32(mp[pi]);
          }
        break;
      }
      const uint16_t* zp = w.symmetric ? nullptr : z.data<uint16_t>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const int64_t pi = r * groups + c / w.group;
          const float zero = zp ? f16_bits_to_f32(zp[pi]) : 8.f;
          // (q - z) is a small integer and s has 11 significant bits: the product is exact in f32.
          o[r * k + c] = (static_cast<float>(u4_at(qp, r * k + c)) - zero) * f16_bits_to_f32(sp[pi]);
        }
      break;
    }
    case WeightFormat::qoq:
    case WeightFormat::liquid: {
      const bool liquid = w.format == WeightFormat::liquid;
      const uint8_t* qp = q.data<uint8_t>();
      const uint8_t* sp = s.data<uint8_t>();
      const uint8_t* zp = z.data<uint8_t>();
      const float* cp = cs.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const int64_t pi = r * groups + c / w.group;
          o[r * k + c] = static_cast<float>(two_level_s8(liquid, u4_at(qp, r * k + c), sp[pi], zp[pi])) * cp[r];
        }
      break;
    }
  }
  return out;
}

}  // namespace lowbit
