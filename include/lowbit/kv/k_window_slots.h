// The f16 window of per-channel K on a GPU (KVCacheConfig::k_per_channel, device cache): the same rule as
// the CPU's KResidualStore (k_residual_store.h), but the rows live in a fixed pool of window slots on the
// device (KVCache::k_window) and this host-side table says which slot each block uses. The kernels read it
// through a device copy of the block -> slot map, so slots are handed out on the host before each step
// (prepare), never inside a kernel or a captured CUDA graph.
//
// A block gets a slot when a step first writes into it; a block whose last slot a step writes is sealed
// (quantized per channel) by that step and keeps its slot through the step (its earlier queries still
// read the window), then gives it back at the next prepare. Slots of blocks that no sequence holds any
// more (a finished or preempted sequence's partial block) are taken back when the pool runs dry.
#pragma once
#include <cstdint>
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

namespace lowbit {

class KWindowSlots {
 public:
  KWindowSlots() = default;
  KWindowSlots(int64_t num_blocks, int64_t num_slots);
  // Before a step writes `n` tokens at cache `slots` (-1: skipped) in blocks of `block_size` tokens.
  // live(block): whether a sequence still holds the block (slots of dead blocks may be reclaimed).
  // Throws a lowbit::Error naming the pool size when every slot is held by a live block.
  void prepare(const int32_t* slots, int64_t n, int block_size, const std::function<bool(int32_t)>& live);
  // A fork: dst gets its own slot holding src's rows (the caller copies the rows); returns {src slot, dst
  // slot}, or {-1, -1} when src has no window (then dst's is dropped). Reclaims with the last prepare's live.
  std::pair<int32_t, int32_t> copy(int32_t src, int32_t dst);
  const std::vector<int32_t>& map() const { return map_; }  // block -> slot, -1 for none
  // The entries changed since the last call, as [first, last) of map(); empty when none.
  std::pair<int64_t, int64_t> take_changed();
  int64_t num_slots() const { return int64_t(owner_.size()); }
  // Counts prepare calls, and the tokens of the last one: kv_write checks it writes a prepared step.
  uint64_t epoch() const { return epoch_; }
  int64_t prepared_tokens() const { return prepared_tokens_; }
  int64_t slots_in_use() const { return int64_t(owner_.size() - free_.size()); }

 private:
  int32_t acquire(int32_t block, const std::function<bool(int32_t)>& live);
  void release(int32_t block);
  void touch(int64_t block) {
    changed_lo_ = std::min(changed_lo_, block);
    changed_hi_ = std::max(changed_hi_, block + 1);
  }

  std::vector<int32_t> map_;     // block -> slot
  std::vector<int32_t> owner_;   // slot -> block, -1 for free
  std::vector<int32_t> free_;    // free slots
  std::vector<int32_t> sealed_;  // blocks sealed by the last prepared step: released at the next prepare
  int64_t changed_lo_ = INT64_MAX, changed_hi_ = 0;
  uint64_t epoch_ = 0;
  int64_t prepared_tokens_ = 0;
  std::function<bool(int32_t)> live_ = [](int32_t) { return true; };
};

}  // namespace lowbit
