// Prefix caching in the BlockAllocator: chained block keys, hits and misses, reference counts shared
// with forks (copy-on-write), LRU eviction order under pressure, errors, and a randomized stress test
// whose shadow KV checks that an adopted block really holds the K/V of the adopting prompt.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "lowbit/kv/block_hash.h"
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

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + i;
  return t;
}

// What the engine does for a request: adopt the cached prefix, reserve the rest, "compute" it and
// register the full blocks. Returns the tokens that came from the cache.
int64_t admit_and_compute(BlockAllocator& a, SeqId s, const std::vector<int32_t>& tokens) {
  const PrefixMatch m = a.match_prefix(tokens);
  const int64_t hit = a.adopt_prefix(s, tokens, m);
  EXPECT_TRUE(a.append_tokens(s, int64_t(tokens.size()) - hit));
  a.cache_computed_blocks(s, tokens, int64_t(tokens.size()));
  return hit;
}

}  // namespace

TEST(KvPrefixCache, BlockKeysChainThroughTheParent) {
  const auto t = iota_tokens(8, 5);
  const uint64_t root = hash_string(0, "model");
  const uint64_t k0 = hash_block(root, t.data(), 4);
  EXPECT_EQ(k0, hash_block(root, t.data(), 4));  // deterministic
  const uint64_t k1 = hash_block(k0, t.data() + 4, 4);
  EXPECT_NE(k1, hash_block(root, t.data() + 4, 4));  // same tokens, other parent (position / prefix)
  EXPECT_NE(k0, hash_block(hash_string(0, "model kv4"), t.data(), 4));  // other root (e.g. K/V format)
  std::vector<int32_t> swapped = {t[1], t[0], t[2], t[3]};
  EXPECT_NE(k0, hash_block(root, swapped.data(), 4));  // order matters
  EXPECT_NE(k0, hash_block(root, t.data(), 3));        // length matters
  EXPECT_NE(hash_combine(hash_combine(1, 2), 3), hash_combine(hash_combine(1, 3), 2));
  EXPECT_NE(hash_string(hash_string(0, "ab"), "c"), hash_string(hash_string(0, "a"), "bc"));
}

TEST(KvPrefixCache, HitsOnlyComputedFullBlocksOfTheSameChain) {
  BlockAllocator a(16, 4, true, 77);
  const auto prompt = iota_tokens(10, 100);  // blocks [100..103] [104..107] and 2 tokens
  const SeqId s = a.create_sequence();
  ASSERT_TRUE(a.append_tokens(s, 10));
  a.cache_computed_blocks(s, prompt, 5);  // only block 0 is full and computed
  EXPECT_TRUE(a.is_cached(a.block_table(s)[0]));
  EXPECT_FALSE(a.is_cached(a.block_table(s)[1]));
  a.cache_computed_blocks(s, prompt, 10);
  EXPECT_TRUE(a.is_cached(a.block_table(s)[1]));
  EXPECT_FALSE(a.is_cached(a.block_table(s)[2]));  // partial blocks are never cached
  EXPECT_EQ(a.prefix_cache_stats().cached_blocks, 2);

  // Same first 8 tokens, other tail: both full blocks hit, the same physical blocks.
  auto other = prompt;
  other[9] = 1;
  other.push_back(2);
  PrefixMatch m = a.match_prefix(other);
  ASSERT_EQ(m.blocks.size(), 2u);
  EXPECT_EQ(m.blocks[0], a.block_table(s)[0]);
  EXPECT_EQ(m.blocks[1], a.block_table(s)[1]);
  EXPECT_EQ(m.num_evictable, 0);  // s still holds them

  // A different token in block 1 stops the chain after block 0; one in block 0 misses entirely.
  auto b1 = prompt;
  b1[6] = 9;
  EXPECT_EQ(a.match_prefix(b1).blocks.size(), 1u);
  auto b0 = prompt;
  b0[0] = 9;
  EXPECT_TRUE(a.match_prefix(b0).blocks.empty());
  // Same tokens shifted by one position: no hit (the key covers every token before the block).
  std::vector<int32_t> shifted = {7};
  shifted.insert(shifted.end(), prompt.begin(), prompt.end());
  EXPECT_TRUE(a.match_prefix(shifted).blocks.empty());
  // Exactly 8 tokens: the last one must be computed, so only block 0 may hit.
  EXPECT_EQ(a.match_prefix(iota_tokens(8, 100)).blocks.size(), 1u);
  EXPECT_EQ(a.match_prefix(iota_tokens(9, 100)).blocks.size(), 2u);
  EXPECT_TRUE(a.match_prefix(iota_tokens(4, 100)).blocks.empty());
  // Another root key (another model / recipe / K/V format) shares nothing.
  BlockAllocator other_root(16, 4, true, 78);
  const SeqId o = other_root.create_sequence();
  admit_and_compute(other_root, o, prompt);
  EXPECT_EQ(other_root.match_prefix(other).blocks.size(), 2u);
  EXPECT_TRUE(a.match_prefix(iota_tokens(12, 50)).blocks.empty());

  const SeqId t = a.create_sequence();
  EXPECT_EQ(a.adopt_prefix(t, other, m), 8);
  EXPECT_EQ(a.num_tokens(t), 8);
  EXPECT_EQ(a.ref_count(m.blocks[0]), 2);
  EXPECT_EQ(a.ref_count(m.blocks[1]), 2);
  const PrefixCacheStats st = a.prefix_cache_stats();
  EXPECT_EQ(st.query_tokens, 11);
  EXPECT_EQ(st.hit_tokens, 8);
  ASSERT_TRUE(a.append_tokens(t, 3));  // the tail goes into a new block, never into a cached one
  EXPECT_NE(a.block_table(t)[2], a.block_table(s)[2]);
  a.check_invariants();
}

TEST(KvPrefixCache, ReleasedCachedBlocksStayFreeAndAreTakenBackByAHit) {
  BlockAllocator a(8, 4, true, 1);
  const auto prompt = iota_tokens(9, 0);
  const SeqId s = a.create_sequence();
  EXPECT_EQ(admit_and_compute(a, s, prompt), 0);  // a miss
  const std::vector<int32_t> table = a.block_table(s);
  a.free_sequence(s);
  // Nothing references the blocks: all free again, the two full ones still cached.
  EXPECT_EQ(a.num_free_blocks(), 8);
  EXPECT_EQ(a.ref_count(table[0]), 0);
  EXPECT_TRUE(a.is_cached(table[0]));
  EXPECT_TRUE(a.is_cached(table[1]));
  EXPECT_FALSE(a.is_cached(table[2]));
  EXPECT_EQ(a.prefix_cache_stats().evictable_blocks, 2);
  a.check_invariants();

  const SeqId t = a.create_sequence();
  const PrefixMatch m = a.match_prefix(prompt);
  EXPECT_EQ(m.num_evictable, 2);
  EXPECT_EQ(a.adopt_prefix(t, prompt, m), 8);
  EXPECT_EQ(a.num_free_blocks(), 6);  // adopting took them out of the free pool
  EXPECT_EQ(a.ref_count(table[0]), 1);
  EXPECT_EQ(a.prefix_cache_stats().evictable_blocks, 0);
  EXPECT_EQ(a.prefix_cache_stats().evictions, 0);
  a.check_invariants();
  a.free_sequence(t);
  EXPECT_EQ(a.num_free_blocks(), 8);
  a.check_invariants();
}

TEST(KvPrefixCache, EvictsNeverCachedBlocksFirstThenLeastRecentlyReleasedTailsFirst) {
  BlockAllocator a(6, 2, true, 3);
  const auto px = iota_tokens(5, 10);  // 2 full blocks + 1 token
  const auto py = iota_tokens(5, 20);
  const SeqId x = a.create_sequence();
  admit_and_compute(a, x, px);
  const SeqId y = a.create_sequence();
  admit_and_compute(a, y, py);
  const auto tx = a.block_table(x), ty = a.block_table(y);
  a.free_sequence(x);  // released first: least recently used
  a.free_sequence(y);
  EXPECT_EQ(a.prefix_cache_stats().cached_blocks, 4);
  EXPECT_EQ(a.num_free_blocks(), 6);

  // The two never-cached blocks (the partial tails) go first: no eviction.
  const SeqId z = a.create_sequence();
  ASSERT_TRUE(a.append_tokens(z, 4));
  EXPECT_EQ(a.prefix_cache_stats().evictions, 0);
  EXPECT_EQ(a.match_prefix(px).blocks.size(), 2u);
  // Then x's blocks, tail before head; y is untouched.
  ASSERT_TRUE(a.append_tokens(z, 2));
  EXPECT_EQ(a.prefix_cache_stats().evictions, 1);
  EXPECT_EQ(a.block_table(z).back(), tx[1]);
  EXPECT_EQ(a.match_prefix(px).blocks, std::vector<int32_t>{tx[0]});
  EXPECT_EQ(a.match_prefix(py).blocks.size(), 2u);
  ASSERT_TRUE(a.append_tokens(z, 2));
  EXPECT_EQ(a.block_table(z).back(), tx[0]);
  EXPECT_TRUE(a.match_prefix(px).blocks.empty());
  EXPECT_EQ(a.match_prefix(py).blocks.size(), 2u);
  EXPECT_FALSE(a.is_cached(tx[0]));
  EXPECT_EQ(a.prefix_cache_stats().evictions, 2);
  EXPECT_EQ(a.prefix_cache_stats().cached_blocks, 2);
  EXPECT_EQ(a.num_free_blocks(), 2);
  // The pool is short by one block now: a refused append changes nothing and evicts nothing.
  EXPECT_FALSE(a.append_tokens(z, 6));
  EXPECT_EQ(a.prefix_cache_stats().evictions, 2);
  a.check_invariants();

  // A hit refreshes y's head: re-adopted and released again, it becomes the most recent, so the
  // next eviction takes y's tail (released earlier).
  const SeqId w = a.create_sequence();
  auto head_only = iota_tokens(3, 20);
  const PrefixMatch m = a.match_prefix(head_only);
  ASSERT_EQ(m.blocks, std::vector<int32_t>{ty[0]});
  a.adopt_prefix(w, head_only, m);
  a.free_sequence(w);
  ASSERT_TRUE(a.append_tokens(z, 2));
  EXPECT_EQ(a.block_table(z).back(), ty[1]);
  EXPECT_EQ(a.match_prefix(py).blocks, std::vector<int32_t>{ty[0]});
  a.check_invariants();
  a.free_sequence(z);
  EXPECT_EQ(a.num_free_blocks(), 6);
  a.check_invariants();
}

TEST(KvPrefixCache, ForkSharesCachedBlocksAndCopiesOnlyThePartialOne) {
  BlockAllocator a(16, 4, true, 5);
  auto prompt = iota_tokens(6, 40);  // block 0 full, block 1 holds 2 tokens
  const SeqId p = a.create_sequence();
  admit_and_compute(a, p, prompt);
  const SeqId c = a.fork(p);
  const auto tp = a.block_table(p);
  EXPECT_EQ(a.ref_count(tp[0]), 2);  // one reference count for the fork and the cache alike
  EXPECT_TRUE(a.is_cached(tp[0]));
  // The child writes into the shared partial block: a private copy, the cached block stays shared.
  std::vector<std::pair<int32_t, int32_t>> copies;
  ASSERT_TRUE(a.append_tokens(c, 2, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, tp[1]);
  EXPECT_EQ(a.block_table(c)[0], tp[0]);
  auto child_tokens = prompt;
  child_tokens.insert(child_tokens.end(), {1, 2});
  a.cache_computed_blocks(c, child_tokens, 8);  // the child's copy of block 1 is now full
  auto parent_tokens = prompt;
  parent_tokens.insert(parent_tokens.end(), {3, 4});
  ASSERT_TRUE(a.append_tokens(p, 2, &copies));
  EXPECT_EQ(copies.size(), 1u);  // the parent now holds the original alone: no second copy
  a.cache_computed_blocks(p, parent_tokens, 8);
  a.check_invariants();
  // Each branch's block 1 is cached under its own tokens, block 0 once for both.
  auto probe_child = child_tokens, probe_parent = parent_tokens;
  probe_child.push_back(0);
  probe_parent.push_back(0);
  EXPECT_EQ(a.match_prefix(probe_child).blocks, (std::vector<int32_t>{tp[0], a.block_table(c)[1]}));
  EXPECT_EQ(a.match_prefix(probe_parent).blocks, (std::vector<int32_t>{tp[0], tp[1]}));
  // A fork of a sequence that adopted its prefix continues the same chain.
  const SeqId q = a.create_sequence();
  const PrefixMatch m = a.match_prefix(probe_parent);
  a.adopt_prefix(q, probe_parent, m);
  const SeqId qc = a.fork(q);
  EXPECT_EQ(a.ref_count(tp[0]), 4);  // p, c, q and qc; the cache itself holds no reference
  ASSERT_TRUE(a.append_tokens(qc, 5));
  auto qc_tokens = probe_parent;
  qc_tokens.insert(qc_tokens.end(), {5, 6, 7, 8});
  a.cache_computed_blocks(qc, qc_tokens, 13);
  auto probe_qc = qc_tokens;
  probe_qc.push_back(0);
  EXPECT_EQ(a.match_prefix(probe_qc).blocks.size(), 3u);
  a.check_invariants();
  for (SeqId s : {p, c, q, qc}) a.free_sequence(s);
  EXPECT_EQ(a.num_free_blocks(), 16);
  a.check_invariants();
}

TEST(KvPrefixCache, OffKeepsNothing) {
  BlockAllocator a(8, 4);
  EXPECT_FALSE(a.prefix_caching());
  const auto prompt = iota_tokens(9, 0);
  const SeqId s = a.create_sequence();
  EXPECT_EQ(admit_and_compute(a, s, prompt), 0);
  EXPECT_FALSE(a.is_cached(a.block_table(s)[0]));
  a.free_sequence(s);
  EXPECT_TRUE(a.match_prefix(prompt).blocks.empty());
  const PrefixCacheStats st = a.prefix_cache_stats();
  EXPECT_EQ(st.query_tokens + st.hit_tokens + st.cached_blocks + st.evictions, 0);
  a.check_invariants();
}

TEST(KvPrefixCache, BadArgumentsAreNamedErrors) {
  BlockAllocator a(8, 4, true, 0);
  const auto prompt = iota_tokens(9, 0);
  const SeqId s = a.create_sequence();
  admit_and_compute(a, s, prompt);
  const PrefixMatch m = a.match_prefix(prompt);
  ASSERT_EQ(m.blocks.size(), 2u);
  ErrorKind kind{};
  EXPECT_NE(error_of([&] { a.adopt_prefix(s, prompt, m); }, &kind).find("argument 'seq'"), std::string::npos);
  EXPECT_EQ(int(kind), int(ErrorKind::kValue));
  const SeqId t = a.create_sequence();
  EXPECT_NE(error_of([&] { a.adopt_prefix(t, iota_tokens(8, 0), m); }).find("argument 'match'"), std::string::npos);
  EXPECT_NE(error_of([&] { a.cache_computed_blocks(s, prompt, 10); }).find("argument 'num_computed'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { a.cache_computed_blocks(s, iota_tokens(4, 0), 8); }).find("argument 'num_computed'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { a.is_cached(8); }, &kind).find("out of range"), std::string::npos);
  EXPECT_EQ(int(kind), int(ErrorKind::kIndex));
  // A match whose blocks were evicted since is refused, not silently adopted.
  a.free_sequence(s);
  const SeqId hog = a.create_sequence();
  ASSERT_TRUE(a.append_tokens(hog, 32));  // takes every block, evicting the cached ones
  a.free_sequence(hog);
  EXPECT_NE(error_of([&] { a.adopt_prefix(t, prompt, m); }).find("no longer holds the matched prefix"),
            std::string::npos);
  EXPECT_EQ(a.num_tokens(t), 0);
  a.check_invariants();
}

// Random requests over a few shared prompt prefixes, appends, forks and frees in a small pool. The
// shadow KV stores, per slot, a hash of the tokens up to that position (what real K/V depends on):
// every adopted block must already hold the adopting sequence's values, and every live sequence
// must read back its own values after every operation (no cached block is ever overwritten).
TEST(KvPrefixCache, RandomizedStressAdoptedBlocksHoldTheRightKV) {
  for (int block_size : {1, 2, 4, 16}) {
    std::mt19937 rng(99 + block_size);
    const int64_t num_blocks = 40;
    BlockAllocator a(num_blocks, block_size, true, 1234);
    std::vector<uint64_t> slots(static_cast<size_t>(num_blocks * block_size), 0);
    struct Shadow {
      std::vector<int32_t> tokens;
      std::vector<uint64_t> kv;  // kv[j] = hash of tokens[0..j]
    };
    std::map<SeqId, Shadow> live;
    auto extend = [&](Shadow& sh, int32_t tok) {
      sh.kv.push_back(hash_combine(sh.kv.empty() ? 0 : sh.kv.back(), uint64_t(tok)));
      sh.tokens.push_back(tok);
    };
    std::vector<std::vector<int32_t>> prefixes;
    for (int p = 0; p < 4; ++p) prefixes.push_back(iota_tokens(int(2 + rng() % 40), int32_t(100 * p)));
    int64_t admitted = 0, hits = 0, refused = 0, forks = 0;
    for (int step = 0; step < 3000; ++step) {
      const int op = static_cast<int>(rng() % 10);
      auto pick = [&]() {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        return it->first;
      };
      if (live.empty() || op <= 2) {  // a new request: shared prefix + random tail
        Shadow sh;
        for (int32_t t : prefixes[rng() % prefixes.size()]) extend(sh, t);
        for (int i = int(rng() % 6); i > 0; --i) extend(sh, int32_t(rng() % 3));
        const SeqId s = a.create_sequence();
        const PrefixMatch m = a.match_prefix(sh.tokens);
        const int64_t hit = int64_t(m.blocks.size()) * block_size;
        const int64_t need = m.num_evictable + (int64_t(sh.tokens.size()) - hit + block_size - 1) / block_size;
        if (need > a.num_free_blocks()) {
          ++refused;
          a.free_sequence(s);
        } else {
          const int64_t free_before = a.num_free_blocks();
          ASSERT_EQ(a.adopt_prefix(s, sh.tokens, m), hit);
          for (int64_t j = 0; j < hit; ++j)
            ASSERT_EQ(slots[size_t(a.slot_of(s, j))], sh.kv[size_t(j)]) << "adopted block holds other KV";
          ASSERT_TRUE(a.append_tokens(s, int64_t(sh.tokens.size()) - hit));
          EXPECT_EQ(a.num_free_blocks(), free_before - need);
          for (int64_t j = hit; j < int64_t(sh.tokens.size()); ++j) slots[size_t(a.slot_of(s, j))] = sh.kv[size_t(j)];
          a.cache_computed_blocks(s, sh.tokens, int64_t(sh.tokens.size()));
          live[s] = sh;
          ++admitted;
          hits += hit > 0;
        }
      } else if (op <= 5) {  // decode a few tokens
        const SeqId s = pick();
        const int n = 1 + int(rng() % 3);
        std::vector<std::pair<int32_t, int32_t>> copies;
        if (!a.append_tokens(s, n, &copies)) continue;
        for (auto [src, dst] : copies)
          std::copy_n(slots.begin() + src * block_size, block_size, slots.begin() + dst * block_size);
        Shadow& sh = live[s];
        for (int i = 0; i < n; ++i) {
          extend(sh, int32_t(rng() % 3));
          slots[size_t(a.slot_of(s, int64_t(sh.tokens.size()) - 1))] = sh.kv.back();
        }
        a.cache_computed_blocks(s, sh.tokens, int64_t(sh.tokens.size()));
      } else if (op <= 6) {
        const SeqId p = pick();
        live[a.fork(p)] = live[p];
        ++forks;
      } else {
        const SeqId s = pick();
        a.free_sequence(s);
        live.erase(s);
      }
      a.check_invariants();
      for (const auto& [s, sh] : live)
        for (size_t j = 0; j < sh.tokens.size(); ++j)
          ASSERT_EQ(slots[size_t(a.slot_of(s, int64_t(j)))], sh.kv[j])
              << "block_size " << block_size << " step " << step << " seq " << s << " token " << j;
    }
    EXPECT_GT(admitted, 200);
    EXPECT_GT(hits, 50);
    EXPECT_GT(refused, 10);
    EXPECT_GT(forks, 50);
    EXPECT_GT(a.prefix_cache_stats().evictions, 10);
    for (const auto& [s, sh] : live) a.free_sequence(s);
    EXPECT_EQ(a.num_free_blocks(), num_blocks);
    a.check_invariants();
  }
}
