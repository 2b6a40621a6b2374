// Sampling ops on one host row of f32 logits: argument checks, then the CPU implementation.
#include <cmath>

#include "kernels/cpu/sampling_cpu.h"
#include "lowbit/ops/ops.h"

namespace lowbit::ops {
namespace {

void check_row(const float* logits, int64_t vocab, const char* op) {
  LOWBIT_CHECK(logits != nullptr, op, ": argument 'logits' is null");
  LOWBIT_CHECK(vocab > 0, op, ": argument 'vocab' must be positive, got ", vocab);
}

void check_params(const SamplingParams& p, const char* op) {
  LOWBIT_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, op,
               ": temperature must be >= 0 (0 = greedy), got ", p.temperature);
  LOWBIT_CHECK(p.top_k >= 0, op, ": top_k must be >= 0 (0 = off), got ", p.top_k);
  LOWBIT_CHECK(p.top_p > 0 && p.top_p <= 1, op, ": top_p must be in (0, 1], got ", p.top_p);
  LOWBIT_CHECK(p.min_p >= 0 && p.min_p <= 1, op, ": min_p must be in [0, 1], got ", p.min_p);
}

}  // namespace

void apply_penalties(float* logits, int64_t vocab, const std::vector<int32_t>& history, const SamplingParams& p) {
  constexpr const char* op = "apply_penalties";
  check_row(logits, vocab, op);
  LOWBIT_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0, op,
               ": repetition_penalty must be > 0 (1 = off), got ", p.repetition_penalty);
  LOWBIT_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty), op,
               ": presence/frequency penalties must be finite, got ", p.presence_penalty, " and ", p.frequency_penalty);
  for (size_t i = 0; i < history.size(); ++i)
    LOWBIT_CHECK_KIND(ErrorKind::kIndex, history[i] >= 0 && history[i] < vocab, op, ": history[", i, "] = ",
                      history[i], " is out of range for a vocabulary of ", vocab);
  cpu::apply_penalties_cpu(logits, vocab, history, p);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, double uniform) {
  constexpr const char* op = "sample_token";
  check_row(logits, vocab, op);
  check_params(p, op);
  LOWBIT_CHECK(p.temperature == 0 || (uniform >= 0 && uniform < 1), op, ": uniform must be in [0, 1), got ", uniform);
  return cpu::sample_token_cpu(logits, vocab, p, uniform);
}

float token_logprob(const float* logits, int64_t vocab, int32_t token) {
  constexpr const char* op = "token_logprob";
  check_row(logits, vocab, op);
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, token >= 0 && token < vocab, op, ": token ", token,
                    " is out of range for a vocabulary of ", vocab);
  return cpu::token_logprob_cpu(logits, vocab, token);
}

std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int64_t vocab, int n) {
  constexpr const char* op = "top_logprobs";
  check_row(logits, vocab, op);
  LOWBIT_CHECK(n >= 0, op, ": n must be >= 0, got ", n);
  return cpu::top_logprobs_cpu(logits, vocab, n);
}

}  // namespace lowbit::ops
