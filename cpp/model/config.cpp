// ModelConfig validation and its rotary-embedding settings.
#include "lowbit/model/config.h"

#include "lowbit/core/error.h"

namespace lowbit {

void ModelConfig::validate() const {
  LOWBIT_CHECK(arch == "llama" || arch == "mistral" || arch == "qwen2", "ModelConfig: arch must be one of llama, ",
               "mistral, qwen2, got '", arch, "'");
  LOWBIT_CHECK(vocab_size > 0, "ModelConfig: vocab_size must be positive, got ", vocab_size);
  LOWBIT_CHECK(hidden_size > 0, "ModelConfig: hidden_size must be positive, got ", hidden_size);
  LOWBIT_CHECK(intermediate_size > 0, "ModelConfig: intermediate_size must be positive, got ", intermediate_size);
  LOWBIT_CHECK(num_layers > 0, "ModelConfig: num_layers must be positive, got ", num_layers);
  LOWBIT_CHECK(num_heads > 0, "ModelConfig: num_heads must be positive, got ", num_heads);
  LOWBIT_CHECK(num_kv_heads > 0, "ModelConfig: num_kv_heads must be positive, got ", num_kv_heads);
  LOWBIT_CHECK(num_heads % num_kv_heads == 0, "ModelConfig: num_heads (", num_heads,
               ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
  LOWBIT_CHECK(head_dim > 0 && head_dim % 2 == 0, "ModelConfig: head_dim must be positive and even, got ", head_dim);
  LOWBIT_CHECK(rope_theta > 0, "ModelConfig: rope_theta must be positive, got ", rope_theta);
  LOWBIT_CHECK(rms_norm_eps > 0, "ModelConfig: rms_norm_eps must be positive, got ", rms_norm_eps);
  LOWBIT_CHECK(max_position_embeddings > 0, "ModelConfig: max_position_embeddings must be positive, got ",
               max_position_embeddings);
  LOWBIT_CHECK(rope_scaling_type.empty() || rope_scaling_type == "llama3" || rope_scaling_type == "linear",
               "ModelConfig: rope_scaling_type must be '', 'llama3' or 'linear', got '", rope_scaling_type, "'");
  LOWBIT_CHECK(rope_scaling_type.empty() || rope_factor > 0, "ModelConfig: rope_factor must be positive, got ",
               rope_factor);
}

RopeConfig ModelConfig::rope_config() const {
  RopeConfig r;
  r.theta = rope_theta;
  r.rotary_dim = head_dim;
  r.neox = rope_neox;
  if (rope_scaling_type == "llama3") {
    r.llama3 = true;
    r.factor = rope_factor;
    r.low_freq_factor = rope_low_freq_factor;
    r.high_freq_factor = rope_high_freq_factor;
    r.original_max_position = rope_original_max_position;
  } else if (rope_scaling_type == "linear") {
    r.linear_factor = rope_factor;
  }
  return r;
}

}  // namespace lowbit
