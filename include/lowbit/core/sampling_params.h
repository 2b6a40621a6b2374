// SamplingParams: how one row of logits becomes a token (temperature, top-k/p, min-p, penalties). Below
// the kernels, so that the CPU and GPU samplers, the sampling ops and the engine all point down to it.
#pragma once

namespace lowbit {

struct SamplingParams {
  float temperature = 1.f;  // 0 = greedy
  int top_k = 0;            // 0 = off
  float top_p = 1.f;
  float min_p = 0.f;
  float repetition_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
};

}  // namespace lowbit
