// Paged KV bookkeeping: a free pool, per-sequence block tables and one reference count per block.
//
// Sharing has one mechanism, the reference count. A fork shares all of its parent's blocks and
// copies a shared, partially filled last block before writing into it (copy-on-write). Automatic
// prefix caching (optional) shares full blocks across sequences that never met: once a full block's
// K/V is computed (cache_computed_blocks), it is registered under a chained key of its tokens
// (block_hash.h, the root key `cache_seed` standing for the model, recipe and K/V formats); a new
// sequence whose first full blocks have cached keys adopts those blocks (match_prefix, then
// adopt_prefix) and computes only the rest. A cached block whose last reference goes stays cached
// and counts as free; blocks are taken from never-cached free blocks first, then by evicting the
// cached one released least recently (a sequence releases its blocks last first, so a prefix
// outlives its tails). Cached blocks are always full and fully computed, so nothing writes into them.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lowbit/kv/prefix_cache_index.h"

namespace lowbit {

using SeqId = int64_t;

// The cached blocks a new sequence can start from (BlockAllocator::match_prefix).
struct PrefixMatch {
  std::vector<int32_t> blocks;   // the sequence's first blocks, in order
  std::vector<uint64_t> keys;    // their chained keys
  int64_t num_evictable = 0;     // of those, unreferenced (counted as free until adopted)
};

// Counters since construction, except the two gauges cached_blocks / evictable_blocks.
struct PrefixCacheStats {
  int64_t query_tokens = 0;      // tokens of the sequences that looked for a cached prefix
  int64_t hit_tokens = 0;        // of those, tokens whose K/V came from cached blocks
  int64_t cached_blocks = 0;     // blocks registered in the cache now (referenced or not)
  int64_t evictable_blocks = 0;  // cached blocks nobody references now (part of the free pool)
  int64_t evictions = 0;         // cached blocks dropped to be reused for other tokens
};

class BlockAllocator {
 public:
  // prefix_caching: keep and share computed full blocks (see above); cache_seed: the root key.
  BlockAllocator(int64_t num_blocks, int block_size, bool prefix_caching = false, uint64_t cache_seed = 0);

  SeqId create_sequence();
  // New sequence sharing all of `parent`'s blocks (reference counted, copy-on-write on append).
  SeqId fork(SeqId parent);
  void free_sequence(SeqId seq);

  // Blocks needed to append `n` tokens to `seq` (counts a copy-on-write of a shared last block).
  int64_t blocks_needed(SeqId seq, int64_t n) const;
  bool can_append(SeqId seq, int64_t n) const { return blocks_needed(seq, n) <= num_free_blocks(); }
  // Reserves room for `n` more tokens. Returns false (and changes nothing) when the pool is short:
  // the caller waits or preempts. Copy-on-write block copies the caller must perform are appended
  // to `copies` as (src_block, dst_block).
  bool append_tokens(SeqId seq, int64_t n, std::vector<std::pair<int32_t, int32_t>>* copies = nullptr);

  // Prefix caching (arguments are checked either way; with caching off matches are empty and
  // nothing is cached).
  // The cached blocks holding the longest chain of `tokens`' full blocks, leaving at least the last
  // token out (it must be computed for its logits). Changes nothing.
  PrefixMatch match_prefix(const std::vector<int32_t>& tokens) const;
  // Gives the empty sequence `seq` the blocks of `match` (from match_prefix on the same `tokens`, with
  // no allocation in between) and counts the query. Returns the tokens whose K/V it now holds.
  int64_t adopt_prefix(SeqId seq, const std::vector<int32_t>& tokens, const PrefixMatch& match);
  // Registers `seq`'s full blocks among its first `num_computed` tokens (their K/V now written);
  // `tokens` are the sequence's tokens, at least num_computed of them.
  void cache_computed_blocks(SeqId seq, const std::vector<int32_t>& tokens, int64_t num_computed);
  bool prefix_caching() const { return prefix_caching_; }
  bool is_cached(int32_t block) const;  // throws IndexError for a block outside [0, num_blocks)
  PrefixCacheStats prefix_cache_stats() const;
  const PrefixCacheIndex& prefix_cache() const { return index_; }

  const std::vector<int32_t>& block_table(SeqId seq) const;
  int64_t num_tokens(SeqId seq) const;
  int64_t slot_of(SeqId seq, int64_t token_index) const;  // block * block_size + offset
  bool has_sequence(SeqId seq) const { return seqs_.count(seq) != 0; }

  int64_t num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // Unreferenced blocks, cached ones included (they are evicted when needed).
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()) + index_.num_evictable(); }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  int ref_count(int32_t block) const;  // throws IndexError for a block outside [0, num_blocks)
  int64_t num_used_blocks() const { return num_blocks_ - num_free_blocks(); }
  // Throws when the free pool, reference counts and prefix cache disagree (used by the stress tests):
  // a block is free exactly when nothing references it, and never both free and held.
  void check_invariants() const;

 private:
  struct Seq {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> keys;  // chained keys of the first keys.size() blocks (prefix caching)
    int64_t tokens = 0;
  };
  const Seq& get(SeqId seq) const;
  Seq& get(SeqId seq);
  int32_t take_block();
  void release_block(int32_t b);
  void check_block(int32_t block, const char* what) const;

  int64_t num_blocks_;
  int block_size_;
  bool prefix_caching_;
  uint64_t cache_seed_;
  std::vector<int32_t> free_;  // unreferenced blocks that hold no cached K/V
  std::vector<int> refs_;
  PrefixCacheIndex index_;
  std::unordered_map<SeqId, Seq> seqs_;
  SeqId next_id_ = 0;
  int64_t query_tokens_ = 0, hit_tokens_ = 0, evictions_ = 0;
};

}  // namespace lowbit
