// KWindowSlots: which GPU window slot each per-channel K block uses (the host side of the f16 window): a block
// gets a slot when a step first writes into it, keeps it through the step that seals it, gives it back at the
// next prepare; slots of blocks no sequence holds are taken back when the pool runs dry; forks get their own.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/kv/k_window_slots.h"

using namespace lowbit;

namespace {

constexpr int kBlock = 4;
const auto kAllLive = [](int32_t) { return true; };

void prepare(KWindowSlots& w, std::vector<int32_t> slots, const std::function<bool(int32_t)>& live = kAllLive) {
  w.prepare(slots.data(), int64_t(slots.size()), kBlock, live);
}

TEST(KWindowSlots, BlocksGetDistinctSlotsAndSealedOnesReturnThemNextStep) {
  KWindowSlots w(10, 3);
  prepare(w, {0, 1, 2, 3, 4, 5, -1, 9 * kBlock + 1});  // block 0 filled (sealed), block 1 partly, block 9 partly
  const std::vector<int32_t>& map = w.map();
  EXPECT_GE(map[0], 0);
  EXPECT_GE(map[1], 0);
  EXPECT_GE(map[9], 0);
  EXPECT_EQ(std::set<int32_t>({map[0], map[1], map[9]}).size(), 3u);
  EXPECT_EQ(map[2], -1);
  EXPECT_EQ(w.slots_in_use(), 3);
  const auto changed = w.take_changed();
  EXPECT_EQ(changed.first, 0);
  EXPECT_EQ(changed.second, 10);
  EXPECT_EQ(w.take_changed().first, w.take_changed().second);  // nothing since
  const int32_t slot1 = map[1];
  prepare(w, {6});  // block 0's slot comes back; block 1 keeps its slot
  EXPECT_EQ(map[0], -1);
  EXPECT_EQ(map[1], slot1);
  EXPECT_EQ(w.slots_in_use(), 2);
}

TEST(KWindowSlots, DeadBlocksAreReclaimedOnlyWhenThePoolRunsDry) {
  KWindowSlots w(10, 2);
  prepare(w, {1, 5});  // blocks 0 and 1 partly filled
  EXPECT_EQ(w.slots_in_use(), 2);
  // Block 0's sequence finished: its slot is taken back for block 2; block 1 (live) keeps its own.
  prepare(w, {2 * kBlock}, [](int32_t b) { return b != 0; });
  EXPECT_EQ(w.map()[0], -1);
  EXPECT_GE(w.map()[1], 0);
  EXPECT_GE(w.map()[2], 0);
  // Every slot held by a live block: a named error, nothing changed.
  try {
    prepare(w, {3 * kBlock});
    FAIL() << "a third live block got a slot from a pool of 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all 2 per-channel K window slots are held by live blocks"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(w.map()[3], -1);
}

TEST(KWindowSlots, ForkGetsItsOwnSlotAndAForkOfNoWindowDropsOne) {
  KWindowSlots w(10, 4);
  prepare(w, {1});
  const auto [src, dst] = w.copy(0, 7);
  EXPECT_EQ(src, w.map()[0]);
  EXPECT_EQ(dst, w.map()[7]);
  EXPECT_NE(src, dst);
  const auto none = w.copy(3, 7);  // block 3 has no window: 7's is dropped
  EXPECT_EQ(none.first, -1);
  EXPECT_EQ(w.map()[7], -1);
  EXPECT_EQ(w.slots_in_use(), 1);
}

TEST(KWindowSlots, SlotPastTheCacheIsAnIndexError) {
  KWindowSlots w(2, 2);
  try {
    prepare(w, {2 * kBlock});
    FAIL() << "slot past the cache accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIndex);
  }
}

}  // namespace
