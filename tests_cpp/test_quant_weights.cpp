// quantize_weight / dequantize_weight for the single-level formats (f32 f16 bf16 w8 e4m3 w4), checked
// against float64 references written here from the format definitions (docs/formats.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lowbit/quant/format.h"

namespace lowbit {
namespace {

// Random weights with a few large outliers; never all zeros.
Tensor random_weight(int64_t n, int64_t k, uint32_t seed, float outlier = 8.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  Tensor w = Tensor::empty({n, k}, ScalarType::f32);
  float* p = w.data<float>();
  for (int64_t i = 0; i < n * k; ++i) p[i] = dist(rng) * (u(rng) < 0.01f ? outlier : 1.f);
  return w;
}

int u4_at(const Tensor& q, int64_t e) { return (q.data<uint8_t>()[e >> 1] >> ((e & 1) * 4)) & 0xF; }

// Round-to-nearest-even of a float64 quotient; `ambiguous` is set when the value sits so close to a
// .5 tie that the f32 quotient used by the library may legitimately round the other way.
double rne(double t, bool* ambiguous) {
  const double frac = std::fabs(t - std::trunc(t));
  *ambiguous = std::fabs(frac - 0.5) < 1e-5;
  return std::nearbyint(t);
}

// Expects the library's integer q to equal the reference, or its neighbour when the reference is a near-tie.
void expect_rounded(int got, double t, double lo, double hi, double offset, int64_t where) {
  bool amb = false;
  const double ref = std::clamp(rne(t, &amb) + offset, lo, hi);
  if (amb && std::fabs(got - ref) <= 1) return;
  ASSERT_EQ(got, ref) << "element " << where << " t=" << t;
}

struct Shape2 {
  int64_t n, k;
};
// k need not be a multiple of the group; u4 formats need an even k (two values per byte per row).
const Shape2 kShapes[] = {{1, 2}, {1, 96}, {3, 130}, {7, 200}, {16, 576}, {5, 34}};
const Shape2 kOddShapes[] = {{1, 1}, {3, 129}, {5, 33}};

TEST(QuantWeights, W8PerChannelMatchesReference) {
  std::vector<Shape2> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kOddShapes), std::end(kOddShapes));
  for (const auto& s : shapes) {
    const Tensor w = random_weight(s.n, s.k, 11 + s.k);
    const QuantizedWeight qw = quantize_weight(w, WeightFormat::w8);
    ASSERT_EQ(qw.q.dtype(), ScalarType::s8);
    ASSERT_EQ(qw.scales.shape(), Shape({s.n}));
    EXPECT_EQ(qw.group, 0);
    const Tensor d = dequantize_weight(qw);
    for (int64_t r = 0; r < s.n; ++r) {
      double amax = 0;
      for (int64_t c = 0; c < s.k; ++c) amax = std::max(amax, std::fabs(double(w.data<float>()[r * s.k + c])));
      const float sref = static_cast<float>(amax / 127.0);
      ASSERT_EQ(qw.scales.data<float>()[r], sref) << "row " << r;
      for (int64_t c = 0; c < s.k; ++c) {
        const int64_t e = r * s.k + c;
        const int q = qw.q.data<int8_t>()[e];
        expect_rounded(q, double(w.data<float>()[e]) / sref, -127, 127, 0, e);
        ASSERT_EQ(d.data<float>()[e], static_cast<float>(double(q) * sref));
        // Round to nearest: the reconstruction is within half a step of the weight.
        ASSERT_LE(std::fabs(double(d.data<float>()[e]) - w.data<float>()[e]), 0.5 * sref * (1 + 1e-5));
      }
    }
  }
}

TEST(QuantWeights, W8ZeroRowGetsUnitScale) {
  Tensor w = random_weight(3, 40, 5);
  std::fill(w.data<float>() + 40, w.data<float>() + 80, 0.f);  // row 1 all zero
  const QuantizedWeight qw = quantize_weight(w, WeightFormat::w8);
  EXPECT_EQ(qw.scales.data<float>()[1], 1.f);
  for (int c = 0; c < 40; ++c) EXPECT_EQ(qw.q.data<int8_t>()[40 + c], 0);
}

TEST(QuantWeights, E4m3PerChannelMatchesReference) {
  std::vector<Shape2> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kOddShapes), std::end(kOddShapes));
  for (const auto& s : shapes) {
    const Tensor w = random_weight(s.n, s.k, 21 + s.k);
    const QuantizedWeight qw = quantize_weight(w, WeightFormat::e4m3);
    ASSERT_EQ(qw.q.dtype(), ScalarType::e4m3);
    const Tensor d = dequantize_weight(qw);
    for (int64_t r = 0; r < s.n; ++r) {
      double amax = 0;
      for (int64_t c = 0; c < s.k; ++c) amax = std::max(amax, std::fabs(double(w.data<float>()[r * s.k + c])));
      const float sref = static_cast<float>(amax / 448.0);
      ASSERT_EQ(qw.scales.data<float>()[r], sref);
      for (int64_t c = 0; c < s.k; ++c) {
        const int64_t e = r * s.k + c;
        const double x = w.data<float>()[e] / double(sref);
        const double got = e4m3_bits_to_f32(qw.q.data<uint8_t>()[e]);
        // e4m3 has 3 mantissa bits: relative error <= 2^-4 for normals; absolute 2^-10 near 0 (subnormal step 2^-9).
        ASSERT_LE(std::fabs(got - x), std::max(std::fabs(x) * 0.0625, 0.001953125 / 2) * (1 + 1e-6)) << e;
        ASSERT_LE(std::fabs(got), 448.0);
        ASSERT_EQ(d.data<float>()[e], static_cast<float>(got * sref));
      }
    }
  }
}

// w4 reference: groups along k, f16 scale, integer f16 zero, q = clamp(round(w / s) + z, 0, 15).
void check_w4(const Tensor& w, const QuantizedWeight& qw, int group, bool symmetric) {
  const int64_t n = w.size(0), k = w.size(1), G = (k + group - 1) / group;
  ASSERT_EQ(qw.q.dtype(), ScalarType::u4);
  ASSERT_EQ(qw.q.shape(), Shape({n, k}));
  ASSERT_EQ(qw.scales.dtype(), ScalarType::f16);
  ASSERT_EQ(qw.scales.shape(), Shape({n, G}));
  ASSERT_EQ(qw.zeros.defined(), !symmetric);
  const Tensor d = dequantize_weight(qw);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < G; ++g) {
      double lo = 0, hi = 0;
      for (int64_t c = g * group; c < std::min(k, (g + 1) * group); ++c) {
        lo = std::min(lo, double(w.data<float>()[r * k + c]));
        hi = std::max(hi, double(w.data<float>()[r * k + c]));
      }
      const double raw = symmetric ? std::max(hi, -lo) / 7.0 : (hi - lo) / 15.0;
      float sref = f16_bits_to_f32(f32_to_f16_bits(static_cast<float>(raw)));
      if (sref == 0.f) sref = 1.f;
      const float s = f16_bits_to_f32(qw.scales.data<uint16_t>()[r * G + g]);
      ASSERT_EQ(s, sref) << "row " << r << " group " << g;
      double zref = 8;
      if (!symmetric) {
        bool amb = false;
        zref = std::clamp(rne(-lo / s, &amb), 0.0, 15.0);
        ASSERT_EQ(f16_bits_to_f32(qw.zeros.data<uint16_t>()[r * G + g]), zref) << "row " << r << " group " << g;
      }
      for (int64_t c = g * group; c < std::min(k, (g + 1) * group); ++c) {
        const int64_t e = r * k + c;
        const int q = u4_at(qw.q, e);
        expect_rounded(q, w.data<float>()[e] / double(s), 0, 15, zref, e);
        ASSERT_EQ(d.data<float>()[e], static_cast<float>((q - zref) * s)) << e;
      }
    }
}

TEST(QuantWeights, W4AsymmetricMatchesReference) {
  for (int group : {32, 64, 128})
    for (const auto& s : kShapes) {
      const Tensor w = random_weight(s.n, s.k, 31 + s.k + group);
      check_w4(w, quantize_weight(w, WeightFormat::w4, group, false), group, false);
    }
}

TEST(QuantWeights, W4SymmetricMatchesReference) {
  for (int group : {32, 128})
    for (const auto& s : kShapes) {
      const Tensor w = random_weight(s.n, s.k, 41 + s.k + group);
      check_w4(w, quantize_weight(w, WeightFormat::w4, group, true), group, true);
    }
}

TEST(QuantWeights, W4ReconstructionErrorIsHalfAStep) {
  const Tensor w = random_weight(8, 300, 77, 1.f);
  const QuantizedWeight qw = quantize_weight(w, WeightFormat::w4, 64, false);
  const Tensor d = dequantize_weight(qw);
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t c = 0; c < 300; ++c) {
      const double s = f16_bits_to_f32(qw.scales.data<uint16_t>()[r * 5 + c / 64]);
      // f16 rounding of the scale can shrink the grid by 2^-11 relative: allow that much past s/2 at the edge.
      EXPECT_LE(std::fabs(double(d.data<float>()[r * 300 + c]) - w.data<float>()[r * 300 + c]), s * 0.51);
    }
}

TEST(QuantWeights, FloatFormatsRoundTrip) {
  const Tensor w = random_weight(4, 50, 3);
  const QuantizedWeight f = quantize_weight(w, WeightFormat::f32);
  const QuantizedWeight h = quantize_weight(w, WeightFormat::f16);
  const QuantizedWeight b = quantize_weight(w, WeightFormat::bf16);
  const Tensor df = dequantize_weight(f), dh = dequantize_weight(h), db = dequantize_weight(b);
  for (int64_t i = 0; i < 200; ++i) {
    const float x = w.data<float>()[i];
    ASSERT_EQ(df.data<float>()[i], x);
    ASSERT_EQ(h.q.data<uint16_t>()[i], f32_to_f16_bits(x));
    ASSERT_EQ(dh.data<float>()[i], f16_bits_to_f32(f32_to_f16_bits(x)));
    ASSERT_NEAR(db.data<float>()[i], x, std::fabs(x) / 256 + 1e-30);
  }
}

TEST(QuantWeights, HalfInputIsAccepted) {
  const Tensor w = random_weight(3, 70, 9);
  Tensor h = Tensor::empty({3, 70}, ScalarType::f16), back = Tensor::empty({3, 70}, ScalarType::f32);
  for (int i = 0; i < 210; ++i) {
    h.data<uint16_t>()[i] = f32_to_f16_bits(w.data<float>()[i]);
    back.data<float>()[i] = f16_bits_to_f32(h.data<uint16_t>()[i]);
  }
  const QuantizedWeight a = quantize_weight(h, WeightFormat::w4, 32), b = quantize_weight(back, WeightFormat::w4, 32);
  EXPECT_EQ(std::memcmp(a.q.data_ptr(), b.q.data_ptr(), a.q.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.scales.data_ptr(), b.scales.data_ptr(), a.scales.nbytes()), 0);
}

TEST(QuantWeights, GivenParamsAreUsedAsGiven) {
  const Tensor w = random_weight(4, 96, 123);
  // w8: halve the round-to-nearest scale; values beyond +-127 steps must clamp.
  Tensor s8 = Tensor::empty({4}, ScalarType::f32);
  for (int r = 0; r < 4; ++r) s8.data<float>()[r] = 0.001f * (r + 1);
  const QuantizedWeight a = quantize_weight_with_params(w, WeightFormat::w8, 0, false, {s8, {}, {}});
  for (int64_t e = 0; e < 4 * 96; ++e)
    expect_rounded(a.q.data<int8_t>()[e], w.data<float>()[e] / double(s8.data<float>()[e / 96]), -127, 127, 0, e);
  // w4: GPTQ-style symmetric grid given as asymmetric params (s = 2 max / 15, z = 8).
  Tensor sc = Tensor::empty({4, 3}, ScalarType::f16), zr = Tensor::empty({4, 3}, ScalarType::f16);
  for (int i = 0; i < 12; ++i) {
    sc.data<uint16_t>()[i] = f32_to_f16_bits(0.01f + 0.001f * i);
    zr.data<uint16_t>()[i] = f32_to_f16_bits(float(i % 16));
  }
  const QuantizedWeight b = quantize_weight_with_params(w, WeightFormat::w4, 32, false, {sc, zr, {}});
  EXPECT_EQ(std::memcmp(b.scales.data_ptr(), sc.data_ptr(), sc.nbytes()), 0);
  EXPECT_EQ(std::memcmp(b.zeros.data_ptr(), zr.data_ptr(), zr.nbytes()), 0);
  for (int64_t e = 0; e < 4 * 96; ++e) {
    const int64_t pi = (e / 96) * 3 + (e % 96) / 32;
    expect_rounded(u4_at(b.q, e), w.data<float>()[e] / double(f16_bits_to_f32(sc.data<uint16_t>()[pi])), 0, 15,
                   f16_bits_to_f32(zr.data<uint16_t>()[pi]), e);
  }
  // Only the scale given: the zero is derived from it by the round-to-nearest rule.
  const QuantizedWeight c = quantize_weight_with_params(w, WeightFormat::w4, 32, false, {sc, {}, {}});
  const QuantizedWeight d = quantize_weight(w, WeightFormat::w4, 32, false);
  EXPECT_EQ(std::memcmp(c.scales.data_ptr(), sc.data_ptr(), sc.nbytes()), 0);
  EXPECT_NE(std::memcmp(c.q.data_ptr(), d.q.data_ptr(), d.q.nbytes()), 0);
}

template <typename Fn>
void expect_error(Fn fn, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL() << "expected an error mentioning " << parts[0];
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(QuantWeights, BadInputsNameOpArgumentAndValue) {
  const Tensor w = random_weight(4, 64, 1);
  expect_error([&] { quantize_weight(w, WeightFormat::w4, 48); }, ErrorKind::kValue,
               {"quantize_weight", "group", "32, 64 or 128", "48"});
  expect_error([&] { quantize_weight(Tensor::empty({4, 64}, ScalarType::s8), WeightFormat::w8); }, ErrorKind::kType,
               {"quantize_weight", "'w'", "s8"});
  expect_error([&] { quantize_weight(Tensor::empty({64}, ScalarType::f32), WeightFormat::w8); }, ErrorKind::kValue,
               {"quantize_weight", "w"});
  Tensor nan = w.clone();
  nan.data<float>()[70] = NAN;
  expect_error([&] { quantize_weight(nan, WeightFormat::w8); }, ErrorKind::kValue,
               {"quantize_weight", "finite", "row 1", "column 6"});
  expect_error([&] { quantize_weight(random_weight(2, 65, 3), WeightFormat::w4, 32); }, ErrorKind::kValue,
               {"quantize_weight", "even k", "[2, 65]"});
  expect_error([&] { quantize_weight(w, WeightFormat::w8, 128, true); }, ErrorKind::kValue, {"symmetric", "w8"});
  Tensor bad_scales = Tensor::empty({4, 3}, ScalarType::f16);
  expect_error([&] { quantize_weight_with_params(w, WeightFormat::w4, 32, false, {bad_scales, {}, {}}); },
               ErrorKind::kValue, {"quantize_weight", "scales", "[4, 2]", "[4, 3]"});
  Tensor zeros16 = Tensor::empty({4, 2}, ScalarType::f16), scales16 = Tensor::empty({4, 2}, ScalarType::f16);
  for (int i = 0; i < 8; ++i) {
    zeros16.data<uint16_t>()[i] = f32_to_f16_bits(i == 5 ? 16.f : 3.f);
    scales16.data<uint16_t>()[i] = f32_to_f16_bits(0.01f);
  }
  expect_error([&] { quantize_weight_with_params(w, WeightFormat::w4, 32, false, {scales16, zeros16, {}}); },
               ErrorKind::kValue, {"zeros", "[0, 15]", "16", "row 2"});
  expect_error([&] { quantize_weight_with_params(w, WeightFormat::w4, 32, true, {scales16, zeros16, {}}); },
               ErrorKind::kValue, {"symmetric", "zeros"});
  expect_error([&] { weight_format_from_name("int3"); }, ErrorKind::kValue, {"int3", "w4", "qoq", "liquid"});
  QuantizedWeight qw = quantize_weight(w, WeightFormat::w8);
  qw.scales = Tensor::empty({5}, ScalarType::f32);
  expect_error([&] { dequantize_weight(qw); }, ErrorKind::kValue, {"dequantize_weight", "scales", "[4]", "[5]"});
}

TEST(QuantWeights, DefaultGroups) {
  const Tensor w = random_weight(2, 256, 4);
  EXPECT_EQ(quantize_weight(w, WeightFormat::w4).group, 128);
  EXPECT_EQ(quantize_weight(w, WeightFormat::qoq).group, 128);
  EXPECT_EQ(quantize_weight(w, WeightFormat::liquid).group, 64);
  EXPECT_EQ(quantize_weight(w, WeightFormat::liquid).num_groups(), 4);
  EXPECT_EQ(quantize_weight(w, WeightFormat::w8).group, 0);  // w8: per channel unless a group is asked for
  EXPECT_EQ(quantize_weight(w, WeightFormat::w8, 32).num_groups(), 8);
  EXPECT_EQ(quantize_weight(w, WeightFormat::e4m3).num_groups(), 0);
}

TEST(QuantWeights, Names) {
  for (auto f : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::w8, WeightFormat::w4,
                 WeightFormat::qoq, WeightFormat::liquid, WeightFormat::e4m3})
    EXPECT_EQ(weight_format_from_name(name_of(f)), f);
  EXPECT_EQ(weight_format_from_name("QoQ"), WeightFormat::qoq);
  EXPECT_EQ(weight_bits(WeightFormat::w4), 4);
  EXPECT_EQ(weight_bits(WeightFormat::liquid), 4);
  EXPECT_EQ(weight_bits(WeightFormat::w8), 8);
  EXPECT_EQ(weight_bits(WeightFormat::e4m3), 8);
  EXPECT_EQ(weight_bits(WeightFormat::bf16), 16);
  EXPECT_EQ(weight_bits(WeightFormat::f32), 32);
}

}  // namespace
}  // namespace lowbit
