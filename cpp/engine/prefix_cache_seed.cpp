// Root key of the prefix cache (prefix_cache_seed.h).
#include "engine/prefix_cache_seed.h"

#include <cstring>
#include <string>

#include "lowbit/kv/block_hash.h"

namespace lowbit::engine_detail {

namespace {
uint64_t hash_float(uint64_t seed, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return hash_combine(seed, bits);
}
}  // namespace

uint64_t prefix_cache_seed(const Model& model, const KVCacheConfig& cache) {
  const ModelConfig& c = model.config();
  uint64_t h = hash_string(0, "lowbit prefix cache v1");
  h = hash_string(h, c.arch);
  for (int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, int64_t(c.num_layers), int64_t(c.num_heads),
                    int64_t(c.num_kv_heads), int64_t(c.head_dim), int64_t(c.rope_original_max_position),
                    int64_t(c.rope_neox), int64_t(c.tie_word_embeddings), int64_t(c.attention_bias),
                    c.max_position_embeddings})
    h = hash_combine(h, uint64_t(v));
  for (float v : {c.rope_theta, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor, c.rms_norm_eps})
    h = hash_float(h, v);
  h = hash_string(h, c.rope_scaling_type);
  h = hash_string(h, model.recipe().text);
  h = hash_string(h, name_of(model.compute_dtype()));
  h = hash_string(h, model.device().is_cpu() ? "cpu" : "gpu");
  h = hash_string(h, name_of(cache.k_type));
  h = hash_string(h, name_of(cache.v_type));
  h = hash_string(h, cache.k_per_channel ? "k per channel" : "k per token");  // the K group is the block size
  h = hash_combine(h, uint64_t(cache.block_size));
  return h;
}

}  // namespace lowbit::engine_detail
