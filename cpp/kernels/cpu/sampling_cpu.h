// Sampling on one row of f32 logits (host memory). Arguments are validated by ops/sampling.cpp.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "lowbit/core/sampling_params.h"

namespace lowbit::cpu {

// HF repetition penalty on every distinct seen token (positive logits divided, negative multiplied),
// then OpenAI presence/frequency: logit -= presence * [count > 0] + frequency * count.
void apply_penalties_cpu(float* logits, int64_t vocab, const std::vector<int32_t>& history,
                         const SamplingParams& p);

// Greedy (temperature 0): the first maximum. Otherwise logits / temperature, then top-k, top-p
// (smallest prefix of the descending-probability order whose renormalized mass reaches top_p),
// min-p (keep probability >= min_p * max), and the inverse CDF of `uniform` walked over the kept
// tokens in descending-probability order (ties: lower id first).
int32_t sample_token_cpu(const float* logits, int64_t vocab, const SamplingParams& p, double uniform);

float token_logprob_cpu(const float* logits, int64_t vocab, int32_t token);
// The n largest logits (ties: lower id first) with their log-softmax values, best first.
std::vector<std::pair<int32_t, float>> top_logprobs_cpu(const float* logits, int64_t vocab, int n);

}  // namespace lowbit::cpu
