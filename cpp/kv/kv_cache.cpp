// KVCache: one K and one V block pool per layer (plus per-token per-head (scale, zero) for integer
// types), laid out as documented in kv_cache.h.
#include "lowbit/kv/kv_cache.h"

namespace lowbit {

bool is_quantized_kv_type(ScalarType t) { return t == ScalarType::u8 || t == ScalarType::u4 || t == ScalarType::u2; }

void check_kv_type(ScalarType t, const char* what) {
  if (t == ScalarType::u2)
    LOWBIT_NOT_SUPPORTED("KVCache: ", what, " u2 (kv2) is not supported yet; supported: f32, f16, bf16, u8, u4");
  LOWBIT_CHECK_TYPE(t == ScalarType::f32 || t == ScalarType::f16 || t == ScalarType::bf16 || t == ScalarType::u8 ||
                        t == ScalarType::u4,
                    "KVCache: ", what, " must be one of f32, f16, bf16, u8, u4; got ", name_of(t));
}

namespace {

void check_config(const KVCacheConfig& c) {
  LOWBIT_CHECK(c.num_layers > 0, "KVCache: config 'num_layers' must be positive, got ", c.num_layers);
  LOWBIT_CHECK(c.num_kv_heads > 0, "KVCache: config 'num_kv_heads' must be positive, got ", c.num_kv_heads);
  LOWBIT_CHECK(c.head_dim > 0, "KVCache: config 'head_dim' must be positive, got ", c.head_dim);
  LOWBIT_CHECK(c.block_size > 0, "KVCache: config 'block_size' must be positive, got ", c.block_size);
  LOWBIT_CHECK(c.num_blocks > 0, "KVCache: config 'num_blocks' must be positive, got ", c.num_blocks);
  check_kv_type(c.k_type, "k_type");
  check_kv_type(c.v_type, "v_type");
  LOWBIT_CHECK(!is_sub_byte(c.k_type) || c.head_dim % 2 == 0, "KVCache: k_type ", name_of(c.k_type),
               " packs two values per byte and needs an even head_dim, got ", c.head_dim);
  LOWBIT_CHECK(!is_sub_byte(c.v_type) || c.head_dim % 2 == 0, "KVCache: v_type ", name_of(c.v_type),
               " packs two values per byte and needs an even head_dim, got ", c.head_dim);
}

int64_t bytes_per_token_one_side(ScalarType t, const KVCacheConfig& c) {
  const int64_t params = is_quantized_kv_type(t) ? 2 * static_cast<int64_t>(sizeof(float)) : 0;
  return static_cast<int64_t>(c.num_kv_heads) * (bytes_for(t, c.head_dim) + params);
}

}  // namespace

KVCache::KVCache(const KVCacheConfig& cfg) : cfg_(cfg) {
  check_config(cfg);
  const Shape data_shape{cfg.num_blocks, cfg.num_kv_heads, cfg.block_size, cfg.head_dim};
  const Shape param_shape{cfg.num_blocks, cfg.num_kv_heads, cfg.block_size, 2};
  for (int l = 0; l < cfg.num_layers; ++l) {
    k_data_.push_back(Tensor::zeros(data_shape, cfg.k_type, cfg.device));
    v_data_.push_back(Tensor::zeros(data_shape, cfg.v_type, cfg.device));
    k_params_.push_back(is_quantized_kv_type(cfg.k_type) ? Tensor::zeros(param_shape, ScalarType::f32, cfg.device)
                                                         : Tensor());
    v_params_.push_back(is_quantized_kv_type(cfg.v_type) ? Tensor::zeros(param_shape, ScalarType::f32, cfg.device)
                                                         : Tensor());
  }
}

void KVCache::copy_block(int32_t src, int32_t dst) {
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, src >= 0 && src < cfg_.num_blocks, "KVCache.copy_block: argument 'src' = ",
                    src, " out of range [0, ", cfg_.num_blocks, ")");
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, dst >= 0 && dst < cfg_.num_blocks, "KVCache.copy_block: argument 'dst' = ",
                    dst, " out of range [0, ", cfg_.num_blocks, ")");
  if (src == dst) return;
  auto copy_one = [&](Tensor& t) {
    if (t.defined()) {
      Tensor d = t.select(0, dst);
      d.copy_(t.select(0, src));
    }
  };
  for (int l = 0; l < cfg_.num_layers; ++l) {
    copy_one(k_data_[l]);
    copy_one(v_data_[l]);
    copy_one(k_params_[l]);
    copy_one(v_params_[l]);
  }
}

int64_t KVCache::bytes_per_token(const KVCacheConfig& cfg) {
  check_config(cfg);
  return cfg.num_layers * (bytes_per_token_one_side(cfg.k_type, cfg) + bytes_per_token_one_side(cfg.v_type, cfg));
}

int64_t KVCache::total_bytes() const {
  int64_t total = 0;
  for (const auto* list : {&k_data_, &v_data_, &k_params_, &v_params_})
    for (const Tensor& t : *list)
      if (t.defined()) total += t.nbytes();
  return total;
}

}  // namespace lowbit
