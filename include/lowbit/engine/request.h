// What a caller asks for (RequestOptions) and what the engine streams back (TokenEvent).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lowbit {

struct RequestOptions {
  float temperature = 1.f;  // 0 = greedy
  int top_k = 0;            // 0 = off
  float top_p = 1.f;        // in (0, 1]
  float min_p = 0.f;        // in [0, 1]
  float repetition_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
  uint64_t seed = 0;        // the request's RNG stream (see sampler.h)
  int max_tokens = 16;      // generated tokens, > 0
  int min_tokens = 0;       // stop ids are suppressed until this many tokens were generated
  std::vector<int32_t> stop_token_ids;
  int logprobs = 0;         // number of top (token, logprob) pairs per event
  int64_t session_id = -1;  // >= 0: keep the KV under this session when the request ends
};

struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;   // -1 for an abort event
  float logprob = 0.f;  // log-softmax of `token` under the model's unmodified logits
  std::vector<std::pair<int32_t, float>> top_logprobs;
  bool finished = false;
  std::string finish_reason;  // "" (not finished), "stop", "length", "abort"
};

}  // namespace lowbit
