// The Hopper prefill kernel's key-split plan (kernels/sm90/prefill_split_plan.h) against its rules read directly:
// ranges partition the key tiles in order, every split but the last stays below the splittable tiles, and the
// split count keeps the launch in one wave only where the CTAs fill less than half the SMs.
#include <gtest/gtest.h>

#include <random>

#include "kernels/sm90/prefill_split_plan.h"

namespace {

namespace ps = lowbit::cuda::prefill_split;

TEST(PrefillSplitPlan, RangesPartitionTheTilesInOrder) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 5000; ++trial) {
    const int tiles = std::uniform_int_distribution<int>(1, 400)(rng);
    const int splittable = std::uniform_int_distribution<int>(0, tiles - 1)(rng);
    const int splits = std::uniform_int_distribution<int>(1, ps::kMaxSplits)(rng);
    int at = 0;
    for (int s = 0; s < splits; ++s) {
      int b = -1, e = -1;
      ps::split_range(tiles, splittable, splits, s, b, e);
      ASSERT_EQ(b, at) << tiles << " " << splittable << " " << splits << " " << s;
      ASSERT_LE(b, e);
      if (s + 1 < splits) {
        ASSERT_LE(e, splittable);  // no masked key before the last split
        ASSERT_LE(e - b, (tiles + splits - 1) / splits);  // near even
      } else {
        ASSERT_EQ(e, tiles);
        ASSERT_LE(b, splittable);
      }
      at = e;
    }
  }
}

// The tail split (per-channel K with the dequantized copy): the head splits partition [0, splittable) near evenly,
// the last split is exactly [splittable, tiles), whatever the split count.
TEST(PrefillSplitPlan, TailRangesCutAtTheSplittableTiles) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5000; ++trial) {
    const int tiles = std::uniform_int_distribution<int>(1, 400)(rng);
    const int splittable = std::uniform_int_distribution<int>(0, tiles - 1)(rng);
    const int splits = std::uniform_int_distribution<int>(2, ps::kMaxSplits)(rng);
    int at = 0;
    for (int s = 0; s < splits; ++s) {
      int b = -1, e = -1;
      ps::tail_split_range(tiles, splittable, splits, s, b, e);
      ASSERT_EQ(b, at) << tiles << " " << splittable << " " << splits << " " << s;
      ASSERT_LE(b, e);
      if (s + 1 < splits) {
        ASSERT_LE(e, splittable);
        ASSERT_LE(e - b, (splittable + splits - 2) / (splits - 1));  // near even over the head splits
      } else {
        ASSERT_EQ(b, splittable);
        ASSERT_EQ(e, tiles);
      }
      at = e;
    }
  }
}

TEST(PrefillSplitPlan, SplitsOnlyShortLaunchesOverLongPrefixes) {
  EXPECT_EQ(ps::plan_splits(32, 132, 32768), 4);   // 1 x 64 tokens, 32 heads: 128 CTAs
  EXPECT_EQ(ps::plan_splits(64, 132, 32768), 2);   // 1 x 256
  EXPECT_EQ(ps::plan_splits(16, 132, 8192), 8);    // packed 1 x 64 over 8K
  EXPECT_EQ(ps::plan_splits(256, 132, 32768), 1);  // 1 x 1024: two waves already
  EXPECT_EQ(ps::plan_splits(67, 132, 32768), 1);   // more than half the SMs
  EXPECT_EQ(ps::plan_splits(32, 132, 100), 1);     // a fresh prompt (no prefix to split)
  EXPECT_EQ(ps::plan_splits(32, 132, 4 * 128 * 2), 2);  // two splits of kMinTilesPerSplit tiles
  EXPECT_EQ(ps::plan_splits(1, 132, 1 << 20), ps::kMaxSplits);
  EXPECT_EQ(ps::plan_splits(256, 132, 32768, 3), 3);  // forced
  EXPECT_EQ(ps::plan_splits(256, 132, 32768, 99), ps::kMaxSplits);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int sms = std::uniform_int_distribution<int>(1, 200)(rng);
    const int64_t ctas = std::uniform_int_distribution<int>(1, 400)(rng);
    const int64_t prefix = std::uniform_int_distribution<int>(0, 1 << 17)(rng);
    const int s = ps::plan_splits(ctas, sms, prefix);
    ASSERT_GE(s, 1);
    ASSERT_LE(s, ps::kMaxSplits);
    if (s > 1) {
      ASSERT_LE(2 * ctas, sms);
      ASSERT_LE(s * ctas, sms);  // one wave
      ASSERT_LE(s * ps::kMinTilesPerSplit * ps::kKeyTile, prefix);
    }
  }
}

}  // namespace
