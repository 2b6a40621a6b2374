// Sampling helpers against straightforward float64 references (full sort, explicit softmax).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "lowbit/ops/ops.h"
#include "kernels/cpu/sampling_cpu.h"

using namespace lowbit;

namespace {

std::mt19937 g_rng(99);

std::vector<float> random_logits(int64_t vocab, float spread) {
  std::normal_distribution<float> d(0.f, spread);
  std::vector<float> l(vocab);
  for (float& v : l) v = d(g_rng);
  return l;
}

// Reference: kept token ids in descending order with their normalized probabilities.
std::vector<std::pair<int32_t, double>> reference_distribution(const std::vector<float>& logits,
                                                               const ops::SamplingParams& p) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<double> scaled(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) scaled[i] = double(logits[i] * (1.f / p.temperature));
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return scaled[a] > scaled[b]; });
  size_t n = ids.size();
  if (p.top_k > 0) n = std::min<size_t>(n, p.top_k);
  std::vector<double> prob(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[i] = std::exp(scaled[ids[i]] - scaled[ids[0]]);
  if (p.top_p < 1) {
    double cum = 0;
    size_t i = 0;
    while (i < n) {
      cum += prob[i++];
      if (cum >= p.top_p * total) break;
    }
    n = i;
  }
  if (p.min_p > 0) {
    size_t i = 1;
    while (i < n && prob[i] >= p.min_p * prob[0]) ++i;
    n = i;
  }
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += prob[i];
  std::vector<std::pair<int32_t, double>> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(ids[i], prob[i] / kept);
  return out;
}

int32_t reference_pick(const std::vector<std::pair<int32_t, double>>& dist, double u) {
  double cum = 0;
  for (const auto& [id, pr] : dist) {
    cum += pr;
    if (cum > u) return id;
  }
  return dist.back().first;
}

}  // namespace

TEST(SamplingCpu, PenaltiesFollowHfAndOpenAiSemantics) {
  std::vector<float> logits = {2.f, -2.f, 0.5f, -0.25f, 3.f, 0.f};
  const std::vector<float> orig = logits;
  ops::SamplingParams p;
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 0.25f;
  p.frequency_penalty = 0.125f;
  const std::vector<int32_t> history = {0, 1, 1, 3, 0, 0, 5};
  cpu::apply_penalties_cpu(logits.data(), 6, history, p);
  EXPECT_FLOAT_EQ(logits[0], 2.f / 1.5f - 0.25f - 3 * 0.125f);
  EXPECT_FLOAT_EQ(logits[1], -2.f * 1.5f - 0.25f - 2 * 0.125f);
  EXPECT_FLOAT_EQ(logits[2], orig[2]);  // unseen
  EXPECT_FLOAT_EQ(logits[3], -0.25f * 1.5f - 0.25f - 0.125f);
  EXPECT_FLOAT_EQ(logits[4], orig[4]);
  EXPECT_FLOAT_EQ(logits[5], 0.f - 0.25f - 0.125f);
}

TEST(SamplingCpu, GreedyTakesTheFirstMaximum) {
  std::vector<float> l = random_logits(1000, 2.f);
  l[417] = l[903] = 50.f;
  ops::SamplingParams p;
  p.temperature = 0.f;
  EXPECT_EQ(cpu::sample_token_cpu(l.data(), 1000, p, 0.99), 417);
}

TEST(SamplingCpu, InverseCdfMatchesReferenceUnderEveryFilter) {
  struct Setting {
    float t;
    int k;
    float top_p, min_p;
  };
  const Setting settings[] = {{1.f, 0, 1.f, 0.f},  {0.7f, 0, 1.f, 0.f}, {1.f, 40, 1.f, 0.f}, {1.f, 0, 0.9f, 0.f},
                              {1.f, 0, 1.f, 0.05f}, {0.8f, 50, 0.8f, 0.02f}, {1.3f, 1, 1.f, 0.f}, {1.f, 0, 1e-6f, 0.f}};
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  for (const Setting& s : settings) {
    const int64_t vocab = 5003;
    const std::vector<float> l = random_logits(vocab, 3.f);
    ops::SamplingParams p;
    p.temperature = s.t;
    p.top_k = s.k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    const auto dist = reference_distribution(l, p);
    for (int i = 0; i < 300; ++i) {
      const double u = ud(g_rng);
      ASSERT_EQ(cpu::sample_token_cpu(l.data(), vocab, p, u), reference_pick(dist, u))
          << "t=" << s.t << " k=" << s.k << " top_p=" << s.top_p << " min_p=" << s.min_p << " u=" << u;
    }
    EXPECT_EQ(cpu::sample_token_cpu(l.data(), vocab, p, 0.0), dist.front().first);
    if (s.k == 1 || s.top_p < 1e-3f) EXPECT_EQ(dist.size(), 1u);
  }
}

TEST(SamplingCpu, LogprobsMatchFloat64LogSoftmax) {
  const int64_t vocab = 777;
  std::vector<float> l = random_logits(vocab, 4.f);
  l[10] = l[20] = 30.f;  // a tie at the top: lower id first
  double mx = -1e300, sum = 0;
  for (float v : l) mx = std::max(mx, double(v));
  for (float v : l) sum += std::exp(double(v) - mx);
  const double lse = mx + std::log(sum);
  for (int32_t t : {0, 10, 500, 776}) EXPECT_NEAR(cpu::token_logprob_cpu(l.data(), vocab, t), l[t] - lse, 1e-5);
  const auto top = cpu::top_logprobs_cpu(l.data(), vocab, 5);
  ASSERT_EQ(top.size(), 5u);
  EXPECT_EQ(top[0].first, 10);
  EXPECT_EQ(top[1].first, 20);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(top[i].first, ids[i]);
    EXPECT_NEAR(top[i].second, l[ids[i]] - lse, 1e-5);
  }
  EXPECT_EQ(cpu::top_logprobs_cpu(l.data(), vocab, 5000).size(), size_t(vocab));
  EXPECT_TRUE(cpu::top_logprobs_cpu(l.data(), vocab, 0).empty());
}
