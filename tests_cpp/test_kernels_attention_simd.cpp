// The attention inner loops against float64: dot (every length, vector body and tail), the
// polynomial e^x used by the softmax, and the shifted exponential sum.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/attention_simd.h"

using namespace lowbit::cpu;

TEST(AttentionSimd, DotEveryLength) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t n = 1; n <= 70; ++n) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      a[i] = u(rng);
      b[i] = u(rng);
      ref += double(a[i]) * b[i];
      mag += std::abs(double(a[i]) * b[i]);
    }
    EXPECT_NEAR(simd::dot(a.data(), b.data(), n), ref, 2e-7 * mag + 1e-30) << "n " << n;
  }
}

TEST(AttentionSimd, ExpNonpositiveIsAccurateToAboutOneUlp) {
  double worst = 0;
  for (double x = 0; x >= -87; x -= 0.000731) {
    const double got = simd::exp_nonpositive(static_cast<float>(x));
    const double ref = std::exp(double(static_cast<float>(x)));
    worst = std::max(worst, std::abs(got - ref) / ref);
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_EQ(simd::exp_nonpositive(0.f), 1.f);
  EXPECT_LE(simd::exp_nonpositive(-1000.f), 1e-37f);  // clamped, no NaN or garbage
  EXPECT_GE(simd::exp_nonpositive(-1000.f), 0.f);
  EXPECT_LE(simd::exp_nonpositive(-std::numeric_limits<float>::infinity()), 1e-37f);
}

TEST(AttentionSimd, ExpShiftedSumEveryLength) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-30.f, 5.f);
  for (int64_t n = 1; n <= 40; ++n) {
    std::vector<float> x(static_cast<size_t>(n) + 1);
    for (auto& v : x) v = u(rng);
    const float m = *std::max_element(x.begin(), x.begin() + n);
    const std::vector<float> before = x;
    x[n] = std::nanf("");
    const float sum = simd::exp_shifted_sum(x.data(), n, m);
    double ref_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      // The shift itself is an f32 subtraction (as in any f32 softmax); the test checks the exp.
      const double ref = std::exp(double(before[i] - m));
      ref_sum += ref;
      EXPECT_NEAR(x[i], ref, 4e-7 * ref) << "n " << n << " i " << i;
    }
    EXPECT_NEAR(sum, ref_sum, 1e-6 * ref_sum) << "n " << n;
    EXPECT_TRUE(std::isnan(x[n])) << "wrote past the end";
  }
}
