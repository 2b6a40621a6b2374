// Argument checks for quantized weights: every message names the op, the field, expected vs actual.
#include "weight_checks.h"

#include <cmath>
#include <cstdint>

namespace lowbit::quant_detail {
namespace {

void check_host_tensor(const Tensor& t, ScalarType dtype, const Shape& shape, const char* op, const char* arg) {
  check_dtype(t, dtype, op, arg);
  LOWBIT_CHECK_TYPE(t.device().is_cpu(), op, ": argument '", arg, "' must be on the CPU, got ", t.device().str());
  check_shape(t, shape, op, arg);
}

void check_f32_positive(const Tensor& t, const char* op, const char* arg) {
  const Tensor c = t.contiguous();
  const float* p = c.data<float>();
  for (int64_t i = 0; i < c.numel(); ++i)
    LOWBIT_CHECK(std::isfinite(p[i]) && p[i] > 0.f, op, ": argument '", arg,
                 "' must hold finite positive scales, got ", p[i], " at index ", i);
}

void check_w4_params(const WeightQuantParams& p, int64_t n, int64_t groups, bool symmetric, bool require,
                     const char* op) {
  if (p.scales.defined() || require) {
    check_defined(p.scales, op, "scales");
    check_host_tensor(p.scales, ScalarType::f16, {n, groups}, op, "scales");
    const Tensor s = p.scales.contiguous();
    for (int64_t i = 0; i < s.numel(); ++i) {
      const float v = f16_bits_to_f32(s.data<uint16_t>()[i]);
      LOWBIT_CHECK(std::isfinite(v) && v > 0.f, op, ": argument 'scales' of w4 must hold finite positive f16 scales, got ",
                   v, " at row ", i / groups, " group ", i % groups);
    }
  }
  if (symmetric) {
    LOWBIT_CHECK(!p.zeros.defined(), op, ": symmetric w4 has no 'zeros' (the zero is fixed at 8), but zeros ",
                 p.zeros.defined() ? p.zeros.str() : "", " were given");
    return;
  }
  if (p.zeros.defined() || require) {
    check_defined(p.zeros, op, "zeros");
    check_host_tensor(p.zeros, ScalarType::f16, {n, groups}, op, "zeros");
    const Tensor z = p.zeros.contiguous();
    for (int64_t i = 0; i < z.numel(); ++i) {
      const float v = f16_bits_to_f32(z.data<uint16_t>()[i]);
      LOWBIT_CHECK(v >= 0.f && v <= 15.f && v == std::floor(v), op,
                   ": argument 'zeros' of w4 must hold integers in [0, 15], got ", v, " at row ", i / groups,
                   " group ", i % groups);
    }
  }
}

void check_two_level_params(WeightFormat f, const WeightQuantParams& p, int64_t n, int64_t groups, bool require,
                            const char* op) {
  const bool liquid = f == WeightFormat::liquid;
  if (p.channel_scales.defined() || require) {
    check_defined(p.channel_scales, op, "channel_scales");
    check_host_tensor(p.channel_scales, ScalarType::f32, {n}, op, "channel_scales");
    check_f32_positive(p.channel_scales, op, "channel_scales");
  }
  if (p.scales.defined() || require) {
    check_defined(p.scales, op, "scales");
    check_host_tensor(p.scales, ScalarType::u8, {n, groups}, op, "scales");
    const Tensor s = p.scales.contiguous();
    const int max_step = liquid ? 16 : 255;  // LiquidGEMM §4: s <= round(238 / 15) = 16
    for (int64_t i = 0; i < s.numel(); ++i) {
      const int v = s.data<uint8_t>()[i];
      LOWBIT_CHECK(v >= 1 && v <= max_step, op, ": argument 'scales' of ", name_of(f), " must hold integer steps in [1, ",
                   max_step, "], got ", v, " at row ", i / groups, " group ", i % groups);
    }
  }
  if (p.zeros.defined() || require) {
    check_defined(p.zeros, op, "zeros");
    check_host_tensor(p.zeros, ScalarType::u8, {n, groups}, op, "zeros");
    if (!liquid) {
      const Tensor z = p.zeros.contiguous();
      for (int64_t i = 0; i < z.numel(); ++i) {
        const int v = z.data<uint8_t>()[i];
        LOWBIT_CHECK(v <= 15, op, ": argument 'zeros' of qoq holds u4 zero points and must be <= 15, got ", v,
                     " at row ", i / groups, " group ", i % groups);
      }
    }
  }
}

void reject_given(const Tensor& t, WeightFormat f, const char* op, const char* arg) {
  LOWBIT_CHECK(!t.defined(), op, ": format ", name_of(f), " has no '", arg, "', but ", t.defined() ? t.str() : "",
               " was given");
}

}  // namespace

void check_group_size(WeightFormat f, int group, const char* op) {
  if (f == WeightFormat::w8) {  // optional: 0 is per channel
    LOWBIT_CHECK(group == 0 || group == 32 || group == 64 || group == 128, op,
                 ": argument 'group' of w8 must be 0 (per channel), 32, 64 or 128, got ", group);
    return;
  }
  if (!is_group_wise(f)) return;
  LOWBIT_CHECK(group == 32 || group == 64 || group == 128, op, ": argument 'group' of ", name_of(f),
               " must be 32, 64 or 128, got ", group);
}

void check_weight_params(WeightFormat f, int64_t n, int64_t groups, bool symmetric, const WeightQuantParams& p,
                         bool require, const char* op) {
  switch (f) {
    case WeightFormat::f32:
    case WeightFormat::f16:
    case WeightFormat::bf16:
      reject_given(p.scales, f, op, "scales");
      reject_given(p.zeros, f, op, "zeros");
      reject_given(p.channel_scales, f, op, "channel_scales");
      return;
    case WeightFormat::w8:
    case WeightFormat::e4m3:
      reject_given(p.zeros, f, op, "zeros");
      reject_given(p.channel_scales, f, op, "channel_scales");
      if (p.scales.defined() || require) {
        check_defined(p.scales, op, "scales");
        // grouped w8 (groups > 0) has one scale per row and group
        check_host_tensor(p.scales, ScalarType::f32, groups > 0 ? Shape{n, groups} : Shape{n}, op, "scales");
        check_f32_positive(p.scales, op, "scales");
      }
      return;
    case WeightFormat::w4:
      reject_given(p.channel_scales, f, op, "channel_scales");
      check_w4_params(p, n, groups, symmetric, require, op);
      return;
    case WeightFormat::qoq:
    case WeightFormat::liquid:
      check_two_level_params(f, p, n, groups, require, op);
      return;
  }
}

void check_s8_reconstruction(const QuantizedWeight& w, const char* op) {
  if (w.format != WeightFormat::qoq && w.format != WeightFormat::liquid) return;
  const bool liquid = w.format == WeightFormat::liquid;
  const Tensor q = w.q.contiguous(), s = w.scales.contiguous(), z = w.zeros.contiguous();
  const uint8_t* qp = q.data<uint8_t>();
  const uint8_t* sp = s.data<uint8_t>();
  const uint8_t* zp = z.data<uint8_t>();
  const int64_t n = w.n, k = w.k, groups = w.num_groups();
  int64_t bad = INT64_MAX;  // smallest flat index that breaks the invariant
#pragma omp parallel for schedule(static) reduction(min : bad)
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t e = r * k + c;
      const int qv = (qp[e >> 1] >> ((e & 1) * 4)) & 0xF;
      const int sv = sp[r * groups + c / w.group], zv = zp[r * groups + c / w.group];
      const int prod = qv * sv;
      const bool ok = liquid ? prod + zv <= 255
                             : prod <= 255 && zv * sv <= 255 && prod - zv * sv >= -128 && prod - zv * sv <= 127;
      if (!ok) {
        if (e < bad) bad = e;
        break;
      }
    }
  }
  if (bad == INT64_MAX) return;
  const int64_t r = bad / k, c = bad % k;
  const int qv = (qp[bad >> 1] >> ((bad & 1) * 4)) & 0xF;
  const int sv = sp[r * groups + c / w.group], zv = zp[r * groups + c / w.group];
  if (liquid)
    LOWBIT_CHECK(false, op, ": liquid weight overflows u8 at row ", r, " column ", c, ": q*s + a = ", qv, "*", sv,
                 " + ", zv, " = ", qv * sv + zv, " > 255, so (q*s + a) XOR 0x80 is not the s8 value");
  LOWBIT_CHECK(false, op, ": qoq weight overflows s8 at row ", r, " column ", c, ": q*s - z*s = ", qv, "*", sv, " - ",
               zv, "*", sv, " = ", qv * sv - zv * sv, " (needs q*s <= 255, z*s <= 255 and a result in [-128, 127])");
}

}  // namespace lowbit::quant_detail

namespace lowbit {

void validate_quantized_weight(const QuantizedWeight& w, const char* op) {
  using namespace quant_detail;
  LOWBIT_CHECK(w.n > 0 && w.k > 0, op, ": weight must have n > 0 and k > 0, got n=", w.n, " k=", w.k);
  check_group_size(w.format, w.group, op);
  LOWBIT_CHECK(w.format == WeightFormat::w4 || !w.symmetric, op, ": 'symmetric' applies to w4 only, got it set for ",
               name_of(w.format));
  check_defined(w.q, op, "q");
  LOWBIT_CHECK_TYPE(w.q.device().is_cpu(), op, ": argument 'q' must be on the CPU, got ", w.q.device().str());
  check_dtype(w.q, element_type_of(w.format), op, "q");
  check_shape(w.q, {w.n, w.k}, op, "q");
  const int64_t groups = is_group_wise(w.format) || w.format == WeightFormat::w8 ? w.num_groups() : 0;
  if (w.mins.defined()) {
    // w = q*s + m: the min replaces the zero point (GGUF Q4_1); any finite f16 value.
    LOWBIT_CHECK(w.format == WeightFormat::w4 && !w.symmetric && !w.zeros.defined(), op,
                 ": argument 'mins' applies to asymmetric w4 without 'zeros' (w = q*s + m), got format ",
                 name_of(w.format), w.symmetric ? " (symmetric)" : "", w.zeros.defined() ? " with zeros" : "");
    quant_detail::check_host_tensor(w.mins, ScalarType::f16, {w.n, groups}, op, "mins");
    const Tensor m = w.mins.contiguous();
    for (int64_t i = 0; i < m.numel(); ++i) {
      const float v = f16_bits_to_f32(m.data<uint16_t>()[i]);
      LOWBIT_CHECK(std::isfinite(v), op, ": argument 'mins' must hold finite f16 values, got ", v, " at row ",
                   i / groups, " group ", i % groups);
    }
    check_weight_params(w.format, w.n, groups, true, {w.scales, Tensor(), Tensor()}, true, op);
    return;
  }
  check_weight_params(w.format, w.n, groups, w.symmetric, {w.scales, w.zeros, w.channel_scales}, true, op);
  check_s8_reconstruction(w, op);
}

}  // namespace lowbit
