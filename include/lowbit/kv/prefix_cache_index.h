// The prefix cache's index over KV blocks: which block holds the KV of which chained key
// (block_hash.h), and the LRU order of cached blocks nobody references, the ones a BlockAllocator
// may evict. It owns no reference counts: the allocator decides when a block becomes evictable.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace lowbit {

class PrefixCacheIndex {
 public:
  PrefixCacheIndex(int64_t num_blocks, int block_size);

  // The block registered under `key` with this parent key and these block_size tokens, or -1
  // (a 64-bit key collision, caught by the comparison, is a miss).
  int32_t find(uint64_t key, uint64_t parent, const int32_t* tokens) const;
  // Registers `block` (block_size tokens) under `key`. Returns false and changes nothing when the key
  // already has a block (the same content computed twice: the first copy stays the cached one).
  bool insert(int32_t block, uint64_t key, uint64_t parent, const int32_t* tokens);
  bool is_cached(int32_t block) const { return entries_[std::size_t(block)].cached; }
  uint64_t key_of(int32_t block) const { return entries_[std::size_t(block)].key; }

  // Cached blocks with no reference, least recently released first.
  void push_evictable(int32_t block);    // now the most recently released; the block must be cached
  void remove_evictable(int32_t block);  // referenced again (a prefix hit)
  bool is_evictable(int32_t block) const { return entries_[std::size_t(block)].evictable; }
  // Drops the least recently released block from the cache and returns it (-1 when none is evictable).
  int32_t evict_lru();

  int64_t num_cached() const { return int64_t(by_key_.size()); }
  int64_t num_evictable() const { return int64_t(lru_.size()); }
  const std::list<int32_t>& lru_order() const { return lru_; }
  // Throws when the key map, per-block entries and LRU list disagree.
  void check_invariants() const;

 private:
  struct Entry {
    uint64_t key = 0, parent = 0;
    bool cached = false, evictable = false;
    std::list<int32_t>::iterator lru_pos;
  };
  void uncache(int32_t block);

  int block_size_;
  std::vector<Entry> entries_;     // per block
  std::vector<int32_t> tokens_;    // [num_blocks * block_size]: each cached block's tokens
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::list<int32_t> lru_;         // evictable blocks, front = least recently released
};

}  // namespace lowbit
