// The f16 residual window of per-channel K (KVCacheConfig::k_per_channel): a partly filled K block cannot
// be quantized yet (its per-channel scale and zero need all block_size tokens), so its K rows wait here in
// f16, keyed by block id, until the token that fills the block arrives; then kv_write quantizes the block
// into the cache pool and retires the entry: it stays readable until the layer's next kv_write, because
// queries of the same step that sit before the block's last token must still see the block as their
// window (every query sees the cache exactly as token-by-token decoding would have left it, so results
// do not depend on how prefills were chunked or whether a prefix came from the cache). One store per
// layer. CPU only (the GPU refuses the format).
//
// Why a side store keyed by block rather than per sequence: forks (copy-on-write of a shared partial last
// block) and preemption already speak in blocks, so KVCache::copy_block copies the entry with the block
// and nothing in the scheduler has to know about the window. An entry of a partial block that is freed
// (preemption, abort) stays until the block is reused and filled: bounded by the pool, never read, since
// attention reads a block's residual rows only below the owning sequence's length.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace lowbit {

class KResidualStore {
 public:
  KResidualStore(int num_kv_heads, int block_size, int head_dim)
      : block_elems_(int64_t(num_kv_heads) * block_size * head_dim) {}
  // f16 bits [num_kv_heads, block_size, head_dim] of `block`, created (zeroed) on first use. Pointers stay
  // valid until the block's entry is released (callers acquire serially, then write in parallel).
  uint16_t* acquire(int32_t block);
  const uint16_t* find(int32_t block) const;  // nullptr when the block has no entry
  void release(int32_t block);
  void retire(int32_t block) { retired_.push_back(block); }  // released by the next release_retired()
  void release_retired();
  void copy(int32_t src, int32_t dst);  // dst's entry becomes a copy of src's (dropped if src has none)
  int64_t num_entries() const { return int64_t(rows_.size()); }
  int64_t block_elems() const { return block_elems_; }

 private:
  int64_t block_elems_;
  std::unordered_map<int32_t, std::vector<uint16_t>> rows_;
  std::vector<int32_t> retired_;
};

}  // namespace lowbit
