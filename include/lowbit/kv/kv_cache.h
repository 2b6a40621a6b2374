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
#pragma once
#include <cstdint>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/kv/block_allocator.h"

namespace lowbit {

// K/V element types: f32/f16/bf16 (stored as is), u8 (kv8), u4 (kv4), u2 (kv2, reserved: not yet
// supported by the kernels, rejected with a clear error).
bool is_quantized_kv_type(ScalarType t);
void check_kv_type(ScalarType t, const char* what);

struct KVCacheConfig {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0, block_size = 16;
  int64_t num_blocks = 0;
  ScalarType k_type = ScalarType::f32, v_type = ScalarType::f32;
  Device device = Device::cpu();
};

class KVCache {
 public:
  explicit KVCache(const KVCacheConfig& cfg);  // validates cfg; allocates zeroed blocks on cfg.device
  const KVCacheConfig& config() const { return cfg_; }
  const Tensor& k_data(int layer) const { return layer_tensor(k_data_, layer, "k_data"); }
  const Tensor& v_data(int layer) const { return layer_tensor(v_data_, layer, "v_data"); }
  const Tensor& k_params(int layer) const { return layer_tensor(k_params_, layer, "k_params"); }  // undefined for float K
  const Tensor& v_params(int layer) const { return layer_tensor(v_params_, layer, "v_params"); }
  void copy_block(int32_t src, int32_t dst);  // every layer, K and V, data and params (copy-on-write)
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
};

}  // namespace lowbit
