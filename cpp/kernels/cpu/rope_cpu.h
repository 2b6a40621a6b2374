// Rotary position embedding on the CPU, in place on f32/f16/bf16 [T, H, D] (last dim contiguous).
#pragma once
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/core/rope_config.h"

namespace lowbit::cpu {

// inv_freq[i] for i in [0, rotary_dim / 2): theta^(-2i / rotary_dim), with Llama-3 frequency scaling
// when cfg.llama3 (HF `_compute_llama3_parameters`) and divided by cfg.linear_factor (linear scaling).
std::vector<double> rope_inv_freq(const RopeConfig& cfg, int rotary_dim);

// Rotates the first rotary_dim features of every head of q and k (either may be undefined) at
// positions (s32 [T]). Arguments are validated by ops::rope.
void rope_cpu(Tensor& q, Tensor& k, const Tensor& positions, const RopeConfig& cfg);

}  // namespace lowbit::cpu
