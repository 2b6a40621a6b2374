// Scheduler policy without a model: token budget and chunked prefill, decodes first, max_seqs,
// waiting on KV, reclaim before preemption, newest-first preemption and recompute, prefix caching
// (admission after the cached prefix, preempted sequences finding their own blocks).
#include <gtest/gtest.h>

#include "lowbit/engine/scheduler.h"

namespace lowbit {
namespace {

std::unique_ptr<Sequence> make_seq(int64_t id, int prompt_len) {
  auto s = std::make_unique<Sequence>();
  s->request_id = id;
  s->tokens.assign(size_t(prompt_len), 1);
  s->prompt_len = prompt_len;
  return s;
}

// What the engine does after a forward: mark the chunk computed (registering its full blocks with
// the prefix cache), append a sampled token.
void complete(const std::vector<ScheduledChunk>& chunks, BlockAllocator* alloc = nullptr) {
  for (const auto& c : chunks) {
    ASSERT_EQ(c.start, c.seq->num_computed);
    c.seq->num_computed += c.len;
    if (alloc) alloc->cache_computed_blocks(c.seq->kv, c.seq->tokens, c.seq->num_computed);
    if (c.sample) c.seq->tokens.push_back(2);
  }
}

std::unique_ptr<Sequence> make_seq(int64_t id, const std::vector<int32_t>& tokens) {
  auto s = std::make_unique<Sequence>();
  s->request_id = id;
  s->tokens = tokens;
  s->prompt_len = int64_t(tokens.size());
  return s;
}

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + i;
  return t;
}

int64_t total_tokens(const std::vector<ScheduledChunk>& chunks) {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.len;
  return n;
}

TEST(Scheduler, ChunkedPrefillWithinBudget) {
  BlockAllocator alloc(100, 4);
  Scheduler s(alloc, 8, 4, nullptr);
  s.add(make_seq(1, 20));
  for (int step = 0; step < 2; ++step) {
    auto c = s.schedule();
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].start, 8 * step);
    EXPECT_EQ(c[0].len, 8);
    EXPECT_FALSE(c[0].sample);
    complete(c);
  }
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].len, 4);
  EXPECT_TRUE(c[0].sample);
  EXPECT_EQ(alloc.num_tokens(c[0].seq->kv), 20);
  complete(c);
  c = s.schedule();  // decode
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].start, 20);
  EXPECT_EQ(c[0].len, 1);
  EXPECT_TRUE(c[0].sample);
}

TEST(Scheduler, DecodesFirstThenPrefillsAndMaxSeqs) {
  BlockAllocator alloc(100, 4);
  Scheduler s(alloc, 6, 2, nullptr);
  s.add(make_seq(1, 3));
  complete(s.schedule());  // seq 1 prefilled and sampled: now decoding
  s.add(make_seq(2, 10));
  s.add(make_seq(3, 2));
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].seq->request_id, 1);  // the decode comes first
  EXPECT_EQ(c[0].len, 1);
  EXPECT_EQ(c[1].seq->request_id, 2);  // the prefill gets the rest of the budget
  EXPECT_EQ(c[1].len, 5);
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.num_waiting(), 1);  // max_seqs = 2 keeps seq 3 waiting
  complete(c);
  c = s.schedule();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].seq->request_id, 2);
  EXPECT_EQ(c[1].len, 5);
  EXPECT_LE(total_tokens(c), 6);
}

TEST(Scheduler, WaitsForBlocksAndReclaimsBeforePreempting) {
  BlockAllocator alloc(4, 4);
  const SeqId idle = alloc.create_sequence();
  ASSERT_TRUE(alloc.append_tokens(idle, 8));  // 2 blocks held by an "idle session"
  int reclaims = 0;
  Scheduler s(alloc, 64, 4, [&] {
    if (!alloc.has_sequence(idle)) return false;
    alloc.free_sequence(idle);
    ++reclaims;
    return true;
  });
  s.add(make_seq(1, 12));  // needs 3 blocks: only fits after the reclaim
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(reclaims, 1);
  EXPECT_EQ(s.num_preemptions(), 0);
  complete(c);
  s.add(make_seq(2, 8));  // needs 2 blocks, 1 free: waits
  c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq->request_id, 1);
  EXPECT_EQ(s.num_waiting(), 1);
  alloc.check_invariants();
}

TEST(Scheduler, PreemptsNewestAndRecomputes) {
  BlockAllocator alloc(4, 4);
  Scheduler s(alloc, 64, 4, nullptr);
  s.add(make_seq(1, 4));
  s.add(make_seq(2, 4));
  complete(s.schedule());  // both prefilled: 2 blocks used, both decode next
  for (int i = 0; i < 4; ++i) complete(s.schedule());  // each now holds 8 tokens' worth: pool full
  EXPECT_EQ(alloc.num_free_blocks(), 0);
  Sequence* newest = s.find(2);
  const auto tokens_before = newest->tokens;
  auto c = s.schedule();  // seq 1 needs a block: seq 2 (newest) is preempted
  EXPECT_EQ(s.num_preemptions(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq->request_id, 1);
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(newest->kv, -1);
  EXPECT_EQ(newest->num_computed, 0);
  EXPECT_EQ(newest->tokens, tokens_before);  // prompt + generated kept for recompute
  complete(c);
  alloc.check_invariants();
  // seq 1 finishes: seq 2 is re-admitted and recomputes everything in one chunk.
  auto done = s.remove(1);
  alloc.free_sequence(done->kv);
  c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq->request_id, 2);
  EXPECT_EQ(c[0].start, 0);
  EXPECT_EQ(c[0].len, int64_t(tokens_before.size()));
  EXPECT_TRUE(c[0].sample);
}

TEST(Scheduler, AdmissionStartsAfterTheCachedPrefix) {
  BlockAllocator alloc(32, 4, true, 7);
  Scheduler s(alloc, 64, 4, nullptr);
  const auto prefix = iota_tokens(12, 10);  // 3 full blocks
  s.add(make_seq(1, prefix));
  complete(s.schedule(), &alloc);
  EXPECT_EQ(alloc.prefix_cache_stats().hit_tokens, 0);
  auto longer = prefix;
  longer.insert(longer.end(), {1, 2, 3});
  s.add(make_seq(2, longer));  // 3 cached blocks + 3 new tokens
  s.add(make_seq(3, prefix));  // fully cached: the last block is computed anyway (its logits)
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 3u);  // request 1 decodes, 2 and 3 are admitted
  EXPECT_EQ(c[1].seq->request_id, 2);
  EXPECT_EQ(c[1].start, 12);
  EXPECT_EQ(c[1].len, 3);
  EXPECT_TRUE(c[1].sample);
  EXPECT_EQ(c[2].seq->request_id, 3);
  EXPECT_EQ(c[2].start, 8);
  EXPECT_EQ(c[2].len, 4);
  // Shared blocks: the same physical prefix in all three tables.
  const auto& t1 = alloc.block_table(c[0].seq->kv);
  EXPECT_EQ(std::vector<int32_t>(t1.begin(), t1.begin() + 3),
            std::vector<int32_t>(alloc.block_table(c[1].seq->kv).begin(), alloc.block_table(c[1].seq->kv).begin() + 3));
  EXPECT_EQ(alloc.block_table(c[2].seq->kv)[1], t1[1]);
  EXPECT_NE(alloc.block_table(c[2].seq->kv)[2], t1[2]);  // recomputed into a private block
  EXPECT_EQ(alloc.ref_count(t1[0]), 3);
  EXPECT_EQ(alloc.prefix_cache_stats().hit_tokens, 12 + 8);
  EXPECT_EQ(alloc.prefix_cache_stats().query_tokens, 12 + 15 + 12);
  alloc.check_invariants();
}

TEST(Scheduler, PreemptedSequenceRecomputesOnlyWhatWasEvicted) {
  BlockAllocator alloc(4, 4, true, 7);
  Scheduler s(alloc, 64, 4, nullptr);
  s.add(make_seq(1, iota_tokens(4, 0)));
  s.add(make_seq(2, iota_tokens(4, 50)));
  complete(s.schedule(), &alloc);
  for (int i = 0; i < 4; ++i) complete(s.schedule(), &alloc);  // each holds 8 tokens' worth: pool full
  EXPECT_EQ(alloc.num_free_blocks(), 0);
  Sequence* newest = s.find(2);
  const auto tokens_before = newest->tokens;  // 9 tokens: two full, computed, cached blocks + 1
  auto c = s.schedule();                      // seq 1 needs a block: seq 2 is preempted
  EXPECT_EQ(s.num_preemptions(), 1);
  ASSERT_EQ(c.size(), 1u);
  // Seq 2's blocks stayed cached; seq 1's new block evicted the least recently released one (the tail).
  EXPECT_EQ(alloc.prefix_cache_stats().evictions, 1);
  complete(c, &alloc);
  alloc.check_invariants();
  auto done = s.remove(1);
  alloc.free_sequence(done->kv);
  c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq->request_id, 2);
  EXPECT_EQ(c[0].start, 4);  // its first block was still cached
  EXPECT_EQ(c[0].len, int64_t(tokens_before.size()) - 4);
  EXPECT_TRUE(c[0].sample);
  alloc.check_invariants();
}

TEST(Scheduler, AdoptingUnreferencedCachedBlocksCountsAgainstTheFreePool) {
  // 3 blocks: a cached 2-block prefix nobody holds plus one free block. A request on that prefix
  // needs its 2 cached blocks and 1 new one: it fits exactly, and a second one must wait.
  BlockAllocator alloc(3, 4, true, 7);
  Scheduler s(alloc, 64, 4, nullptr);
  s.add(make_seq(1, iota_tokens(9, 0)));
  complete(s.schedule(), &alloc);
  auto first = s.remove(1);
  alloc.free_sequence(first->kv);
  EXPECT_EQ(alloc.num_free_blocks(), 3);
  s.add(make_seq(2, iota_tokens(10, 0)));
  s.add(make_seq(3, iota_tokens(5, 70)));  // needs 2 fresh blocks: only after request 2 ends
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].start, 8);
  EXPECT_EQ(alloc.num_free_blocks(), 0);
  EXPECT_EQ(s.num_waiting(), 1);
  alloc.check_invariants();
}

TEST(Scheduler, BadLimits) {
  BlockAllocator alloc(4, 4);
  EXPECT_THROW(Scheduler(alloc, 0, 4, nullptr), Error);
  EXPECT_THROW(Scheduler(alloc, 8, 0, nullptr), Error);
}

}  // namespace
}  // namespace lowbit
