// Round-to-nearest weight quantization for every WeightFormat; the rules are spelled out in
// docs/formats.md and re-implemented independently by the tests. Rounding is half-to-even
// (std::nearbyint in the default rounding mode), all arithmetic in f32 unless said otherwise.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lowbit/quant/format.h"
#include "weight_checks.h"

namespace lowbit {
namespace {

constexpr const char* kOp = "quantize_weight";
// QServe §3.1: level-1 s8 values are kept in [-119, 119] so that the level-2 rounding error (at most
// s/2 <= 8) can never push the reconstruction past 127; LiquidGEMM §4 reuses the same range.
constexpr float kProtectiveRange = 119.f;

// round(x) clamped to [lo, hi] in float before the cast (x may be huge; casting inf is undefined).
inline int round_clamp(float x, float lo, float hi) {
  const float r = std::nearbyint(x);
  return static_cast<int>(r < lo ? lo : (r > hi ? hi : r));
}

// Per-channel symmetric scale max|x| / qmax; an all-zero row gets scale 1 (every q is then 0).
float channel_scale(const float* row, int64_t k, float qmax) {
  float amax = 0.f;
  for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
  const float s = amax / qmax;
  return s > 0.f ? s : 1.f;
}

// The weight as contiguous host f32, every value finite; returns max|w| through `amax`.
Tensor float_weight(const Tensor& w, float* amax) {
  check_defined(w, kOp, "w");
  check_dim(w, 2, kOp, "w");
  LOWBIT_CHECK_TYPE(w.device().is_cpu(), kOp, ": argument 'w' must be on the CPU, got ", w.device().str());
  LOWBIT_CHECK_TYPE(w.dtype() == ScalarType::f32 || w.dtype() == ScalarType::f16 || w.dtype() == ScalarType::bf16,
                    kOp, ": argument 'w' must be f32, f16 or bf16, got ", name_of(w.dtype()));
  LOWBIT_CHECK(w.size(0) > 0 && w.size(1) > 0, kOp, ": argument 'w' must be non-empty, got shape ",
               shape_str(w.shape()));
  const Tensor c = w.contiguous();
  const int64_t count = c.numel();
  Tensor out = c.dtype() == ScalarType::f32 ? c : Tensor::empty(c.shape(), ScalarType::f32);
  float* dst = out.data<float>();
  if (c.dtype() != ScalarType::f32) {
    const uint16_t* src = c.data<uint16_t>();
    const bool half = c.dtype() == ScalarType::f16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) dst[i] = half ? f16_bits_to_f32(src[i]) : bf16_bits_to_f32(src[i]);
  }
  int64_t bad = INT64_MAX;
  float m = 0.f;
#pragma omp parallel for schedule(static) reduction(min : bad) reduction(max : m)
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(dst[i])) bad = std::min(bad, i);
    else m = std::max(m, std::fabs(dst[i]));
  }
  LOWBIT_CHECK(bad == INT64_MAX, kOp, ": argument 'w' must be finite, got ", bad == INT64_MAX ? 0.f : dst[bad],
               " at row ", bad / std::max<int64_t>(1, w.size(1)), " column ", bad % std::max<int64_t>(1, w.size(1)));
  *amax = m;
  return out;
}

struct Rows {
  const float* w;
  int64_t n, k;
  const float* row(int64_t r) const { return w + r * k; }
};

// w8 (SmoothQuant-style s8): s = max|w| / 127 over the row, or over each group of `group` columns when
// group > 0 (GGUF Q8_0's layout); q = clamp(round(w / s), -127, 127).
void quantize_w8(const Rows& in, int group, const float* given, int8_t* q, float* scales) {
  const int64_t span = group > 0 ? group : in.k, groups = (in.k + span - 1) / span;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < in.n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * span, c1 = std::min(in.k, c0 + span), pi = r * groups + g;
      const float s = given ? given[pi] : channel_scale(in.row(r) + c0, c1 - c0, 127.f);
      scales[pi] = s;
      for (int64_t c = c0; c < c1; ++c)
        q[r * in.k + c] = static_cast<int8_t>(round_clamp(in.row(r)[c] / s, -127.f, 127.f));
    }
  }
}

// e4m3 per channel: s = max|w| / 448 (the largest finite e4m3), q = e4m3(w / s) rounded to nearest even.
void quantize_e4m3(const Rows& in, const float* given, uint8_t* q, float* scales) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < in.n; ++r) {
    const float* x = in.row(r);
    const float s = given ? given[r] : channel_scale(x, in.k, 448.f);
    scales[r] = s;
    for (int64_t c = 0; c < in.k; ++c) q[r * in.k + c] = f32_to_e4m3_bits(x[c] / s);
  }
}

// w4 (AWQ/GPTQ semantics, w = (q - z) * s), per group of `group` columns:
//   asymmetric: range [min(w, 0), max(w, 0)], s = f16(range / 15), z = clamp(round(-min / s), 0, 15)
//   symmetric : s = f16(max|w| / 7), z = 8 (so q - 8 spans [-8, 7])
//   q = clamp(round(w / s) + z, 0, 15), always with the f16-rounded s; an f16 s of 0 becomes 1.
void quantize_w4(const Rows& in, int group, bool symmetric, const uint16_t* given_s, const uint16_t* given_z,
                 uint8_t* q, uint16_t* scales, uint16_t* zeros) {
  const int64_t groups = (in.k + group - 1) / group;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < in.n; ++r) {
    const float* x = in.row(r);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group, c1 = std::min(in.k, c0 + group), pi = r * groups + g;
      float lo = 0.f, hi = 0.f;
      for (int64_t c = c0; c < c1; ++c) lo = std::min(lo, x[c]), hi = std::max(hi, x[c]);
      uint16_t sb;
      if (given_s) {
        sb = given_s[pi];
      } else {
        sb = f32_to_f16_bits(symmetric ? std::max(hi, -lo) / 7.f : (hi - lo) / 15.f);
        if (!(f16_bits_to_f32(sb) > 0.f)) sb = 0x3C00;  // 1.0
      }
      const float s = f16_bits_to_f32(sb);
      float z = 8.f;
      if (!symmetric) z = given_z ? f16_bits_to_f32(given_z[pi]) : static_cast<float>(round_clamp(-lo / s, 0.f, 15.f));
      scales[pi] = sb;
      if (!symmetric) zeros[pi] = f32_to_f16_bits(z);
      for (int64_t c = c0; c < c1; ++c) {
        const float v = std::nearbyint(x[c] / s) + z;  // exact whenever it lands in [0, 15]
        q[r * in.k + c] = static_cast<uint8_t>(v < 0.f ? 0.f : (v > 15.f ? 15.f : v));
      }
    }
  }
}

// Level 1 of QoQ / LiquidQuant: per-channel s8 in the protective range, cs = max|w| / 119.
void quantize_level1(const Rows& in, const float* given, int* q8, float* channel_scales) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < in.n; ++r) {
    const float* x = in.row(r);
    const float s = given ? given[r] : channel_scale(x, in.k, kProtectiveRange);
    channel_scales[r] = s;
    for (int64_t c = 0; c < in.k; ++c)
      q8[r * in.k + c] = round_clamp(x[c] / s, -kProtectiveRange, kProtectiveRange);
  }
}

// QoQ level 2 (QServe §3.1, Eq. 2), per group of s8 values v:
//   range [min(v, 0), max(v, 0)] (a u4 zero in [0, 15] always represents 0), integer step
//   s = max(1, ceil(range / 15)) <= 16, z = clamp(round(-min / s), 0, 15), q = clamp(round(v / s) + z, 0, 15).
void quantize_qoq_level2(const int* q8, int64_t n, int64_t k, int group, const uint8_t* given_s,
                         const uint8_t* given_z, uint8_t* q, uint8_t* scales, uint8_t* zeros) {
  const int64_t groups = (k + group - 1) / group;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const int* v = q8 + r * k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group, c1 = std::min(k, c0 + group), pi = r * groups + g;
      int lo = 0, hi = 0;
      for (int64_t c = c0; c < c1; ++c) lo = std::min(lo, v[c]), hi = std::max(hi, v[c]);
      const int s = given_s ? given_s[pi] : std::max(1, (hi - lo + 14) / 15);
      const int z = given_z ? given_z[pi] : round_clamp(static_cast<float>(-lo) / s, 0.f, 15.f);
      scales[pi] = static_cast<uint8_t>(s);
      zeros[pi] = static_cast<uint8_t>(z);
      for (int64_t c = c0; c < c1; ++c)
        q[r * k + c] = static_cast<uint8_t>(round_clamp(std::nearbyint(static_cast<float>(v[c]) / s) + z, 0.f, 15.f));
    }
  }
}

// LiquidQuant level 2 (LiquidGEMM §4, Eq. 7): per group of s8 values v with true min/max,
//   s = max(1, ceil((max - min) / 15)) <= 16, a = 128 + min, q = clamp(round((v - min) / s), 0, 15),
// so that (q*s + a) XOR 0x80 (u8 arithmetic) is the s8 value min + q*s (Eq. 12). Eq. 7 rounds s to
// nearest; rounding it down makes 15*s fall short of the range and clips the group max by more than
// s/2 (range 112: s = 7, max error 7), so we take the ceiling, which has the same bound s <= 16.
void quantize_liquid_level2(const int* q8, int64_t n, int64_t k, int group, const uint8_t* given_s,
                            const uint8_t* given_a, uint8_t* q, uint8_t* scales, uint8_t* offsets) {
  const int64_t groups = (k + group - 1) / group;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const int* v = q8 + r * k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group, c1 = std::min(k, c0 + group), pi = r * groups + g;
      int lo = v[c0], hi = v[c0];
      for (int64_t c = c0; c < c1; ++c) lo = std::min(lo, v[c]), hi = std::max(hi, v[c]);
      const int s = given_s ? given_s[pi] : std::max(1, (hi - lo + 14) / 15);
      const int a = given_a ? given_a[pi] : 128 + lo;
      const int base = a - 128;
      scales[pi] = static_cast<uint8_t>(s);
      offsets[pi] = static_cast<uint8_t>(a);
      for (int64_t c = c0; c < c1; ++c)
        q[r * k + c] = static_cast<uint8_t>(round_clamp(static_cast<float>(v[c] - base) / s, 0.f, 15.f));
    }
  }
}

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.contiguous().data<T>() : nullptr;
}

}  // namespace

QuantizedWeight quantize_weight_with_params(const Tensor& w, WeightFormat format, int group, bool symmetric,
                                            const WeightQuantParams& params) {
  using namespace quant_detail;
  if (group == 0) group = default_group(format);
  check_group_size(format, group, kOp);
  LOWBIT_CHECK(format == WeightFormat::w4 || !symmetric, kOp, ": 'symmetric' applies to w4 only, got format ",
               name_of(format));
  float amax = 0.f;
  const Tensor wf = float_weight(w, &amax);
  const Rows in{wf.data<float>(), wf.size(0), wf.size(1)};
  const int64_t n = in.n, k = in.k;
  LOWBIT_CHECK(element_type_of(format) != ScalarType::u4 || k % 2 == 0, kOp, ": format ", name_of(format),
               " stores u4 rows two values per byte and needs an even k, got w of shape ", shape_str(w.shape()));

  QuantizedWeight out;
  out.format = format;
  out.n = n;
  out.k = k;
  out.group = is_group_wise(format) || format == WeightFormat::w8 ? group : 0;
  out.symmetric = symmetric;
  const int64_t groups = out.num_groups();
  check_weight_params(format, n, groups, symmetric, params, false, kOp);
  // Keep the given tensors alive (contiguous copies) while the raw pointers below are in use.
  const Tensor gs = params.scales.defined() ? params.scales.contiguous() : Tensor();
  const Tensor gz = params.zeros.defined() ? params.zeros.contiguous() : Tensor();
  const Tensor gc = params.channel_scales.defined() ? params.channel_scales.contiguous() : Tensor();

  switch (format) {
    case WeightFormat::f32:
      out.q = wf.clone();
      break;
    case WeightFormat::f16:
    case WeightFormat::bf16: {
      out.q = Tensor::empty({n, k}, element_type_of(format));
      uint16_t* q = out.q.data<uint16_t>();
      const bool half = format == WeightFormat::f16;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n * k; ++i) q[i] = half ? f32_to_f16_bits(in.w[i]) : f32_to_bf16_bits(in.w[i]);
      break;
    }
    case WeightFormat::w8:
      out.q = Tensor::empty({n, k}, ScalarType::s8);
      out.scales = groups > 0 ? Tensor::empty({n, groups}, ScalarType::f32) : Tensor::empty({n}, ScalarType::f32);
      quantize_w8(in, out.group, data_or_null<float>(gs), out.q.data<int8_t>(), out.scales.data<float>());
      break;
    case WeightFormat::e4m3:
      out.q = Tensor::empty({n, k}, ScalarType::e4m3);
      out.scales = Tensor::empty({n}, ScalarType::f32);
      quantize_e4m3(in, data_or_null<float>(gs), out.q.data<uint8_t>(), out.scales.data<float>());
      break;
    case WeightFormat::w4: {
      LOWBIT_CHECK(gs.defined() || amax / 7.f <= 65504.f, kOp, ": w4 scales are f16, so max|w| must be <= ",
                   65504.f * 7.f, ", got ", amax);
      Tensor values = Tensor::empty({n, k}, ScalarType::u8);
      out.scales = Tensor::empty({n, groups}, ScalarType::f16);
      if (!symmetric) out.zeros = Tensor::empty({n, groups}, ScalarType::f16);
      quantize_w4(in, group, symmetric, data_or_null<uint16_t>(gs), data_or_null<uint16_t>(gz),
                  values.data<uint8_t>(), out.scales.data<uint16_t>(),
                  symmetric ? nullptr : out.zeros.data<uint16_t>());
      out.q = pack_u4_values(values, kOp, "q");
      break;
    }
    case WeightFormat::qoq:
    case WeightFormat::liquid: {
      Tensor level1 = Tensor::empty({n, k}, ScalarType::s32);
      Tensor values = Tensor::empty({n, k}, ScalarType::u8);
      out.channel_scales = Tensor::empty({n}, ScalarType::f32);
      out.scales = Tensor::empty({n, groups}, ScalarType::u8);
      out.zeros = Tensor::empty({n, groups}, ScalarType::u8);
      quantize_level1(in, data_or_null<float>(gc), level1.data<int>(), out.channel_scales.data<float>());
      if (format == WeightFormat::qoq)
        quantize_qoq_level2(level1.data<int>(), n, k, group, data_or_null<uint8_t>(gs), data_or_null<uint8_t>(gz),
                            values.data<uint8_t>(), out.scales.data<uint8_t>(), out.zeros.data<uint8_t>());
      else
        quantize_liquid_level2(level1.data<int>(), n, k, group, data_or_null<uint8_t>(gs), data_or_null<uint8_t>(gz),
                               values.data<uint8_t>(), out.scales.data<uint8_t>(), out.zeros.data<uint8_t>());
      out.q = pack_u4_values(values, kOp, "q");
      // Never fires for round-to-nearest parameters (the protective range guarantees it); caller-chosen
      // steps and zeros can break it, and a silently wrapped weight must not reach a kernel.
      check_s8_reconstruction(out, kOp);
      break;
    }
  }
  return out;
}

QuantizedWeight quantize_weight(const Tensor& w, WeightFormat format, int group, bool symmetric) {
  return quantize_weight_with_params(w, format, group, symmetric, WeightQuantParams{});
}

}  // namespace lowbit
