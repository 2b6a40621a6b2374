// The attention inner loops (the compiled library code the kernel calls) against float64: dot rows
// and P·V accumulation for every length (vector bodies and tails), the polynomial e^x, the shifted
// exponential sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/attention_simd.h"

using namespace lowbit::cpu;

TEST(AttentionSimd, DotRowsEveryLength) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t d = 1; d <= 70; ++d) {
    const int64_t n = 3;
    std::vector<float> q(static_cast<size_t>(d)), k(static_cast<size_t>(n * d)), out(n + 1, std::nanf(""));
    for (auto& x : q) x = u(rng);
    for (auto& x : k) x = u(rng);
    simd::dot_rows(q.data(), k.data(), n, d, out.data());
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < d; ++i) {
        ref += double(q[i]) * k[j * d + i];
        mag += std::abs(double(q[i]) * k[j * d + i]);
      }
      EXPECT_NEAR(out[j], ref, 2e-7 * mag) << "d " << d << " row " << j;
    }
    EXPECT_TRUE(std::isnan(out[n])) << "wrote past the end";
  }
}

TEST(AttentionSimd, AccumulateRowsEveryWidth) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t d : {1, 7, 8, 15, 16, 24, 32, 40, 64, 72, 80, 96, 127, 128, 200, 256}) {
    for (int64_t n : {1, 5, 16}) {
      std::vector<float> p(static_cast<size_t>(n)), v(static_cast<size_t>(n * d)), acc(static_cast<size_t>(d + 1));
      for (auto& x : p) x = u(rng);
      for (auto& x : v) x = u(rng);
      for (auto& x : acc) x = u(rng);
      acc[d] = std::nanf("");
      const std::vector<float> start = acc;
      simd::accumulate_rows(p.data(), v.data(), n, d, acc.data());
      for (int64_t i = 0; i < d; ++i) {
        double ref = start[i], mag = std::abs(start[i]);
        for (int64_t j = 0; j < n; ++j) {
          ref += double(p[j]) * v[j * d + i];
          mag += std::abs(double(p[j]) * v[j * d + i]);
        }
        EXPECT_NEAR(acc[i], ref, 2e-7 * mag) << "d " << d << " n " << n << " i " << i;
      }
      EXPECT_TRUE(std::isnan(acc[d])) << "wrote past the end";
    }
  }
}

TEST(AttentionSimd, ExpNonpositiveIsAccurateToAboutOneUlp) {
  double worst = 0;
  for (double x = 0; x >= -87; x -= 0.000731) {
    const double got = simd::exp_nonpositive(static_cast<float>(x));
    const double ref = std::exp(double(static_cast<float>(x)));
    worst = std::max(worst, std::abs(got - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(simd::exp_nonpositive(0.f), 1.f);
  EXPECT_LE(simd::exp_nonpositive(-1000.f), 1e-37f);  // clamped, no NaN or garbage
  EXPECT_GE(simd::exp_nonpositive(-1000.f), 0.f);
  EXPECT_LE(simd::exp_nonpositive(-std::numeric_limits<float>::infinity()), 1e-37f);
}

// A dense sweep reaches the edges of the reduced range |r| <= ln2/2, where a wrong polynomial shows;
// the length is not a multiple of 8, so the scalar tail runs too.
TEST(AttentionSimd, ExpShiftedSumSweep) {
  std::vector<float> x;
  for (double v = 2; v >= -78; v -= 0.00673) x.push_back(static_cast<float>(v));
  const float m = 2.f;  // the row maximum
  const std::vector<float> before = x;
  x.push_back(std::nanf(""));
  const int64_t n = static_cast<int64_t>(before.size());
  const float sum = simd::exp_shifted_sum(x.data(), n, m);
  double worst = 0, ref_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    // The shift is an f32 subtraction (as in any f32 softmax); the reference checks the exp.
    const double ref = std::exp(double(before[i] - m));
    ref_sum += ref;
    worst = std::max(worst, std::abs(x[i] - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_NEAR(sum, ref_sum, 1e-6 * ref_sum);
  EXPECT_TRUE(std::isnan(x[n])) << "wrote past the end";
}
