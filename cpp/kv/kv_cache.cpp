// KVCache: one K and one V block pool per layer (plus per-token per-head (scale, zero) for integer
// types), laid out as documented in kv_cache.h.
#include "lowbit/kv/kv_cache.h"

#include <algorithm>
#include <string>
#include <tuple>

namespace lowbit {

bool is_quantized_kv_type(ScalarType t) { return t == ScalarType::u8 || t == ScalarType::u4 || t == ScalarType::u2; }

void check_kv_type(ScalarType t, const char* what) {
  LOWBIT_CHECK_TYPE(t == ScalarType::f32 || t == ScalarType::f16 || t == ScalarType::bf16 || t == ScalarType::u8 ||
                        t == ScalarType::u4 || t == ScalarType::u2,
                    "KVCache: ", what, " must be one of f32, f16, bf16, u8, u4, u2; got ", name_of(t));
}

std::string kv_format_words(ScalarType t, bool per_channel, int group) {
  std::string s = name_of(t);
  if (per_channel) s += " per-channel (group " + std::to_string(group) + ")";
  return s;
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
  for (const auto& [t, what] : {std::pair{c.k_type, "k_type"}, std::pair{c.v_type, "v_type"}}) {
    const int per_byte = is_sub_byte(t) ? 8 / bits_of(t) : 1;
    LOWBIT_CHECK(c.head_dim % per_byte == 0, "KVCache: ", what, " ", name_of(t), " packs ", per_byte,
                 " values per byte and needs head_dim divisible by ", per_byte, ", got ", c.head_dim);
  }
  if (c.k_per_channel)
    LOWBIT_CHECK_TYPE(c.k_type == ScalarType::u4 || c.k_type == ScalarType::u2,
                      "KVCache: per-channel K (k_per_channel) needs k_type u4 or u2, got ", name_of(c.k_type));
  // 2-bit K/V run on a GPU too (the attention kernels have them at head_dim 64 and 128; the registry names the
  // rest when it plans a step).
  if (!c.device.is_cpu()) {
    if (c.k_per_channel)
      LOWBIT_CHECK(c.block_size % 16 == 0 && c.head_dim % 16 == 0, "KVCache: per-channel K on ", c.device.str(),
                   " needs block_size (the K group) and head_dim multiples of 16, got ", c.block_size, " and ",
                   c.head_dim);
  }
  LOWBIT_CHECK(c.k_window_slots >= 0, "KVCache: config 'k_window_slots' must be >= 0, got ", c.k_window_slots);
}

// Per-channel K: a block's (scale, zero) rows cost 2 * head_dim floats, spread over its tokens (rounded
// up). The f16 residual window lives outside the pool (k_residual_store.h) and is not counted.
int64_t bytes_per_token_one_side(ScalarType t, bool per_channel, const KVCacheConfig& c) {
  const int64_t pair = 2 * static_cast<int64_t>(sizeof(float));
  const int64_t params = !is_quantized_kv_type(t) ? 0
                         : per_channel            ? (pair * c.head_dim + c.block_size - 1) / c.block_size
                                                  : pair;
  return static_cast<int64_t>(c.num_kv_heads) * (bytes_for(t, c.head_dim) + params);
}

}  // namespace

KVCache::KVCache(const KVCacheConfig& cfg) : cfg_(cfg) {
  check_config(cfg);
  const Shape data_shape{cfg.num_blocks, cfg.num_kv_heads, cfg.block_size, cfg.head_dim};
  const Shape param_shape{cfg.num_blocks, cfg.num_kv_heads, cfg.block_size, 2};
  const Shape k_param_shape =
      cfg.k_per_channel ? Shape{cfg.num_blocks, cfg.num_kv_heads, 2, cfg.head_dim} : param_shape;
  for (int l = 0; l < cfg.num_layers; ++l) {
    k_data_.push_back(Tensor::zeros(data_shape, cfg.k_type, cfg.device));
    v_data_.push_back(Tensor::zeros(data_shape, cfg.v_type, cfg.device));
    k_params_.push_back(is_quantized_kv_type(cfg.k_type) ? Tensor::zeros(k_param_shape, ScalarType::f32, cfg.device)
                                                         : Tensor());
    if (cfg.k_per_channel && cfg.device.is_cpu())
      k_residual_.emplace_back(cfg.num_kv_heads, cfg.block_size, cfg.head_dim);
    v_params_.push_back(is_quantized_kv_type(cfg.v_type) ? Tensor::zeros(param_shape, ScalarType::f32, cfg.device)
                                                         : Tensor());
  }
  if (cfg.k_per_channel && !cfg.device.is_cpu()) {
    const int64_t slots = cfg.k_window_slots > 0 ? cfg.k_window_slots : std::min<int64_t>(cfg.num_blocks, 64);
    for (int l = 0; l < cfg.num_layers; ++l)
      k_window_.push_back(
          Tensor::zeros({slots, cfg.num_kv_heads, cfg.block_size, cfg.head_dim}, ScalarType::f16, cfg.device));
    k_window_slots_ = KWindowSlots(cfg.num_blocks, slots);
    k_window_written_.assign(size_t(cfg.num_layers), 0);
    Tensor host = Tensor::empty({cfg.num_blocks}, ScalarType::s32);
    std::fill_n(host.data<int32_t>(), cfg.num_blocks, -1);
    k_window_map_ = host.to(cfg.device);
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
    if (!k_residual_.empty()) k_residual_[size_t(l)].copy(src, dst);
  }
  if (has_k_window()) {  // the fork's own window slot with a copy of src's rows; the map goes up next step
    const auto [s, d] = k_window_slots_.copy(src, dst);
    if (s >= 0)
      for (Tensor& rows : k_window_) {
        Tensor to = rows.select(0, d);
        to.copy_(rows.select(0, s));
      }
  }
}

void KVCache::check_k_window_prepared(int layer, int64_t tokens) {
  if (!has_k_window()) return;
  layer_tensor(k_window_, layer, "k_window");  // range check
  const KWindowSlots& w = k_window_slots_;
  const uint64_t last = k_window_written_[size_t(layer)];
  if (w.epoch() > last && w.prepared_tokens() <= tokens) {
    k_window_written_[size_t(layer)] = w.epoch();
    return;
  }
  const std::string state = w.epoch() == 0      ? "it was never called"
                            : w.epoch() == last ? "this layer already wrote the step it prepared"
                                                : "it prepared " + std::to_string(w.prepared_tokens()) + " tokens";
  LOWBIT_FAIL(ErrorKind::kValue, "kv_write: layer ", layer,
              " of a GPU cache with per-channel K needs prepare_k_window(cache, slot_mapping) once per step before "
              "its writes (it gives the step's blocks their f16 window slots); ", state, "; this write has ", tokens,
              " (with padding rows)");
}

KResidualStore& KVCache::k_residual(int layer) {
  return const_cast<KResidualStore&>(static_cast<const KVCache&>(*this).k_residual(layer));
}

const KResidualStore& KVCache::k_residual(int layer) const {
  LOWBIT_CHECK(cfg_.k_per_channel, "KVCache.k_residual: the cache's K is per token (", name_of(cfg_.k_type),
               "); only per-channel K has a residual window");
  LOWBIT_CHECK(cfg_.device.is_cpu(), "KVCache.k_residual: the cache is on ", cfg_.device.str(),
               "; its window is k_window (device rows), not a host store");
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, layer >= 0 && layer < cfg_.num_layers, "KVCache.k_residual: argument 'layer' = ",
                    layer, " out of range [0, ", cfg_.num_layers, ")");
  return k_residual_[size_t(layer)];
}

int64_t KVCache::bytes_per_token(const KVCacheConfig& cfg) {
  check_config(cfg);
  return cfg.num_layers * (bytes_per_token_one_side(cfg.k_type, cfg.k_per_channel, cfg) +
                           bytes_per_token_one_side(cfg.v_type, false, cfg));
}

int64_t KVCache::total_bytes() const {
  int64_t total = 0;
  for (const auto* list : {&k_data_, &v_data_, &k_params_, &v_params_, &k_window_})
    for (const Tensor& t : *list)
      if (t.defined()) total += t.nbytes();
  return total;
}

}  // namespace lowbit
