// Per-token s8 and COMET FMPQ activation quantization vs float64 references; outputs poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "lowbit/quant/activation.h"

namespace lowbit {
namespace {

Tensor random_activation(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Tensor x = Tensor::empty({m, k}, ScalarType::f32);
  for (int64_t i = 0; i < m * k; ++i) x.data<float>()[i] = dist(rng) * (i % 131 == 5 ? 40.f : 1.f);
  return x;
}

// q must be the round-to-nearest of t clamped to +-qmax (a near-.5 tie may go either way in f32).
void expect_rounded(int q, double t, int qmax, int64_t where) {
  const double ref = std::clamp(std::nearbyint(t), double(-qmax), double(qmax));
  const double frac = std::fabs(t - std::trunc(t));
  if (std::fabs(frac - 0.5) < 1e-5 && std::fabs(q - ref) <= 1) return;
  ASSERT_EQ(q, ref) << "element " << where << " t=" << t;
}

// Reference for one span: scale = max|x| / qmax (1 for an all-zero span).
double span_scale(const float* x, int64_t len, int qmax) {
  double amax = 0;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(double(x[i])));
  return amax > 0 ? amax / qmax : 1.0;
}

TEST(QuantActivation, PerTokenS8MatchesReference) {
  for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 1}, {1, 576}, {5, 33}, {17, 1536}}) {
    Tensor x = random_activation(m, k, 3 + k);
    if (m > 2) std::fill(x.data<float>() + k, x.data<float>() + 2 * k, 0.f);  // an all-zero token
    Tensor q = Tensor::empty({m, k}, ScalarType::s8), s = Tensor::empty({m}, ScalarType::f32);
    q.fill_bytes_(0xAA);
    s.fill_bytes_(0xFF);  // NaN
    quantize_per_token_s8(x, q, s);
    for (int64_t r = 0; r < m; ++r) {
      const float sref = static_cast<float>(span_scale(x.data<float>() + r * k, k, 127));
      ASSERT_EQ(s.data<float>()[r], sref) << "row " << r;
      for (int64_t c = 0; c < k; ++c)
        expect_rounded(q.data<int8_t>()[r * k + c], x.data<float>()[r * k + c] / double(sref), 127, r * k + c);
    }
  }
}

TEST(QuantActivation, PerTokenS8HalfInputsAndAllocation) {
  const Tensor x = random_activation(3, 70, 8);
  for (ScalarType t : {ScalarType::f16, ScalarType::bf16}) {
    Tensor h = Tensor::empty({3, 70}, t), back = Tensor::empty({3, 70}, ScalarType::f32);
    for (int i = 0; i < 210; ++i) {
      const float v = x.data<float>()[i];
      h.data<uint16_t>()[i] = t == ScalarType::f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
      back.data<float>()[i] = t == ScalarType::f16 ? f16_bits_to_f32(h.data<uint16_t>()[i])
                                                   : bf16_bits_to_f32(h.data<uint16_t>()[i]);
    }
    Tensor q1, s1, q2, s2;  // undefined: allocated by the call
    quantize_per_token_s8(h, q1, s1);
    quantize_per_token_s8(back, q2, s2);
    ASSERT_EQ(q1.shape(), Shape({3, 70}));
    for (int i = 0; i < 210; ++i) ASSERT_EQ(q1.data<int8_t>()[i], q2.data<int8_t>()[i]);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(s1.data<float>()[i], s2.data<float>()[i]);
  }
}

TEST(QuantActivation, FmpqMatchesReference) {
  for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 128}, {3, 300}, {8, 576}, {2, 1}}) {
    const Tensor x = random_activation(m, k, 50 + k);
    const int64_t blocks = (k + 127) / 128;
    Tensor bits = Tensor::empty({blocks}, ScalarType::u8);
    for (int64_t b = 0; b < blocks; ++b) bits.data<uint8_t>()[b] = b % 3 == 1 ? 8 : 4;
    FmpqActivation out;
    out.q = Tensor::empty({m, k}, ScalarType::s8);
    out.scales = Tensor::empty({m, blocks}, ScalarType::f32);
    out.q.fill_bytes_(0x7F);
    out.scales.fill_bytes_(0xFF);
    quantize_fmpq(x, bits, out);
    ASSERT_EQ(out.block_bits.shape(), Shape({blocks}));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const int qmax = b % 3 == 1 ? 127 : 7;
        ASSERT_EQ(out.block_bits.data<uint8_t>()[b], b % 3 == 1 ? 8 : 4);
        const int64_t c0 = b * 128, len = std::min<int64_t>(128, k - c0);
        const float sref = static_cast<float>(span_scale(x.data<float>() + r * k + c0, len, qmax));
        ASSERT_EQ(out.scales.data<float>()[r * blocks + b], sref) << "row " << r << " block " << b;
        for (int64_t c = c0; c < c0 + len; ++c) {
          const int q = out.q.data<int8_t>()[r * k + c];
          ASSERT_LE(std::abs(q), qmax);
          expect_rounded(q, x.data<float>()[r * k + c] / double(sref), qmax, r * k + c);
        }
      }
  }
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

TEST(QuantActivation, BadInputs) {
  const Tensor x = random_activation(2, 200, 1);
  Tensor q, s;
  expect_error([&] { quantize_per_token_s8(Tensor::empty({2, 3}, ScalarType::s32), q, s); }, ErrorKind::kType,
               {"quantize_per_token_s8", "'x'", "s32"});
  Tensor wrong_q = Tensor::empty({2, 199}, ScalarType::s8);
  expect_error([&] { quantize_per_token_s8(x, wrong_q, s); }, ErrorKind::kValue,
               {"quantize_per_token_s8", "q", "[2, 200]", "[2, 199]"});
  Tensor inf = x.clone();
  inf.data<float>()[205] = INFINITY;
  Tensor q2, s2;
  expect_error([&] { quantize_per_token_s8(inf, q2, s2); }, ErrorKind::kValue, {"finite", "row 1", "column 5"});
  Tensor bits = Tensor::empty({2}, ScalarType::u8);
  bits.data<uint8_t>()[0] = 4;
  bits.data<uint8_t>()[1] = 6;
  FmpqActivation out;
  expect_error([&] { quantize_fmpq(x, bits, out); }, ErrorKind::kValue, {"quantize_fmpq", "block_bits", "6", "block 1"});
  FmpqActivation out2;
  expect_error([&] { quantize_fmpq(x, Tensor::empty({3}, ScalarType::u8), out2); }, ErrorKind::kValue,
               {"quantize_fmpq", "block_bits", "[2]", "[3]"});
}

}  // namespace
}  // namespace lowbit
