// Key -> block map and the LRU list of evictable cached blocks (prefix_cache_index.h).
#include "lowbit/kv/prefix_cache_index.h"

#include <algorithm>

#include "lowbit/core/error.h"

namespace lowbit {

PrefixCacheIndex::PrefixCacheIndex(int64_t num_blocks, int block_size)
    : block_size_(block_size), entries_(size_t(num_blocks)), tokens_(size_t(num_blocks) * size_t(block_size), 0) {}

int32_t PrefixCacheIndex::find(uint64_t key, uint64_t parent, const int32_t* tokens) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const int32_t b = it->second;
  const int32_t* stored = tokens_.data() + size_t(b) * size_t(block_size_);
  if (entries_[size_t(b)].parent != parent || !std::equal(stored, stored + block_size_, tokens)) return -1;
  return b;
}

bool PrefixCacheIndex::insert(int32_t block, uint64_t key, uint64_t parent, const int32_t* tokens) {
  Entry& e = entries_[size_t(block)];
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !e.cached, "PrefixCacheIndex: block ", block, " is already cached");
  if (!by_key_.emplace(key, block).second) return false;
  e.key = key;
  e.parent = parent;
  e.cached = true;
  std::copy(tokens, tokens + block_size_, tokens_.begin() + std::ptrdiff_t(block) * block_size_);
  return true;
}

void PrefixCacheIndex::push_evictable(int32_t block) {
  Entry& e = entries_[size_t(block)];
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, e.cached && !e.evictable, "PrefixCacheIndex: block ", block,
                    e.cached ? " is already evictable" : " is not cached");
  e.lru_pos = lru_.insert(lru_.end(), block);
  e.evictable = true;
}

void PrefixCacheIndex::remove_evictable(int32_t block) {
  Entry& e = entries_[size_t(block)];
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, e.evictable, "PrefixCacheIndex: block ", block, " is not evictable");
  lru_.erase(e.lru_pos);
  e.evictable = false;
}

void PrefixCacheIndex::uncache(int32_t block) {
  Entry& e = entries_[size_t(block)];
  by_key_.erase(e.key);
  e = Entry{};
}

int32_t PrefixCacheIndex::evict_lru() {
  if (lru_.empty()) return -1;
  const int32_t b = lru_.front();
  remove_evictable(b);
  uncache(b);
  return b;
}

void PrefixCacheIndex::check_invariants() const {
  for (const auto& [key, b] : by_key_) {
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, b >= 0 && size_t(b) < entries_.size() && entries_[size_t(b)].cached &&
                                               entries_[size_t(b)].key == key,
                      "PrefixCacheIndex invariant: key ", key, " maps to block ", b, " which is not cached under it");
  }
  int64_t cached = 0, evictable = 0;
  for (const Entry& e : entries_) {
    cached += e.cached;
    evictable += e.evictable;
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, e.cached || !e.evictable,
                      "PrefixCacheIndex invariant: an uncached block is on the LRU list");
  }
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, cached == num_cached() && evictable == num_evictable(),
                    "PrefixCacheIndex invariant: ", cached, " cached / ", evictable,
                    " evictable blocks but the map has ", num_cached(), " and the LRU list ", num_evictable());
}

}  // namespace lowbit
