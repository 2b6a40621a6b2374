// KWindowSlots: which device window slot each per-channel K block uses (see k_window_slots.h).
#include "lowbit/kv/k_window_slots.h"

#include <algorithm>

#include "lowbit/core/error.h"

namespace lowbit {

KWindowSlots::KWindowSlots(int64_t num_blocks, int64_t num_slots)
    : map_(size_t(num_blocks), -1), owner_(size_t(num_slots), -1) {
  free_.reserve(size_t(num_slots));
  for (int64_t s = num_slots - 1; s >= 0; --s) free_.push_back(int32_t(s));
}

void KWindowSlots::release(int32_t block) {
  const int32_t slot = map_[size_t(block)];
  if (slot < 0) return;
  owner_[size_t(slot)] = -1;
  free_.push_back(slot);
  map_[size_t(block)] = -1;
  touch(block);
}

int32_t KWindowSlots::acquire(int32_t block, const std::function<bool(int32_t)>& live) {
  if (map_[size_t(block)] >= 0) return map_[size_t(block)];
  if (free_.empty())  // take back the slots of blocks no sequence holds any more
    for (int32_t s = 0; s < int32_t(owner_.size()); ++s)
      if (owner_[size_t(s)] >= 0 && owner_[size_t(s)] != block && !live(owner_[size_t(s)])) release(owner_[size_t(s)]);
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !free_.empty(), "KVCache: all ", owner_.size(),
                    " per-channel K window slots are held by live blocks (one per partly filled block); "
                    "raise the cache's k_window_slots");
  const int32_t slot = free_.back();
  free_.pop_back();
  owner_[size_t(slot)] = block;
  map_[size_t(block)] = slot;
  touch(block);
  return slot;
}

void KWindowSlots::prepare(const int32_t* slots, int64_t n, int block_size, const std::function<bool(int32_t)>& live) {
  ++epoch_;
  prepared_tokens_ = n;
  live_ = live;
  for (const int32_t b : sealed_) release(b);
  sealed_.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    const int32_t b = slots[i] / block_size;
    LOWBIT_CHECK_KIND(ErrorKind::kIndex, size_t(b) < map_.size(), "KVCache: slot ", slots[i], " is past the cache's ",
                      map_.size(), " blocks");
    acquire(b, live);
    if (slots[i] % block_size == block_size - 1) sealed_.push_back(b);
  }
}

std::pair<int32_t, int32_t> KWindowSlots::copy(int32_t src, int32_t dst) {
  const int32_t s = map_[size_t(src)];
  if (s < 0) {
    release(dst);
    return {-1, -1};
  }
  return {s, acquire(dst, live_)};
}

std::pair<int64_t, int64_t> KWindowSlots::take_changed() {
  const std::pair<int64_t, int64_t> r = changed_lo_ < changed_hi_ ? std::pair{changed_lo_, changed_hi_}
                                                                   : std::pair<int64_t, int64_t>{0, 0};
  changed_lo_ = INT64_MAX;
  changed_hi_ = 0;
  return r;
}

}  // namespace lowbit
