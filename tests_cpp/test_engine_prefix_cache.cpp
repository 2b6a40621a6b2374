// Engine with automatic prefix caching on a tiny random Llama: the same greedy tokens and logprobs
// with caching on and off (and as the float64 reference) for every K/V format, fewer prefill tokens
// by exactly the hits, eviction under a tiny pool, sessions sharing their blocks, the switch.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "engine/prefix_cache_seed.h"
#include "lowbit/engine/engine.h"
#include "test_model_reference.h"

namespace lowbit {
namespace {

using namespace testing_ref;

const ModelConfig& cfg() {
  static const ModelConfig c = tiny_config();
  return c;
}
const Weights& weights() {
  static const Weights w = random_weights(cfg(), 21);
  return w;
}
std::unique_ptr<Model> make_model(const std::string& recipe) {
  auto m = std::make_unique<Model>(cfg(), recipe);
  load(*m, weights());
  return m;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(cfg().vocab_size));
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

RequestOptions greedy(int max_tokens) {
  RequestOptions o;
  o.temperature = 0.f;
  o.max_tokens = max_tokens;
  return o;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Steps until idle; `before_step(step)` may add requests. Bounded so a scheduler bug cannot hang.
std::map<int64_t, Result> run(Engine& e, const std::function<void(int)>& before_step = nullptr) {
  std::map<int64_t, Result> out;
  for (int step = 0; step < 3000; ++step) {
    if (before_step) before_step(step);
    if (!e.has_unfinished() && step > 60) break;
    for (const TokenEvent& ev : e.step())
      if (ev.token >= 0) {
        out[ev.request_id].tokens.push_back(ev.token);
        out[ev.request_id].logprobs.push_back(ev.logprob);
      }
  }
  EXPECT_FALSE(e.has_unfinished());
  return out;
}

// Requests on a shared 40-token prefix (two full 16-token blocks and a partial one), arriving one
// after the other so that later ones find the earlier ones' blocks: a longer prompt, a different
// tail, the prefix itself, exactly its two full blocks (all cached: the last block is recomputed),
// and an unrelated prompt.
struct Job {
  int64_t id;
  std::vector<int32_t> prompt;
  int max_tokens, add_at_step;
};
std::vector<Job> shared_prefix_jobs() {
  const auto prefix = random_tokens(40, 100);
  return {{1, concat(prefix, random_tokens(5, 101)), 6, 0},
          {2, concat(prefix, random_tokens(9, 102)), 4, 12},
          {3, prefix, 5, 14},
          {4, std::vector<int32_t>(prefix.begin(), prefix.begin() + 32), 7, 30},
          {5, random_tokens(21, 103), 3, 30},
          {6, concat(prefix, random_tokens(30, 104)), 4, 31}};
}

std::map<int64_t, Result> run_jobs(Engine& e, const std::vector<Job>& jobs) {
  return run(e, [&](int step) {
    for (const Job& j : jobs)
      if (j.add_at_step == step) e.add_request(j.id, j.prompt, greedy(j.max_tokens));
  });
}

int64_t total_prompt_tokens(const std::vector<Job>& jobs) {
  int64_t n = 0;
  for (const Job& j : jobs) n += int64_t(j.prompt.size());
  return n;
}

class PrefixCacheFormats : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheFormats, OnAndOffGiveTheSameTokensAndLogprobs) {
  const auto model = make_model(GetParam());
  const auto jobs = shared_prefix_jobs();
  EngineConfig off_cfg;
  off_cfg.prefix_caching = false;
  off_cfg.max_batch_tokens = 24;  // chunked prefills: caching must not depend on how chunks fell
  Engine off(*model, off_cfg);
  EngineConfig on_cfg = off_cfg;
  on_cfg.prefix_caching = true;
  Engine on(*model, on_cfg);
  const auto want = run_jobs(off, jobs);
  const auto got = run_jobs(on, jobs);
  for (const Job& j : jobs) {
    ASSERT_EQ(got.at(j.id).tokens, want.at(j.id).tokens) << GetParam() << " request " << j.id;
    for (size_t i = 0; i < want.at(j.id).logprobs.size(); ++i)
      EXPECT_NEAR(got.at(j.id).logprobs[i], want.at(j.id).logprobs[i], 1e-4) << "request " << j.id << " token " << i;
    if (std::string(GetParam()) == "w16a16")  // an oracle independent of the engine: float64 reference
      EXPECT_EQ(got.at(j.id).tokens, reference_greedy(cfg(), weights(), j.prompt, j.max_tokens)) << "request " << j.id;
  }
  const EngineStats s_off = off.stats(), s_on = on.stats();
  EXPECT_FALSE(s_off.prefix_caching);
  EXPECT_EQ(s_off.prefix_cache_hit_tokens + s_off.prefix_cache_query_tokens + s_off.prefix_cache_blocks, 0);
  EXPECT_EQ(s_off.prefill_tokens, total_prompt_tokens(jobs));
  EXPECT_TRUE(s_on.prefix_caching);
  // Requests 2, 3, 6 hit the two full prefix blocks; request 4 (exactly those 32 tokens) hits one.
  EXPECT_EQ(s_on.prefix_cache_hit_tokens, 32 + 32 + 16 + 32);
  EXPECT_EQ(s_on.prefix_cache_query_tokens, total_prompt_tokens(jobs));
  EXPECT_EQ(s_on.prefill_tokens, total_prompt_tokens(jobs) - s_on.prefix_cache_hit_tokens);
  EXPECT_GT(s_on.prefix_cache_blocks, 0);
  EXPECT_EQ(s_on.num_free_blocks, s_on.num_blocks);  // cached blocks nobody holds count as free
}

INSTANTIATE_TEST_SUITE_P(KVFormats, PrefixCacheFormats,
                         ::testing::Values("w16a16", "w16a16kv8", "w16a16k8v4", "w16a16kv4"));

// A pool far smaller than the work: blocks are evicted and sequences preempted, the tokens stay.
TEST(EnginePrefixCache, TinyPoolEvictsAndPreemptsWithSameTokens) {
  const auto model = make_model("w16a16");
  std::vector<Job> jobs;
  const auto system = random_tokens(13, 200);
  for (int i = 0; i < 10; ++i)
    jobs.push_back({i + 1, concat(i % 3 == 2 ? random_tokens(9, 300 + i) : system, random_tokens(3 + i, 400 + i)),
                    8 + i % 5, i / 2});
  EngineConfig ec;
  ec.block_size = 4;
  ec.max_batch_tokens = 16;
  ec.kv_cache_bytes = 12 * 4 * model->kv_bytes_per_token();  // 12 blocks; the largest job needs 10
  ec.prefix_caching = false;
  Engine off(*model, ec);
  ec.prefix_caching = true;
  Engine on(*model, ec);
  const auto want = run_jobs(off, jobs);
  const auto got = run_jobs(on, jobs);
  for (const Job& j : jobs) {
    EXPECT_EQ(got.at(j.id).tokens, want.at(j.id).tokens) << "request " << j.id;
    EXPECT_EQ(got.at(j.id).tokens, reference_greedy(cfg(), weights(), j.prompt, j.max_tokens)) << "request " << j.id;
  }
  const EngineStats s = on.stats();
  EXPECT_GT(s.prefix_cache_hit_tokens, 0);
  EXPECT_GT(s.prefix_cache_evictions, 0);
  EXPECT_GT(s.preemptions, 0) << "off: " << off.stats().preemptions;
  EXPECT_EQ(s.num_free_blocks, s.num_blocks);
}

// A session's blocks are shared with other requests while it holds them, and stay cached after it ends.
TEST(EnginePrefixCache, SessionsShareTheirBlocksAndLeaveThemCached) {
  const auto model = make_model("w16a16");
  Engine e(*model);
  const auto prompt = random_tokens(37, 500);
  RequestOptions o = greedy(4);
  o.session_id = 1;
  e.add_request(1, prompt, o);
  run(e);
  EXPECT_EQ(e.stats().sessions, 1);
  EXPECT_EQ(e.stats().prefix_cache_hit_tokens, 0);
  const auto other = concat(std::vector<int32_t>(prompt.begin(), prompt.begin() + 33), random_tokens(4, 501));
  e.add_request(2, other, greedy(3));
  const auto shared = run(e)[2].tokens;
  EXPECT_EQ(e.stats().prefix_cache_hit_tokens, 32);  // the session's two full blocks
  EXPECT_EQ(shared, reference_greedy(cfg(), weights(), other, 3));
  e.end_session(1);
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);
  EXPECT_GE(e.stats().prefix_cache_blocks, 2);
  e.add_request(3, other, greedy(3));
  EXPECT_EQ(run(e)[3].tokens, shared);
  EXPECT_EQ(e.stats().prefix_cache_hit_tokens, 64);
}

TEST(EnginePrefixCache, OffByConfig) {
  const auto model = make_model("w16a16");
  EngineConfig ec;
  ec.prefix_caching = false;
  Engine e(*model, ec);
  const auto prompt = random_tokens(40, 600);
  for (int64_t id : {1, 2}) {
    e.add_request(id, prompt, greedy(2));
    run(e);
  }
  const EngineStats s = e.stats();
  EXPECT_FALSE(s.prefix_caching);
  EXPECT_EQ(s.prefill_tokens, 80);
  EXPECT_EQ(s.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(s.prefix_cache_blocks, 0);
}

// Issue 16's formats: per-channel K (the block is the K group, so a cached block is a complete,
// quantized group) and 2-bit KV. Caching on and off give the same tokens and logprobs, hits come in
// whole blocks, and a block size asked for is replaced by the K group.
class PrefixCacheNewFormats : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheNewFormats, OnAndOffAgreeAndHitsAreWholeGroups) {
  const auto model = make_model(GetParam());
  const int block = model->kv_block_size(16);
  const auto jobs = shared_prefix_jobs();
  EngineConfig off_cfg;
  off_cfg.prefix_caching = false;
  off_cfg.max_batch_tokens = 24;  // chunked prefills cut groups at other places than the hits do
  Engine off(*model, off_cfg);
  EngineConfig on_cfg = off_cfg;
  on_cfg.prefix_caching = true;
  Engine on(*model, on_cfg);
  const auto want = run_jobs(off, jobs);
  const auto got = run_jobs(on, jobs);
  for (const Job& j : jobs) {
    ASSERT_EQ(got.at(j.id).tokens, want.at(j.id).tokens) << GetParam() << " request " << j.id;
    for (size_t i = 0; i < want.at(j.id).logprobs.size(); ++i)
      EXPECT_NEAR(got.at(j.id).logprobs[i], want.at(j.id).logprobs[i], 1e-4) << "request " << j.id << " token " << i;
  }
  const EngineStats s = on.stats();
  EXPECT_EQ(s.block_size, block);
  // 40-token shared prefix: with 32-token groups requests 2, 3, 6 hit one block each and request 4 (32
  // tokens) none; with 16-token blocks as for the per-token formats.
  EXPECT_EQ(s.prefix_cache_hit_tokens, block == 32 ? 3 * 32 : 32 + 32 + 16 + 32);
  EXPECT_EQ(s.prefill_tokens, total_prompt_tokens(jobs) - s.prefix_cache_hit_tokens);
  EXPECT_EQ(s.num_free_blocks, s.num_blocks);
  // And the float model decodes differently: the formats are really in use.
  const auto plain = make_model("w16a16");
  Engine f(*plain, off_cfg);
  const auto fl = run_jobs(f, jobs);
  double max_diff = 0;
  for (const Job& j : jobs)
    for (size_t i = 0; i < std::min(fl.at(j.id).logprobs.size(), want.at(j.id).logprobs.size()); ++i)
      max_diff = std::max(max_diff, double(std::abs(fl.at(j.id).logprobs[i] - want.at(j.id).logprobs[i])));
  EXPECT_GT(max_diff, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(KVFormats, PrefixCacheNewFormats,
                         ::testing::Values("w16a16kc4g32v4", "w16a16kc2g32v2", "w16a16kv2", "w16a16k4v2"));

// Per-channel K under a pool far too small: sequences are preempted (their partial groups and f16
// windows dropped and recomputed) and forks of cached groups evicted; the tokens match an unconstrained run.
TEST(EnginePrefixCache, PerChannelKSurvivesPreemptionAndEviction) {
  const auto model = make_model("w16a16kc4g32v4");
  std::vector<Job> jobs;
  const auto system = random_tokens(26, 700);  // prompts of 29..36 tokens: decoding crosses a group
  for (int i = 0; i < 8; ++i)
    jobs.push_back({i + 1, concat(i % 3 == 2 ? random_tokens(9, 800 + i) : system, random_tokens(3 + i, 900 + i)),
                    8 + i % 5, i / 2});
  EngineConfig big;
  big.prefix_caching = false;
  Engine ref(*model, big);
  const auto want = run_jobs(ref, jobs);
  EXPECT_EQ(ref.stats().preemptions, 0);
  EngineConfig ec;
  ec.max_batch_tokens = 16;
  ec.kv_cache_bytes = 3 * 32 * model->kv_bytes_per_token();  // 3 blocks of 32; the largest job needs 2
  ec.prefix_caching = true;
  Engine on(*model, ec);
  const auto got = run_jobs(on, jobs);
  for (const Job& j : jobs) {
    EXPECT_EQ(got.at(j.id).tokens, want.at(j.id).tokens) << "request " << j.id;
    for (size_t i = 0; i < want.at(j.id).logprobs.size(); ++i)
      EXPECT_NEAR(got.at(j.id).logprobs[i], want.at(j.id).logprobs[i], 1e-4) << "request " << j.id << " token " << i;
  }
  const EngineStats s = on.stats();
  EXPECT_EQ(s.block_size, 32);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(s.num_free_blocks, s.num_blocks);
}

// The prefix cache's root key tells K/V formats and K groups apart (a cached block is only valid under the
// format and group that wrote it), and is stable for one configuration.
TEST(EnginePrefixCache, SeedNamesTheKVFormatAndGroup) {
  std::map<uint64_t, std::string> seen;
  for (const char* r : {"w16a16", "w16a16kv4", "w16a16kv2", "w16a16k4v2", "w16a16kc4v4", "w16a16kc4g32v4",
                        "w16a16kc4g128v4", "w16a16kc2v2", "w16a16kc4v2"}) {
    const auto m = make_model(r);
    const KVCacheConfig c = m->kv_cache_config(8, m->kv_block_size(16));
    const uint64_t seed = engine_detail::prefix_cache_seed(*m, c);
    EXPECT_EQ(seed, engine_detail::prefix_cache_seed(*m, m->kv_cache_config(8, m->kv_block_size(16)))) << r;
    EXPECT_TRUE(seen.emplace(seed, r).second) << r << " has the seed of " << seen[seed];
  }
}

// A session keeps its partly filled last K group (and its f16 window) between turns; the next turn crosses
// the group boundary and decodes exactly as a fresh request for the whole conversation.
TEST(EnginePrefixCache, PerChannelKSessionKeepsItsWindowAcrossTurns) {
  const auto model = make_model("w16a16kc4g32v4");
  const auto prompt = random_tokens(21, 12);
  Engine e(*model);
  RequestOptions o = greedy(5);
  o.session_id = 3;
  e.add_request(1, prompt, o);
  const auto first = run(e)[1];
  std::vector<int32_t> follow = concat(prompt, first.tokens);
  follow = concat(follow, random_tokens(10, 13));  // 36 tokens: the continuation fills the first group
  const int64_t prefill_before = e.stats().prefill_tokens;
  e.add_request(2, follow, o);
  const auto second = run(e)[2];
  EXPECT_EQ(e.stats().prefill_tokens - prefill_before, 10 + 1);  // only the new tokens (and the last sampled one)
  Engine fresh(*model);
  fresh.add_request(9, follow, greedy(5));
  const auto want = run(fresh)[9];
  ASSERT_EQ(want.tokens.size(), 5u);
  ASSERT_EQ(first.tokens.size(), 5u);
  EXPECT_EQ(second.tokens, want.tokens);
  for (size_t i = 0; i < want.logprobs.size(); ++i) EXPECT_NEAR(second.logprobs[i], want.logprobs[i], 1e-4) << i;
  e.end_session(3);
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);
}

}  // namespace
}  // namespace lowbit
