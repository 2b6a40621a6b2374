// The GEMVs' shared launch-shape search (kernels/sm80/gemv_plan.h) against a brute-force reading of its rule, on
// random budgets: the fewest CTAs along k whose share of x fits, chunks spread evenly, r4b4 unless it would split.
#include <gtest/gtest.h>

#include <random>

#include "kernels/sm80/gemv_plan.h"

namespace {

using lowbit::cuda::detail::plan_gemv_shape;

struct Config {
  int depth, blocks;
};
constexpr Config kConfigs[] = {{8, 2}, {4, 4}, {6, 3}};

TEST(GemvPlan, FewestEvenSplitThatFits) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int k_chunks = std::uniform_int_distribution<int>(1, 700)(rng);
    int cap[5];  // chunks of x that fit at 2, 3, 4 CTAs per SM
    for (int& c : cap) c = std::uniform_int_distribution<int>(1, 400)(rng);
    auto fits = [&](int blocks, int chunks) { return chunks <= cap[blocks]; };
    auto expect_shape = [&](int config, const lowbit::cuda::detail::GemvShape& s) {
      int split = 1;  // the fewest CTAs whose share fits (at most one chunk each)
      while (split < k_chunks && (k_chunks + split - 1) / split > cap[kConfigs[config].blocks]) ++split;
      const int per = (k_chunks + split - 1) / split;
      EXPECT_EQ(s.config, config);
      EXPECT_EQ(s.chunks_per_split, per);
      EXPECT_EQ(s.split, (k_chunks + per - 1) / per);
      EXPECT_LT((s.split - 1) * per, k_chunks);  // no CTA left without chunks
    };
    expect_shape(0, plan_gemv_shape("op", kConfigs, k_chunks, 8, 2, fits));
    expect_shape(k_chunks <= cap[4] ? 1 : 2, plan_gemv_shape("op", kConfigs, k_chunks, 0, 0, fits));
  }
}

TEST(GemvPlan, UnknownConfigurationNamesTheCompiledOnes) {
  try {
    plan_gemv_shape("gemm_x", kConfigs, 64, 5, 5, [](int, int) { return true; });
    FAIL() << "no error";
  } catch (const lowbit::Error& e) {
    EXPECT_EQ(e.kind(), lowbit::ErrorKind::kValue);
    EXPECT_STREQ(e.what(), "gemm_x: the gemv kernel has no configuration r5b5 (compiled: r8b2, r4b4, r6b3)");
  }
}

}  // namespace
