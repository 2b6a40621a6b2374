// Per-request sampling on one row of logits (policy in sampler.h).
#include "lowbit/engine/sampler.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "lowbit/ops/ops.h"

namespace lowbit {

double counter_uniform(uint64_t seed, uint64_t counter) {
  // SplitMix64 (Steele et al.) evaluated at position `counter` of stream `seed`: stateless, so a
  // preempted-and-recomputed request draws exactly the numbers it would have drawn.
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (counter + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;  // 53 random bits -> [0, 1)
}

SampleResult Sampler::sample(const float* logits, const std::vector<int32_t>& history, int64_t num_generated,
                             const RequestOptions& opts) {
  ops::SamplingParams p;
  p.temperature = opts.temperature;
  p.top_k = opts.top_k;
  p.top_p = opts.top_p;
  p.min_p = opts.min_p;
  p.repetition_penalty = opts.repetition_penalty;
  p.presence_penalty = opts.presence_penalty;
  p.frequency_penalty = opts.frequency_penalty;

  float* row = scratch_.data();
  std::memcpy(row, logits, size_t(vocab_) * sizeof(float));
  if (p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f)
    ops::apply_penalties(row, vocab_, history, p);
  if (num_generated < opts.min_tokens)
    for (int32_t t : opts.stop_token_ids) row[t] = -std::numeric_limits<float>::infinity();

  SampleResult r;
  r.token = ops::sample_token(row, vocab_, p, counter_uniform(opts.seed, uint64_t(num_generated)));
  r.logprob = ops::token_logprob(logits, vocab_, r.token);
  if (opts.logprobs > 0) r.top_logprobs = ops::top_logprobs(logits, vocab_, opts.logprobs);
  return r;
}

}  // namespace lowbit
