// BlockAllocator: block tables, fork with shared prefixes, copy-on-write, pool exhaustion, errors,
// and a randomized stress test that tracks what every slot should hold.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "lowbit/kv/kv_cache.h"

using namespace lowbit;

namespace {

template <typename F>
std::string error_of(F&& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(KvAllocator, AppendGrowsBlockTableAndSlots) {
  BlockAllocator a(8, 4);
  const SeqId s = a.create_sequence();
  EXPECT_EQ(a.blocks_needed(s, 5), 2);
  ASSERT_TRUE(a.append_tokens(s, 5));
  EXPECT_EQ(a.block_table(s), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(a.num_tokens(s), 5);
  EXPECT_EQ(a.slot_of(s, 4), 1 * 4 + 0);
  EXPECT_EQ(a.blocks_needed(s, 3), 0);  // fits in the partially filled block 1
  ASSERT_TRUE(a.append_tokens(s, 3));
  EXPECT_EQ(a.num_free_blocks(), 6);
  EXPECT_EQ(a.blocks_needed(s, 1), 1);
  a.check_invariants();
  a.free_sequence(s);
  EXPECT_EQ(a.num_free_blocks(), 8);
  EXPECT_FALSE(a.has_sequence(s));
  a.check_invariants();
}

TEST(KvAllocator, ForkSharesBlocksAndCopiesPartialLastBlockOnWrite) {
  BlockAllocator a(8, 4);
  const SeqId p = a.create_sequence();
  ASSERT_TRUE(a.append_tokens(p, 6));  // blocks 0 (full) and 1 (2 of 4)
  const SeqId c = a.fork(p);
  EXPECT_EQ(a.block_table(c), a.block_table(p));
  EXPECT_EQ(a.ref_count(0), 2);
  EXPECT_EQ(a.ref_count(1), 2);
  EXPECT_EQ(a.num_free_blocks(), 6);
  EXPECT_EQ(a.blocks_needed(c, 1), 1);  // private copy of block 1
  std::vector<std::pair<int32_t, int32_t>> copies;
  ASSERT_TRUE(a.append_tokens(c, 1, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, 1);
  EXPECT_EQ(a.block_table(c)[1], copies[0].second);
  EXPECT_NE(copies[0].second, 1);
  EXPECT_EQ(a.block_table(c)[0], 0);  // the full prefix block stays shared
  EXPECT_EQ(a.ref_count(0), 2);
  EXPECT_EQ(a.ref_count(1), 1);
  // The parent now owns block 1 alone: appending needs no copy.
  copies.clear();
  ASSERT_TRUE(a.append_tokens(p, 2, &copies));
  EXPECT_TRUE(copies.empty());
  a.check_invariants();
  a.free_sequence(p);
  a.free_sequence(c);
  EXPECT_EQ(a.num_free_blocks(), 8);
  a.check_invariants();
}

TEST(KvAllocator, ForkOfFullLastBlockNeedsNoCopy) {
  BlockAllocator a(4, 4);
  const SeqId p = a.create_sequence();
  ASSERT_TRUE(a.append_tokens(p, 4));
  const SeqId c = a.fork(p);
  std::vector<std::pair<int32_t, int32_t>> copies;
  EXPECT_EQ(a.blocks_needed(c, 1), 1);
  ASSERT_TRUE(a.append_tokens(c, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(a.ref_count(0), 2);
  a.check_invariants();
}

TEST(KvAllocator, OutOfBlocksReturnsFalseAndChangesNothing) {
  BlockAllocator a(3, 4);
  const SeqId s = a.create_sequence();
  ASSERT_TRUE(a.append_tokens(s, 10));
  const SeqId t = a.fork(s);  // shares a partial last block: the copy needs one more block than is free
  EXPECT_FALSE(a.can_append(t, 3));
  std::vector<std::pair<int32_t, int32_t>> copies;
  EXPECT_FALSE(a.append_tokens(t, 3, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(a.num_tokens(t), 10);
  EXPECT_EQ(a.num_free_blocks(), 0);
  EXPECT_EQ(a.block_table(t), a.block_table(s));
  a.check_invariants();
  EXPECT_TRUE(a.append_tokens(t, 0));  // nothing to reserve
}

TEST(KvAllocator, BadArgumentsNameTheProblem) {
  BlockAllocator a(4, 16);
  ErrorKind kind{};
  EXPECT_NE(error_of([&] { a.append_tokens(42, 1); }, &kind).find("unknown sequence id 42"), std::string::npos);
  EXPECT_EQ(kind, ErrorKind::kIndex);
  EXPECT_NE(error_of([&] { a.free_sequence(7); }).find("unknown sequence id 7"), std::string::npos);
  EXPECT_NE(error_of([&] { a.fork(9); }).find("unknown sequence id 9"), std::string::npos);
  EXPECT_NE(error_of([&] { a.block_table(-3); }).find("unknown sequence id -3"), std::string::npos);
  const SeqId s = a.create_sequence();
  EXPECT_NE(error_of([&] { a.append_tokens(s, -2); }).find("must be >= 0, got -2"), std::string::npos);
  ASSERT_TRUE(a.append_tokens(s, 3));
  EXPECT_NE(error_of([&] { a.slot_of(s, 3); }, &kind).find("token index 3 out of range"), std::string::npos);
  EXPECT_EQ(kind, ErrorKind::kIndex);
  EXPECT_NE(error_of([&] { a.ref_count(4); }).find("block 4 out of range"), std::string::npos);
  a.free_sequence(s);
  EXPECT_NE(error_of([&] { a.free_sequence(s); }).find("unknown sequence id"), std::string::npos);  // no double free
  EXPECT_NE(error_of([] { BlockAllocator(0, 16); }).find("'num_blocks'"), std::string::npos);
  EXPECT_NE(error_of([] { BlockAllocator(4, 0); }).find("'block_size'"), std::string::npos);
}

// Random create/append/fork/free. A shadow "cache" of slot contents checks that copy-on-write keeps
// every sequence's tokens intact: each append writes fresh values into the new tokens' slots after
// performing the reported copies, and every live sequence must still read back exactly its history.
TEST(KvAllocator, RandomizedStressKeepsContentsAndFreesEverything) {
  for (int block_size : {1, 3, 4, 16}) {
    std::mt19937 rng(1234 + block_size);
    const int64_t num_blocks = 48;
    BlockAllocator a(num_blocks, block_size);
    std::vector<int64_t> slots(static_cast<size_t>(num_blocks * block_size), -1);
    std::map<SeqId, std::vector<int64_t>> expected;
    int64_t next_value = 0, appends_ok = 0, appends_refused = 0, forks = 0, copies_seen = 0;
    for (int step = 0; step < 4000; ++step) {
      const int op = static_cast<int>(rng() % 10);
      auto pick = [&]() {
        auto it = expected.begin();
        std::advance(it, static_cast<long>(rng() % expected.size()));
        return it->first;
      };
      if (expected.empty() || op == 0) {
        expected[a.create_sequence()] = {};
      } else if (op <= 5) {
        const SeqId s = pick();
        const int64_t n = static_cast<int64_t>(rng() % (3 * block_size + 2));
        const int64_t free_before = a.num_free_blocks();
        const int64_t need = a.blocks_needed(s, n);
        std::vector<std::pair<int32_t, int32_t>> copies;
        if (a.append_tokens(s, n, &copies)) {
          ++appends_ok;
          EXPECT_EQ(a.num_free_blocks(), free_before - need);
          copies_seen += static_cast<int64_t>(copies.size());
          for (auto [src, dst] : copies)
            std::copy_n(slots.begin() + src * block_size, block_size, slots.begin() + dst * block_size);
          auto& hist = expected[s];
          for (int64_t i = 0; i < n; ++i) {
            const int64_t idx = static_cast<int64_t>(hist.size());
            slots[static_cast<size_t>(a.slot_of(s, idx))] = next_value;
            hist.push_back(next_value++);
          }
        } else {
          ++appends_refused;
          EXPECT_GT(need, free_before);
          EXPECT_EQ(a.num_free_blocks(), free_before);
          EXPECT_TRUE(copies.empty());
        }
      } else if (op <= 7) {
        const SeqId p = pick();
        const SeqId c = a.fork(p);
        expected[c] = expected[p];
        ++forks;
      } else {
        const SeqId s = pick();
        a.free_sequence(s);
        expected.erase(s);
      }
      a.check_invariants();
      for (const auto& [s, hist] : expected) {
        ASSERT_EQ(a.num_tokens(s), static_cast<int64_t>(hist.size()));
        for (size_t i = 0; i < hist.size(); ++i)
          ASSERT_EQ(slots[static_cast<size_t>(a.slot_of(s, static_cast<int64_t>(i)))], hist[i])
              << "block_size " << block_size << " step " << step << " seq " << s << " token " << i;
      }
    }
    // The run must have exercised every path.
    EXPECT_GT(appends_ok, 100);
    EXPECT_GT(appends_refused, 10);
    EXPECT_GT(forks, 100);
    if (block_size > 1) EXPECT_GT(copies_seen, 10);
    for (const auto& [s, hist] : expected) a.free_sequence(s);
    EXPECT_EQ(a.num_free_blocks(), num_blocks);
    EXPECT_EQ(a.num_sequences(), 0);
    a.check_invariants();
  }
}
