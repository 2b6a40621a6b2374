// Per-channel K on the GPU (KVCacheConfig::k_per_channel): what kv_write and the attention kernels need
// beyond the cache pool of a layer. A K block is quantized per channel only once its last token is
// written; until then its K rows live in f16 in the layer's window rows, at the block's window slot
// (KVCache::k_window; the host assigns slots before each step, include/lowbit/kv/k_residual_store.h).
#pragma once
#include "lowbit/core/tensor.h"
#include "lowbit/kv/kv_cache.h"

namespace lowbit::cuda {

struct KWindow {
  Tensor rows;  // f16 [window_slots, Hkv, block_size, D]
  Tensor map;   // s32 [num_blocks]: each block's window slot, -1 for none
  bool defined() const { return map.defined(); }
};

// The window operands of a layer of a GPU cache with per-channel K (undefined for any other cache).
inline KWindow k_window_of(const KVCache& cache, int layer) {
  return cache.has_k_window() ? KWindow{cache.k_window(layer), cache.k_window_map()} : KWindow{};
}

}  // namespace lowbit::cuda
