// Per-request sampling: penalties, stop-id suppression below min_tokens, temperature/top-k/top-p/
// min-p through the sampling ops, and a counter-based RNG so that a request's i-th draw depends only
// on (seed, i): the same seed gives the same tokens whatever the batch, preemption or thread count.
#pragma once
#include <cstdint>
#include <vector>

#include "lowbit/engine/request.h"

namespace lowbit {

// U[0, 1) draw number `counter` of the stream `seed` (SplitMix64 finaliser over seed + counter * golden).
double counter_uniform(uint64_t seed, uint64_t counter);

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

class Sampler {
 public:
  explicit Sampler(int64_t vocab) : vocab_(vocab), scratch_(size_t(vocab)) {}
  // `logits`: one f32 row of the model (left unmodified). `history`: the sequence's tokens so far
  // (prompt + generated; penalties apply to all of them, as HF's repetition penalty does).
  // `num_generated`: tokens generated so far (the draw counter, and the min_tokens test).
  SampleResult sample(const float* logits, const std::vector<int32_t>& history, int64_t num_generated,
                      const RequestOptions& opts);

 private:
  int64_t vocab_;
  std::vector<float> scratch_;  // penalised copy of the row, reused
};

}  // namespace lowbit
