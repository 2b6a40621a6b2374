// Token sampling helpers. Sorting the whole vocabulary per token is avoided: candidates are
// partially sorted in growing prefixes only as far as top-k / top-p / the CDF walk needs.
#include "kernels/cpu/sampling_cpu.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace lowbit::cpu {
namespace {

struct Candidate {
  float logit;
  int32_t id;
};
inline bool better(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Candidates whose first `sorted` entries are the best ones in order; sort_prefix extends that.
class RankedCandidates {
 public:
  RankedCandidates(const float* logits, int64_t vocab, float inv_temperature) : c_(vocab) {
    for (int64_t i = 0; i < vocab; ++i) c_[i] = {logits[i] * inv_temperature, static_cast<int32_t>(i)};
  }
  // Keeps only the best k (k < size).
  void truncate_to_best(int64_t k) {
    std::nth_element(c_.begin(), c_.begin() + k, c_.end(), better);
    c_.resize(k);
  }
  // Makes sure the first `count` are sorted (the rest are all worse than them).
  void sort_prefix(int64_t count) {
    count = std::min<int64_t>(count, size());
    if (count <= sorted_) return;
    const int64_t target = std::min<int64_t>(size(), std::max<int64_t>(count, 2 * sorted_ + 64));
    std::partial_sort(c_.begin() + sorted_, c_.begin() + target, c_.end(), better);
    sorted_ = target;
  }
  const Candidate& operator[](int64_t i) {
    sort_prefix(i + 1);
    return c_[i];
  }
  int64_t size() const { return static_cast<int64_t>(c_.size()); }
  const std::vector<Candidate>& all() const { return c_; }

 private:
  std::vector<Candidate> c_;
  int64_t sorted_ = 0;
};

double log_sum_exp(const float* logits, int64_t vocab, float* max_out) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::fmax(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  *max_out = mx;
  return std::log(sum);
}

}  // namespace

void apply_penalties_cpu(float* logits, int64_t vocab, const std::vector<int32_t>& history,
                         const SamplingParams& p) {
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history) ++counts[t];
  for (const auto& [token, count] : counts) {
    float& l = logits[token];
    if (p.repetition_penalty != 1.f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
  }
}

int32_t sample_token_cpu(const float* logits, int64_t vocab, const SamplingParams& p, double uniform) {
  if (p.temperature == 0.f) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);

  RankedCandidates cand(logits, vocab, 1.f / p.temperature);
  if (p.top_k > 0 && p.top_k < vocab) cand.truncate_to_best(p.top_k);
  const float top = cand[0].logit;
  // Unnormalized probabilities exp(l - max); the best candidate has 1.
  double total = 0;
  for (const Candidate& c : cand.all()) total += std::exp(double(c.logit) - top);

  int64_t kept = cand.size();
  if (p.top_p < 1.f) {  // smallest prefix whose mass reaches top_p of the total
    double cum = 0;
    int64_t i = 0;
    while (i < cand.size()) {
      cum += std::exp(double(cand[i].logit) - top);
      ++i;
      if (cum >= double(p.top_p) * total) break;
    }
    kept = i;
  }
  if (p.min_p > 0.f) {  // probability >= min_p * max probability  <=>  exp(l - top) >= min_p
    int64_t i = 1;
    while (i < kept && std::exp(double(cand[i].logit) - top) >= double(p.min_p)) ++i;
    kept = i;
  }
  double kept_mass = 0;
  for (int64_t i = 0; i < kept; ++i) kept_mass += std::exp(double(cand[i].logit) - top);
  const double target = uniform * kept_mass;
  double cum = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += std::exp(double(cand[i].logit) - top);
    if (cum > target) return cand[i].id;
  }
  return cand[kept - 1].id;  // uniform rounding to 1
}

float token_logprob_cpu(const float* logits, int64_t vocab, int32_t token) {
  float mx;
  const double lse = log_sum_exp(logits, vocab, &mx);
  return static_cast<float>(double(logits[token]) - mx - lse);
}

std::vector<std::pair<int32_t, float>> top_logprobs_cpu(const float* logits, int64_t vocab, int n) {
  float mx;
  const double lse = log_sum_exp(logits, vocab, &mx);
  RankedCandidates cand(logits, vocab, 1.f);
  const int64_t count = std::min<int64_t>(n, vocab);
  std::vector<std::pair<int32_t, float>> out;
  out.reserve(count);
  for (int64_t i = 0; i < count; ++i)
    out.emplace_back(cand[i].id, static_cast<float>(double(cand[i].logit) - mx - lse));
  return out;
}

}  // namespace lowbit::cpu
