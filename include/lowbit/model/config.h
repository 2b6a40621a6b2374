// ModelConfig: the architecture facts of a Llama-family decoder (llama, mistral, qwen2) that the
// C++ model needs. Plain fields so that Python (and embedding C++ programs) fill them directly.
#pragma once
#include <cstdint>
#include <string>

#include "lowbit/core/rope_config.h"

namespace lowbit {

struct ModelConfig {
  std::string arch = "llama";  // "llama" | "mistral" | "qwen2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rope_theta = 10000.f;
  std::string rope_scaling_type;  // "" (none) | "llama3" | "linear"
  float rope_factor = 1.f;
  float rope_low_freq_factor = 1.f;
  float rope_high_freq_factor = 4.f;
  int rope_original_max_position = 8192;
  bool rope_neox = true;  // HF rotate_half pairing; false = interleaved (GPT-J) pairs
  float rms_norm_eps = 1e-5f;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (qwen2)
  int64_t max_position_embeddings = 4096;

  int64_t q_size() const { return int64_t(num_heads) * head_dim; }
  int64_t kv_size() const { return int64_t(num_kv_heads) * head_dim; }
  int64_t qkv_size() const { return q_size() + 2 * kv_size(); }

  // Throws ValueError naming the first bad field and its value.
  void validate() const;
  RopeConfig rope_config() const;
};

}  // namespace lowbit
