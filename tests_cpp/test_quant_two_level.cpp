// QoQ (QServe §3.1) and LiquidQuant (LiquidGEMM §4): level-1 per-channel s8 in [-119, 119], level-2
// group u4. Level 2 is integer math, so it is checked bit-exactly against plain integer references
// written here; the s8 no-overflow invariant is checked exhaustively over every group range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lowbit/quant/format.h"

namespace lowbit {
namespace {

constexpr float kStep = 1.f / 128;  // channel scale of the integer-exact weights (a power of two)

int u4_at(const Tensor& q, int64_t e) { return (q.data<uint8_t>()[e >> 1] >> ((e & 1) * 4)) & 0xF; }

// round(num / den) with ties to even, den > 0, in exact integer arithmetic.
int round_div(int num, int den) {
  const int fl = num >= 0 ? num / den : -((-num + den - 1) / den);  // floor
  const int rem2 = 2 * (num - fl * den);                            // 2 * remainder in [0, 2 den)
  if (rem2 < den) return fl;
  if (rem2 > den) return fl + 1;
  return fl % 2 == 0 ? fl : fl + 1;
}

// Weights whose level-1 integers are exactly `v` (each row holds +-119 so the channel scale is kStep).
Tensor weight_from_levels(const std::vector<int>& v, int64_t n, int64_t k) {
  Tensor w = Tensor::empty({n, k}, ScalarType::f32);
  for (int64_t i = 0; i < n * k; ++i) w.data<float>()[i] = static_cast<float>(v[i]) * kStep;
  return w;
}

struct Level2Ref {
  std::vector<int> q, s, z;  // z: qoq zero / liquid offset a
  std::vector<int> s8;       // the s8 value each element stands for
};

Level2Ref reference_level2(bool liquid, const std::vector<int>& v, int64_t n, int64_t k, int group) {
  const int64_t G = (k + group - 1) / group;
  Level2Ref ref;
  ref.q.resize(n * k);
  ref.s8.resize(n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t c0 = g * group, c1 = std::min(k, c0 + group);
      int lo = v[r * k + c0], hi = lo;
      for (int64_t c = c0; c < c1; ++c) lo = std::min(lo, v[r * k + c]), hi = std::max(hi, v[r * k + c]);
      int s, z;
      if (liquid) {
        s = std::max(1, (hi - lo + 14) / 15);  // ceil (see quantize_weight.cpp: Eq. 7 rounds, which clips)
        z = 128 + lo;
      } else {
        lo = std::min(lo, 0), hi = std::max(hi, 0);
        s = std::max(1, (hi - lo + 14) / 15);  // ceil
        z = std::clamp(round_div(-lo, s), 0, 15);
      }
      ref.s.push_back(s);
      ref.z.push_back(z);
      for (int64_t c = c0; c < c1; ++c) {
        const int e = r * k + c;
        const int q = liquid ? std::clamp(round_div(v[e] - lo, s), 0, 15) : std::clamp(round_div(v[e], s) + z, 0, 15);
        ref.q[e] = q;
        ref.s8[e] = liquid ? lo + q * s : (q - z) * s;  // the plain integer meaning of the format
      }
    }
  return ref;
}

void check_bit_exact(WeightFormat f, const std::vector<int>& v, int64_t n, int64_t k, int group) {
  const bool liquid = f == WeightFormat::liquid;
  const QuantizedWeight qw = quantize_weight(weight_from_levels(v, n, k), f, group);
  const Level2Ref ref = reference_level2(liquid, v, n, k, group);
  const int64_t G = (k + group - 1) / group;
  ASSERT_EQ(qw.scales.dtype(), ScalarType::u8);
  ASSERT_EQ(qw.zeros.dtype(), ScalarType::u8);
  ASSERT_EQ(qw.scales.shape(), Shape({n, G}));
  ASSERT_EQ(qw.channel_scales.shape(), Shape({n}));
  for (int64_t r = 0; r < n; ++r) ASSERT_EQ(qw.channel_scales.data<float>()[r], kStep);
  for (int64_t i = 0; i < n * G; ++i) {
    ASSERT_EQ(qw.scales.data<uint8_t>()[i], ref.s[i]) << "group " << i;
    ASSERT_EQ(qw.zeros.data<uint8_t>()[i], ref.z[i]) << "group " << i;
  }
  Tensor d = dequantize_weight(qw);
  for (int64_t e = 0; e < n * k; ++e) {
    ASSERT_EQ(u4_at(qw.q, e), ref.q[e]) << "element " << e;
    ASSERT_GE(ref.s8[e], -128);
    ASSERT_LE(ref.s8[e], 127);
    ASSERT_EQ(d.data<float>()[e], static_cast<float>(ref.s8[e]) * kStep) << "element " << e;
    // Round to nearest on the group grid: at most half a step from the level-1 value.
    ASSERT_LE(2 * std::abs(ref.s8[e] - v[e]), ref.s[(e / k) * G + (e % k) / group]) << "element " << e;
  }
}

std::vector<int> random_levels(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> spread(1, 119);
  std::vector<int> v(n * k);
  for (int64_t r = 0; r < n; ++r) {
    const int width = spread(rng);  // rows of different dynamic range
    std::uniform_int_distribution<int> d(-width, width);
    for (int64_t c = 0; c < k; ++c) v[r * k + c] = d(rng);
    v[r * k + (r * 7) % k] = r % 2 ? 119 : -119;
  }
  return v;
}

TEST(QuantTwoLevel, QoqLevel2BitExact) {
  for (int group : {32, 64, 128})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 2}, {3, 130}, {9, 576}, {4, 34}})
      check_bit_exact(WeightFormat::qoq, random_levels(n, k, 100 + group + k), n, k, group);
}

TEST(QuantTwoLevel, LiquidLevel2BitExact) {
  for (int group : {32, 64, 128})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 2}, {3, 130}, {9, 576}, {4, 34}})
      check_bit_exact(WeightFormat::liquid, random_levels(n, k, 200 + group + k), n, k, group);
}

// Every group range [lo, hi] inside the protective range, as one row each: the reconstruction must
// stay in s8 (qoq: q*s - z*s; liquid: (q*s + a) XOR 0x80 in u8) and match the integer reference.
std::vector<int> every_group_range(int64_t* rows) {
  std::vector<int> v;
  for (int lo = -119; lo <= 119; ++lo)
    for (int hi = lo; hi <= 119; ++hi) {
      // Columns 0-1 hold +-119 so the channel scale is kStep. Group 1 (columns 32-63) spans exactly
      // [lo, hi]: the ramp's last two values (hi side) plus a permuted ramp that starts at lo.
      v.push_back(hi == 119 || lo == -119 ? 0 : 119);
      v.push_back(lo == -119 ? -119 : hi == 119 ? 119 : -119);
      for (int c = 0; c < 32; ++c) v.push_back(lo + (hi - lo) * c / 31);
      for (int c = 0; c < 30; ++c) v.push_back(lo + (hi - lo) * ((c * 17) % 32) / 31);
    }
  *rows = static_cast<int64_t>(v.size()) / 64;
  return v;
}

TEST(QuantTwoLevel, QoqNeverOverflowsOnAnyGroupRange) {
  int64_t n = 0;
  const std::vector<int> v = every_group_range(&n);
  ASSERT_EQ(n, 239 * 240 / 2);
  for (int64_t r = 0; r < n; r += 977) {  // spot-check the construction: group 1 spans [lo, hi] of its row
    const auto g1 = v.begin() + r * 64 + 32;
    EXPECT_EQ(*std::min_element(g1, g1 + 32), v[r * 64 + 2]);
    EXPECT_EQ(*std::max_element(g1, g1 + 32), v[r * 64 + 33]);
  }
  check_bit_exact(WeightFormat::qoq, v, n, 64, 32);
}

TEST(QuantTwoLevel, LiquidNeverOverflowsOnAnyGroupRange) {
  int64_t n = 0;
  const std::vector<int> v = every_group_range(&n);
  check_bit_exact(WeightFormat::liquid, v, n, 64, 32);
}

TEST(QuantTwoLevel, Level1OnRandomWeights) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 0.02f);
  const int64_t n = 6, k = 200;
  Tensor w = Tensor::empty({n, k}, ScalarType::f32);
  for (int64_t i = 0; i < n * k; ++i) w.data<float>()[i] = dist(rng) * (i % 97 == 3 ? 10.f : 1.f);
  for (WeightFormat f : {WeightFormat::qoq, WeightFormat::liquid}) {
    const QuantizedWeight qw = quantize_weight(w, f, 64);
    const Tensor d = dequantize_weight(qw);
    for (int64_t r = 0; r < n; ++r) {
      double amax = 0;
      for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(double(w.data<float>()[r * k + c])));
      const float cs = static_cast<float>(amax / 119.0);
      ASSERT_EQ(qw.channel_scales.data<float>()[r], cs);
      for (int64_t c = 0; c < k; ++c) {
        const int s = qw.scales.data<uint8_t>()[r * 4 + c / 64];
        ASSERT_LE(s, 16);
        // level-1 rounding (half a channel step) + level-2 rounding (half a group step)
        ASSERT_LE(std::fabs(double(d.data<float>()[r * k + c]) - w.data<float>()[r * k + c]),
                  (0.5 + 0.5 * s) * cs * (1 + 1e-5));
      }
    }
  }
}

QuantizedWeight hand_made(WeightFormat f, int q, int s, int z) {
  QuantizedWeight w;
  w.format = f;
  w.n = 2;
  w.k = 32;
  w.group = 32;
  Tensor values = Tensor::empty({2, 32}, ScalarType::u8);
  for (int i = 0; i < 64; ++i) values.data<uint8_t>()[i] = i == 45 ? q : 0;
  w.q = pack_u4_values(values, "test", "q");
  w.scales = Tensor::empty({2, 1}, ScalarType::u8);
  w.zeros = Tensor::empty({2, 1}, ScalarType::u8);
  w.channel_scales = Tensor::empty({2}, ScalarType::f32);
  for (int r = 0; r < 2; ++r) {
    w.scales.data<uint8_t>()[r] = r == 1 ? s : 1;
    w.zeros.data<uint8_t>()[r] = r == 1 ? z : (f == WeightFormat::liquid ? 128 : 0);
    w.channel_scales.data<float>()[r] = 0.01f;
  }
  return w;
}

void expect_invariant_error(const QuantizedWeight& w, const std::vector<std::string>& parts) {
  try {
    dequantize_weight(w);
    FAIL() << "expected the s8 invariant to fire";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kValue);
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(QuantTwoLevel, BrokenInvariantThrows) {
  // qoq: 15*17 - 0 = 255 is a valid u8 product but not an s8 value.
  expect_invariant_error(hand_made(WeightFormat::qoq, 15, 17, 0), {"dequantize_weight", "qoq", "row 1", "column 13", "255"});
  // qoq: z*s = 15*18 = 270 does not fit a u8 lane.
  expect_invariant_error(hand_made(WeightFormat::qoq, 15, 18, 15), {"qoq", "row 1"});
  // liquid: q*s + a = 15*16 + 247 = 487 wraps u8.
  expect_invariant_error(hand_made(WeightFormat::liquid, 15, 16, 247), {"liquid", "row 1", "column 13", "> 255"});
  // liquid steps above 16 are outside the format.
  expect_invariant_error(hand_made(WeightFormat::liquid, 1, 17, 0), {"scales", "[1, 16]", "17"});
  // The same checks guard caller-chosen parameters.
  Tensor w = Tensor::empty({1, 32}, ScalarType::f32);
  for (int c = 0; c < 32; ++c) w.data<float>()[c] = 0.1f * (c - 16);
  Tensor s = Tensor::empty({1, 1}, ScalarType::u8), z = Tensor::empty({1, 1}, ScalarType::u8);
  s.data<uint8_t>()[0] = 18;
  z.data<uint8_t>()[0] = 15;
  EXPECT_THROW(quantize_weight_with_params(w, WeightFormat::qoq, 32, false, {s, z, {}}), Error);
  // Valid hand-made weights pass.
  EXPECT_NO_THROW(dequantize_weight(hand_made(WeightFormat::qoq, 15, 16, 8)));
  EXPECT_NO_THROW(dequantize_weight(hand_made(WeightFormat::liquid, 15, 16, 9)));
}

TEST(QuantTwoLevel, GivenParamsAreUsed) {
  const std::vector<int> v = random_levels(3, 64, 9);
  const Tensor w = weight_from_levels(v, 3, 64);
  Tensor cs = Tensor::empty({3}, ScalarType::f32);
  for (int r = 0; r < 3; ++r) cs.data<float>()[r] = kStep * 2;  // coarser level 1: q8 = round(v / 2)
  Tensor s = Tensor::empty({3, 2}, ScalarType::u8);
  for (int i = 0; i < 6; ++i) s.data<uint8_t>()[i] = 3 + i;
  const QuantizedWeight qw = quantize_weight_with_params(w, WeightFormat::liquid, 32, false, {s, {}, cs});
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t g = 0; g < 2; ++g) {
      int lo = 1000;
      std::vector<int> q8;
      for (int c = 0; c < 32; ++c) q8.push_back(round_div(v[r * 64 + g * 32 + c], 2)), lo = std::min(lo, q8.back());
      const int step = s.data<uint8_t>()[r * 2 + g];
      ASSERT_EQ(qw.scales.data<uint8_t>()[r * 2 + g], step);
      ASSERT_EQ(qw.zeros.data<uint8_t>()[r * 2 + g], 128 + lo);
      for (int c = 0; c < 32; ++c)
        ASSERT_EQ(u4_at(qw.q, r * 64 + g * 32 + c), std::clamp(round_div(q8[c] - lo, step), 0, 15));
    }
}

}  // namespace
}  // namespace lowbit
