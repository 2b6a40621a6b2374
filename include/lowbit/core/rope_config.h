// RopeConfig: how rotary position embeddings rotate q and k (HF's rope_theta, partial rotary, NeoX or
// GPT-J pairs, Llama-3 and linear scaling). Below the kernels, so that the CPU and GPU rope kernels, the
// ops that check their arguments and the model config all point down to it.
#pragma once

namespace lowbit {

struct RopeConfig {
  float theta = 10000.f;
  int rotary_dim = 0;     // 0 = head_dim
  bool neox = true;       // true: pairs (i, i + d/2) as HF rotate_half; false: GPT-J pairs (2i, 2i+1)
  // Llama-3 frequency scaling (type "llama3"); factor 1 = none. Linear scaling divides positions.
  bool llama3 = false;
  float factor = 1.f, low_freq_factor = 1.f, high_freq_factor = 4.f;
  int original_max_position = 8192;
  float linear_factor = 1.f;
};

}  // namespace lowbit
