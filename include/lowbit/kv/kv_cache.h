// Paged KV cache: a BlockAllocator (block_allocator.h) does the bookkeeping (free pool, per-sequence
// block tables, reference counts for shared prefixes, prefix caching); a KVCache owns the memory of
// every layer's blocks.
//
// Block data layout, per layer (head-major inside a block so attention reads one head contiguously):
//   k_data(l): [num_blocks, num_kv_heads, block_size, head_dim] of k_type (u4/u2 packed along head_dim)
//   k_params(l): f32 [num_blocks, num_kv_heads, block_size, 2] = (scale, zero) for integer K types,
//                undefined for float K types. Dequantization: x = q * scale + zero, q unsigned.
// V has the same layout with v_type. A token's slot is block_id * block_size + offset.
// Integer K/V are quantized per token per head, dynamic asymmetric (QServe §4.1): over the head_dim
// values x of one token and head, zero = min(x), scale = (max(x) - min(x)) / (2^bits - 1),
// q = clamp(round((x - zero) / scale), 0, 2^bits - 1); a constant row stores scale 0 and q 0.
//
// Per-channel K (k_per_channel, KIVI-style, u4 or u2; V stays per token): the K group is exactly one block
// (block_size = G tokens, the recipe's kc..g{G}), so the paged allocator's unit stays the block and a
// full block is a complete, final group (prefix caching and forks need nothing new). Then
//   k_data(l): as above (token rows of packed codes), but the codes are per channel of the block:
//   k_params(l): f32 [num_blocks, num_kv_heads, 2, head_dim] = row 0 scales, row 1 zeros, one pair per
//                channel over the block's G tokens (same asymmetric rule along the tokens).
// A block is quantized when its last token is written; until then its K rows live in f16 in
// k_residual(l) (k_residual_store.h), the residual window; on a GPU in k_window(l), a pool of f16 window
// slots [k_window_slots, num_kv_heads, block_size, head_dim] with one block -> slot map for all layers
// (k_window_map(), assigned on the host before each step: k_window_slots.h). A query at position t reads key block
// [b0, b0 + G) quantized when b0 + G <= t + 1, else in f16: what token-by-token decoding would show it,
// so a sequence of length L decodes over floor(L / G) * G quantized keys and L mod G f16 ones, and
// chunked prefill and prefix-cache hits give the same results as decoding one token at a time.
#pragma once
#include <cstdint>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/kv/block_allocator.h"
#include "lowbit/kv/k_residual_store.h"
#include "lowbit/kv/k_window_slots.h"

namespace lowbit {

// K/V element types: f32/f16/bf16 (stored as is), u8 (kv8), u4 (kv4), u2 (kv2). Per-channel K: u4 or u2.
bool is_quantized_kv_type(ScalarType t);
void check_kv_type(ScalarType t, const char* what);
// "u4", "u4 per-channel (group 64)": the K/V format in words, for errors.
std::string kv_format_words(ScalarType t, bool per_channel, int group);

struct KVCacheConfig {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0, block_size = 16;
  int64_t num_blocks = 0;
  ScalarType k_type = ScalarType::f32, v_type = ScalarType::f32;
  bool k_per_channel = false;  // K per channel over each block (group = block_size); k_type u4 or u2
  Device device = Device::cpu();
  // Per-channel K on a GPU: window slots, one per block that is partly filled or sealed in the current
  // step (the engine sizes it from its batch limits); 0: min(num_blocks, 64).
  int64_t k_window_slots = 0;
};

class KVCache {
 public:
  explicit KVCache(const KVCacheConfig& cfg);  // validates cfg; allocates zeroed blocks on cfg.device
  const KVCacheConfig& config() const { return cfg_; }
  const Tensor& k_data(int layer) const { return layer_tensor(k_data_, layer, "k_data"); }
  const Tensor& v_data(int layer) const { return layer_tensor(v_data_, layer, "v_data"); }
  const Tensor& k_params(int layer) const { return layer_tensor(k_params_, layer, "k_params"); }  // undefined for float K
  const Tensor& v_params(int layer) const { return layer_tensor(v_params_, layer, "v_params"); }
  // The f16 residual window of per-channel K (throws unless config().k_per_channel).
  KResidualStore& k_residual(int layer);
  const KResidualStore& k_residual(int layer) const;
  // Per-channel K on a GPU: the f16 window rows of a layer, the device block -> slot map, its host table.
  bool has_k_window() const { return !k_window_.empty(); }
  const Tensor& k_window(int layer) const { return layer_tensor(k_window_, layer, "k_window"); }
  const Tensor& k_window_map() const { return k_window_map_; }
  KWindowSlots& k_window_slots() { return k_window_slots_; }
  // kv_write of `layer` for `tokens` rows (padding included) on a GPU cache with per-channel K: throws unless it
  // is the layer's first write since a prepare_k_window (ops.h) of at most that many tokens (else K rows would
  // go to no slot). Not called while a CUDA graph captures (the capture repeats a step's eager launches).
  void check_k_window_prepared(int layer, int64_t tokens);
  const KWindowSlots& k_window_slots() const { return k_window_slots_; }
  // Every layer, K and V, data, params and residual rows (copy-on-write).
  void copy_block(int32_t src, int32_t dst);
  // Bytes one token costs across all layers (data + params), for sizing the pool.
  static int64_t bytes_per_token(const KVCacheConfig& cfg);
  int64_t total_bytes() const;

 private:
  // A lowbit::Error naming the method and the layer (std::vector::at's message names neither).
  const Tensor& layer_tensor(const std::vector<Tensor>& list, int layer, const char* what) const {
    LOWBIT_CHECK_KIND(ErrorKind::kIndex, layer >= 0 && layer < cfg_.num_layers, "KVCache.", what,
                      ": argument 'layer' = ", layer, " out of range [0, ", cfg_.num_layers, ")");
    return list[static_cast<size_t>(layer)];
  }

  KVCacheConfig cfg_;
  std::vector<Tensor> k_data_, v_data_, k_params_, v_params_;
  std::vector<KResidualStore> k_residual_;  // per layer when k_per_channel (CPU)
  std::vector<Tensor> k_window_;             // per layer when k_per_channel (GPU)
  Tensor k_window_map_;
  KWindowSlots k_window_slots_;
  std::vector<uint64_t> k_window_written_;  // per layer: the epoch of its last kv_write
};

}  // namespace lowbit
