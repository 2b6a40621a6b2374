// Paged KV bookkeeping: free pool, per-sequence block tables, reference counts shared by forks
// (copy-on-write of a shared, partially filled last block) and by the prefix cache (block_allocator.h).
#include "lowbit/kv/block_allocator.h"

#include <algorithm>

#include "lowbit/core/error.h"
#include "lowbit/kv/block_hash.h"

namespace lowbit {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Validates the constructor's arguments before any member is sized from them.
int64_t checked_num_blocks(int64_t num_blocks, int block_size) {
  LOWBIT_CHECK(num_blocks > 0 && num_blocks <= INT32_MAX,
               "BlockAllocator: argument 'num_blocks' must be in [1, 2^31), got ", num_blocks);
  LOWBIT_CHECK(block_size > 0, "BlockAllocator: argument 'block_size' must be positive, got ", block_size);
  return num_blocks;
}

}  // namespace

BlockAllocator::BlockAllocator(int64_t num_blocks, int block_size, bool prefix_caching, uint64_t cache_seed)
    : num_blocks_(checked_num_blocks(num_blocks, block_size)),
      block_size_(block_size),
      prefix_caching_(prefix_caching),
      cache_seed_(cache_seed),
      index_(prefix_caching ? num_blocks : 0, block_size) {
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  // Reverse order so that blocks are handed out 0, 1, 2, ... from a fresh pool.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

const BlockAllocator::Seq& BlockAllocator::get(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) LOWBIT_FAIL(ErrorKind::kIndex, "BlockAllocator: unknown sequence id ", seq);
  return it->second;
}

BlockAllocator::Seq& BlockAllocator::get(SeqId seq) {
  return const_cast<Seq&>(static_cast<const BlockAllocator*>(this)->get(seq));
}

void BlockAllocator::check_block(int32_t block, const char* what) const {
  if (block < 0 || block >= num_blocks_)
    LOWBIT_FAIL(ErrorKind::kIndex, "BlockAllocator.", what, ": block ", block, " out of range [0, ", num_blocks_, ")");
}

int BlockAllocator::ref_count(int32_t block) const {
  check_block(block, "ref_count");
  return refs_[static_cast<size_t>(block)];
}

bool BlockAllocator::is_cached(int32_t block) const {
  check_block(block, "is_cached");
  return prefix_caching_ && index_.is_cached(block);
}

// Callers check num_free_blocks() first. Never-cached blocks go first: evicting costs a future hit.
int32_t BlockAllocator::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = index_.evict_lru();
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, b >= 0, "BlockAllocator: no free block left (the caller must check)");
    ++evictions_;
  }
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockAllocator::release_block(int32_t b) {
  int& r = refs_[static_cast<size_t>(b)];
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, r > 0, "BlockAllocator: double free of block ", b);
  if (--r > 0) return;
  if (prefix_caching_ && index_.is_cached(b))
    index_.push_evictable(b);  // keeps its K/V for a later hit until the pool needs it
  else
    free_.push_back(b);
}

SeqId BlockAllocator::create_sequence() {
  const SeqId id = next_id_++;
  seqs_.emplace(id, Seq{});
  return id;
}

SeqId BlockAllocator::fork(SeqId parent) {
  Seq child = get(parent);  // copy of the parent's table (and of its keys: the child continues the chain)
  for (int32_t b : child.blocks) ++refs_[static_cast<size_t>(b)];
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(child));
  return id;
}

void BlockAllocator::free_sequence(SeqId seq) {
  const Seq& s = get(seq);
  // Last block first: among cached blocks, a sequence's tail is then evicted before its prefix,
  // which more sequences share.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) release_block(*it);
  seqs_.erase(seq);
}

int64_t BlockAllocator::blocks_needed(SeqId seq, int64_t n) const {
  LOWBIT_CHECK(n >= 0, "BlockAllocator: argument 'n' (tokens to append to sequence ", seq,
               ") must be >= 0, got ", n);
  const Seq& s = get(seq);
  if (n == 0) return 0;
  const int64_t have = static_cast<int64_t>(s.blocks.size());
  int64_t need = std::max<int64_t>(0, ceil_div(s.tokens + n, block_size_) - have);
  // Writing into a partially filled last block that another sequence also references needs a private copy.
  if (s.tokens % block_size_ != 0 && refs_[static_cast<size_t>(s.blocks.back())] > 1) ++need;
  return need;
}

bool BlockAllocator::append_tokens(SeqId seq, int64_t n, std::vector<std::pair<int32_t, int32_t>>* copies) {
  const int64_t need = blocks_needed(seq, n);
  if (need > num_free_blocks()) return false;
  if (n == 0) return true;
  Seq& s = get(seq);
  if (s.tokens % block_size_ != 0 && refs_[static_cast<size_t>(s.blocks.back())] > 1) {
    const int32_t src = s.blocks.back();
    const int32_t dst = take_block();
    release_block(src);
    s.blocks.back() = dst;
    if (copies) copies->emplace_back(src, dst);
  }
  s.tokens += n;
  while (static_cast<int64_t>(s.blocks.size()) < ceil_div(s.tokens, block_size_)) s.blocks.push_back(take_block());
  return true;
}

PrefixMatch BlockAllocator::match_prefix(const std::vector<int32_t>& tokens) const {
  PrefixMatch m;
  if (!prefix_caching_ || tokens.empty()) return m;
  const size_t max_blocks = (tokens.size() - 1) / size_t(block_size_);  // the last token is always computed
  uint64_t parent = cache_seed_;
  for (size_t i = 0; i < max_blocks; ++i) {
    const int32_t* t = tokens.data() + i * size_t(block_size_);
    const uint64_t key = hash_block(parent, t, block_size_);
    const int32_t b = index_.find(key, parent, t);
    if (b < 0) break;
    m.blocks.push_back(b);
    m.keys.push_back(key);
    m.num_evictable += index_.is_evictable(b);
    parent = key;
  }
  return m;
}

int64_t BlockAllocator::adopt_prefix(SeqId seq, const std::vector<int32_t>& tokens, const PrefixMatch& match) {
  Seq& s = get(seq);
  LOWBIT_CHECK(s.tokens == 0, "BlockAllocator.adopt_prefix: argument 'seq' (", seq, ") must be empty, it holds ",
               s.tokens, " tokens");
  const int64_t hit = int64_t(match.blocks.size()) * block_size_;
  LOWBIT_CHECK(match.blocks.size() == match.keys.size() && (match.blocks.empty() || hit < int64_t(tokens.size())),
               "BlockAllocator.adopt_prefix: argument 'match' (", match.blocks.size(), " blocks) does not fit ",
               "argument 'tokens' (", tokens.size(), " tokens); pass what match_prefix(tokens) returned");
  for (size_t i = 0; i < match.blocks.size(); ++i) {
    const int32_t b = match.blocks[i];
    check_block(b, "adopt_prefix");
    LOWBIT_CHECK_KIND(ErrorKind::kValue, prefix_caching_, "BlockAllocator.adopt_prefix: argument 'match' holds "
                      "blocks but prefix caching is off");
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, index_.is_cached(b) && index_.key_of(b) == match.keys[i],
                      "BlockAllocator.adopt_prefix: block ", b, " no longer holds the matched prefix (a block was "
                      "allocated between match_prefix and adopt_prefix)");
  }
  for (int32_t b : match.blocks) {
    if (refs_[static_cast<size_t>(b)] == 0) index_.remove_evictable(b);
    ++refs_[static_cast<size_t>(b)];
  }
  if (!prefix_caching_) return 0;
  s.blocks = match.blocks;
  s.keys = match.keys;
  s.tokens = hit;
  query_tokens_ += int64_t(tokens.size());
  hit_tokens_ += hit;
  return hit;
}

void BlockAllocator::cache_computed_blocks(SeqId seq, const std::vector<int32_t>& tokens, int64_t num_computed) {
  Seq& s = get(seq);
  LOWBIT_CHECK(num_computed >= 0 && num_computed <= s.tokens && num_computed <= int64_t(tokens.size()),
               "BlockAllocator.cache_computed_blocks: argument 'num_computed' (", num_computed,
               ") must be in [0, min(tokens held by sequence ", seq, " (", s.tokens, "), len(tokens) (",
               tokens.size(), "))]");
  if (!prefix_caching_) return;
  const size_t full = size_t(num_computed / block_size_);
  for (size_t i = s.keys.size(); i < full; ++i) {
    const uint64_t parent = i == 0 ? cache_seed_ : s.keys[i - 1];
    const int32_t* t = tokens.data() + i * size_t(block_size_);
    const uint64_t key = hash_block(parent, t, block_size_);
    s.keys.push_back(key);
    const int32_t b = s.blocks[i];
    if (index_.is_cached(b)) {
      // Shared with a fork that registered it first: the same tokens must give the same key.
      LOWBIT_CHECK_KIND(ErrorKind::kRuntime, index_.key_of(b) == key, "BlockAllocator.cache_computed_blocks: block ",
                        b, " of sequence ", seq, " is cached for other tokens than argument 'tokens' holds");
      continue;
    }
    index_.insert(b, key, parent, t);  // false: the same content is cached in another block already
  }
}

PrefixCacheStats BlockAllocator::prefix_cache_stats() const {
  PrefixCacheStats st;
  st.query_tokens = query_tokens_;
  st.hit_tokens = hit_tokens_;
  st.cached_blocks = index_.num_cached();
  st.evictable_blocks = index_.num_evictable();
  st.evictions = evictions_;
  return st;
}

const std::vector<int32_t>& BlockAllocator::block_table(SeqId seq) const { return get(seq).blocks; }

int64_t BlockAllocator::num_tokens(SeqId seq) const { return get(seq).tokens; }

int64_t BlockAllocator::slot_of(SeqId seq, int64_t token_index) const {
  const Seq& s = get(seq);
  if (token_index < 0 || token_index >= s.tokens)
    LOWBIT_FAIL(ErrorKind::kIndex, "BlockAllocator: token index ", token_index, " out of range for sequence ", seq,
                " holding ", s.tokens, " tokens");
  return static_cast<int64_t>(s.blocks[static_cast<size_t>(token_index / block_size_)]) * block_size_ +
         token_index % block_size_;
}

void BlockAllocator::check_invariants() const {
  std::vector<int> counted(static_cast<size_t>(num_blocks_), 0);
  for (const auto& [id, s] : seqs_) {
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, static_cast<int64_t>(s.blocks.size()) == ceil_div(s.tokens, block_size_),
                      "BlockAllocator invariant: sequence ", id, " holds ", s.blocks.size(), " blocks for ", s.tokens,
                      " tokens");
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, int64_t(s.keys.size()) <= s.tokens / block_size_,
                      "BlockAllocator invariant: sequence ", id, " has keys for ", s.keys.size(), " blocks but only ",
                      s.tokens / block_size_, " full blocks");
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const int32_t b = s.blocks[i];
      LOWBIT_CHECK_KIND(ErrorKind::kRuntime, b >= 0 && b < num_blocks_, "BlockAllocator invariant: sequence ", id,
                        " holds out-of-range block ", b);
      ++counted[static_cast<size_t>(b)];
      LOWBIT_CHECK_KIND(ErrorKind::kRuntime,
                        !prefix_caching_ || !index_.is_cached(b) || i >= s.keys.size() || index_.key_of(b) == s.keys[i],
                        "BlockAllocator invariant: cached block ", b, " at position ", i, " of sequence ", id,
                        " is cached under another key than the sequence's chain");
    }
  }
  std::vector<char> in_free(static_cast<size_t>(num_blocks_), 0);
  for (int32_t b : free_) {
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, b >= 0 && b < num_blocks_ && !in_free[static_cast<size_t>(b)],
                      "BlockAllocator invariant: free list holds block ", b, " twice or out of range");
    in_free[static_cast<size_t>(b)] = 1;
  }
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const size_t i = static_cast<size_t>(b);
    const bool cached = prefix_caching_ && index_.is_cached(int32_t(b));
    const bool evictable = prefix_caching_ && index_.is_evictable(int32_t(b));
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, counted[i] == refs_[i], "BlockAllocator invariant: block ", b,
                      " has reference count ", refs_[i], " but ", counted[i], " sequences hold it");
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !(in_free[i] && evictable), "BlockAllocator invariant: block ", b,
                      " is both on the free list and evictable");
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, (refs_[i] == 0) == (in_free[i] || evictable),
                      "BlockAllocator invariant: block ", b, " with reference count ", refs_[i],
                      (in_free[i] || evictable ? " is" : " is not"), " free");
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !in_free[i] || !cached, "BlockAllocator invariant: cached block ", b,
                      " is on the never-cached free list");
  }
  if (prefix_caching_) index_.check_invariants();
}

}  // namespace lowbit
