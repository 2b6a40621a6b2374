// Engine end to end on a tiny random Llama: logits and greedy tokens against the float64
// reference, batching/preemption invariance, abort, seeds, sessions, stop ids, bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "lowbit/engine/engine.h"
#include "test_model_reference.h"

namespace lowbit {
namespace {

using namespace testing_ref;

struct Fixture {
  ModelConfig cfg = tiny_config();
  Weights weights = random_weights(cfg, 21);
  Model model{cfg, "w16a16"};
  Fixture() { load(model, weights); }
};
Fixture& fx() {
  static Fixture f;
  return f;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(fx().cfg.vocab_size));
  return t;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string reason;
};

// Steps until idle; `before_step(step)` may add requests. Bounded so a scheduler bug cannot hang.
std::map<int64_t, Result> run(Engine& e, const std::function<void(int)>& before_step = nullptr) {
  std::map<int64_t, Result> out;
  for (int step = 0; step < 2000; ++step) {
    if (before_step) before_step(step);
    if (!e.has_unfinished() && step > 50) break;
    for (const TokenEvent& ev : e.step()) {
      Result& r = out[ev.request_id];
      EXPECT_TRUE(r.reason.empty()) << "event after the finish of request " << ev.request_id;
      if (ev.token >= 0) {
        r.tokens.push_back(ev.token);
        r.logprobs.push_back(ev.logprob);
      }
      if (ev.finished) r.reason = ev.finish_reason;
    }
  }
  EXPECT_FALSE(e.has_unfinished());
  return out;
}

RequestOptions greedy(int max_tokens) {
  RequestOptions o;
  o.temperature = 0.f;
  o.max_tokens = max_tokens;
  return o;
}

// f32 end to end: 1e-5 of the logit range (see test_model_forward.cpp).
TEST(EngineLogits, ChunkedLogitsMatchReference) {
  EngineConfig ec;
  ec.max_batch_tokens = 8;  // 37 tokens -> 5 chunks across 16-token blocks
  Engine e(fx().model, ec);
  const auto tokens = random_tokens(37, 1);
  Tensor got = e.logits(tokens);
  ASSERT_EQ(got.shape(), (Shape{37, fx().cfg.vocab_size}));
  const auto ref = reference_logits(fx().cfg, fx().weights, tokens);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(double(got.data<float>()[i]) - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  EXPECT_LT(num / den, 1e-5);
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);  // scratch sequence freed
}

TEST(EngineGenerate, GreedyMatchesReferenceWithLogprobs) {
  Engine e(fx().model);
  const auto prompt = random_tokens(9, 2);
  RequestOptions o = greedy(6);
  o.logprobs = 3;
  e.add_request(7, prompt, o);
  std::vector<TokenEvent> events;
  while (e.has_unfinished())
    for (auto& ev : e.step()) events.push_back(ev);
  const auto ref = reference_greedy(fx().cfg, fx().weights, prompt, 6);
  ASSERT_EQ(events.size(), 6u);
  std::vector<int32_t> seq = prompt;
  const int64_t V = fx().cfg.vocab_size;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].token, ref[i]) << "token " << i;
    const auto lg = reference_logits(fx().cfg, fx().weights, seq);
    const double* row = &lg[lg.size() - size_t(V)];
    double mx = row[0], z = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < V; ++j) z += std::exp(row[j] - mx);
    EXPECT_NEAR(events[i].logprob, row[ref[i]] - mx - std::log(z), 1e-4);
    ASSERT_EQ(events[i].top_logprobs.size(), 3u);
    EXPECT_EQ(events[i].top_logprobs[0].first, ref[i]);  // greedy token = most likely
    EXPECT_GE(events[i].top_logprobs[0].second, events[i].top_logprobs[1].second);
    EXPECT_GE(events[i].top_logprobs[1].second, events[i].top_logprobs[2].second);
    EXPECT_EQ(events[i].finished, i + 1 == events.size());
    seq.push_back(ref[i]);
  }
  EXPECT_EQ(events.back().finish_reason, "length");
}

struct Job {
  int64_t id;
  int prompt_len, max_tokens, add_at_step;
};
const std::vector<Job> kJobs = {{1, 1, 9, 0}, {2, 7, 5, 0}, {3, 16, 12, 1}, {4, 23, 3, 3}, {5, 40, 8, 4}, {6, 5, 10, 4}};

std::map<int64_t, Result> alone() {
  std::map<int64_t, Result> out;
  for (const Job& j : kJobs) {
    Engine e(fx().model);
    e.add_request(j.id, random_tokens(j.prompt_len, uint32_t(j.id)), greedy(j.max_tokens));
    out[j.id] = run(e)[j.id];
  }
  return out;
}

std::map<int64_t, Result> batched(Engine& e) {
  return run(e, [&](int step) {
    for (const Job& j : kJobs)
      if (j.add_at_step == step) e.add_request(j.id, random_tokens(j.prompt_len, uint32_t(j.id)), greedy(j.max_tokens));
  });
}

TEST(EngineGenerate, BatchingGivesTheSameTokensAsAlone) {
  const auto ref = alone();
  EngineConfig ec;
  ec.max_batch_tokens = 16;  // forces chunked prefills mixed with decodes
  ec.max_seqs = 4;           // forces waiting on sequences
  Engine e(fx().model, ec);
  const auto got = batched(e);
  for (const Job& j : kJobs) {
    EXPECT_EQ(got.at(j.id).tokens, ref.at(j.id).tokens) << "request " << j.id;
    EXPECT_EQ(got.at(j.id).reason, "length");
    EXPECT_EQ(int(got.at(j.id).tokens.size()), j.max_tokens);
    for (size_t i = 0; i < ref.at(j.id).logprobs.size(); ++i)
      EXPECT_NEAR(got.at(j.id).logprobs[i], ref.at(j.id).logprobs[i], 1e-4);
  }
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);
}

TEST(EngineGenerate, TinyPoolWaitsAndPreemptsWithSameTokens) {
  const auto ref = alone();
  EngineConfig ec;
  ec.block_size = 4;
  ec.kv_cache_bytes = 14 * 4 * fx().model.kv_bytes_per_token();  // 14 blocks: the largest job needs 12
  Engine e(fx().model, ec);
  const auto got = batched(e);
  for (const Job& j : kJobs) EXPECT_EQ(got.at(j.id).tokens, ref.at(j.id).tokens) << "request " << j.id;
  EXPECT_GT(e.stats().preemptions, 0);
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);
}

TEST(EngineGenerate, AbortFreesBlocks) {
  Engine e(fx().model);
  e.add_request(1, random_tokens(30, 5), greedy(20));
  e.add_request(2, random_tokens(3, 6), greedy(20));
  e.step();
  e.step();
  const int64_t free_before = e.stats().num_free_blocks;
  e.abort(1);
  EXPECT_EQ(e.stats().num_free_blocks, free_before + 2);  // 32 tokens of request 1 = 2 blocks of 16
  e.abort(12345);  // unknown ids are ignored
  const auto events = e.step();
  bool saw_abort = false;
  for (const auto& ev : events)
    if (ev.request_id == 1) {
      saw_abort = true;
      EXPECT_TRUE(ev.finished);
      EXPECT_EQ(ev.finish_reason, "abort");
    }
  EXPECT_TRUE(saw_abort);
  const auto rest = run(e);
  EXPECT_EQ(rest.count(1), 0u);
  EXPECT_EQ(rest.at(2).reason, "length");
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);
}

TEST(EngineGenerate, SeedsReproduceAcrossBatching) {
  RequestOptions o;
  o.temperature = 0.9f;
  o.top_k = 40;
  o.top_p = 0.95f;
  o.max_tokens = 16;
  o.seed = 1234;
  const auto prompt = random_tokens(6, 9);
  Engine a(fx().model);
  a.add_request(1, prompt, o);
  const auto ra = run(a)[1].tokens;
  Engine b(fx().model);
  b.add_request(5, random_tokens(11, 10), greedy(7));
  b.add_request(1, prompt, o);
  const auto rb = run(b)[1].tokens;
  EXPECT_EQ(ra, rb);
  o.seed = 1235;
  Engine c(fx().model);
  c.add_request(1, prompt, o);
  EXPECT_NE(run(c)[1].tokens, ra);
}

TEST(EngineGenerate, StopIdsAndMinTokens) {
  const auto prompt = random_tokens(8, 11);
  const auto ref = reference_greedy(fx().cfg, fx().weights, prompt, 4);
  Engine e(fx().model);
  RequestOptions o = greedy(10);
  o.stop_token_ids = {ref[0]};
  e.add_request(1, prompt, o);
  auto r = run(e)[1];
  EXPECT_EQ(r.tokens, std::vector<int32_t>{ref[0]});
  EXPECT_EQ(r.reason, "stop");
  o.min_tokens = 3;  // the stop id is masked for the first 3 tokens
  e.add_request(2, prompt, o);
  r = run(e)[2];
  ASSERT_GE(r.tokens.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(r.tokens[i], ref[0]);
}

TEST(EngineGenerate, SessionsReuseKV) {
  const auto prompt = random_tokens(21, 12);
  Engine e(fx().model);
  RequestOptions o = greedy(5);
  o.session_id = 3;
  e.add_request(1, prompt, o);
  const auto first = run(e)[1].tokens;
  EXPECT_EQ(e.stats().sessions, 1);
  std::vector<int32_t> follow = prompt;
  follow.insert(follow.end(), first.begin(), first.end());
  const auto extra = random_tokens(6, 13);
  follow.insert(follow.end(), extra.begin(), extra.end());
  const int64_t prefill_before = e.stats().prefill_tokens;
  e.add_request(2, follow, o);
  const auto second = run(e)[2].tokens;
  // The session's KV covers prompt + generated except the last sampled token.
  EXPECT_EQ(e.stats().prefill_tokens - prefill_before, int64_t(extra.size()) + 1);
  Engine fresh(fx().model);
  fresh.add_request(9, follow, greedy(5));
  EXPECT_EQ(run(fresh)[9].tokens, second);
  e.end_session(3);
  EXPECT_EQ(e.stats().sessions, 0);
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);
  // A diverging prompt starts over (full prefill) and still gives the fresh answer.
  e.add_request(3, prompt, o);
  run(e);
  const int64_t p0 = e.stats().prefill_tokens;
  e.add_request(4, extra, o);
  const auto diverged = run(e)[4].tokens;
  EXPECT_EQ(e.stats().prefill_tokens - p0, int64_t(extra.size()));
  Engine fresh2(fx().model);
  fresh2.add_request(1, extra, greedy(5));
  EXPECT_EQ(run(fresh2)[1].tokens, diverged);
}

template <typename F>
void expect_value_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& err) {
    EXPECT_EQ(int(err.kind()), int(ErrorKind::kValue)) << err.what();
    EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
  }
}

TEST(EngineErrors, BadRequestsRaiseAndTheEngineKeepsServing) {
  Engine e(fx().model);
  e.add_request(1, random_tokens(4, 14), greedy(30));
  const size_t first_events = e.step().size();
  auto with = [](auto mutate) {
    RequestOptions o = greedy(4);
    mutate(o);
    return o;
  };
  const auto p = random_tokens(4, 15);
  expect_value_error([&] { e.add_request(2, {}, greedy(4)); }, "prompt_ids");
  expect_value_error([&] { e.add_request(2, {1, 97}, greedy(4)); }, "prompt_ids'[1] = 97");
  expect_value_error([&] { e.add_request(2, {1, -1}, greedy(4)); }, "prompt_ids'[1] = -1");
  expect_value_error([&] { e.add_request(2, p, greedy(0)); }, "max_tokens");
  expect_value_error([&] { e.add_request(2, p, greedy(253)); }, "max_position_embeddings");
  expect_value_error([&] { e.add_request(2, p, with([](auto& o) { o.temperature = -1; })); }, "temperature");
  expect_value_error([&] { e.add_request(2, p, with([](auto& o) { o.top_p = 0; })); }, "top_p");
  expect_value_error([&] { e.add_request(2, p, with([](auto& o) { o.top_p = 1.5f; })); }, "top_p");
  expect_value_error([&] { e.add_request(2, p, with([](auto& o) { o.top_k = -2; })); }, "top_k");
  expect_value_error([&] { e.add_request(2, p, with([](auto& o) { o.stop_token_ids = {200}; })); }, "stop_token_ids");
  expect_value_error([&] { e.add_request(1, p, greedy(4)); }, "request_id");
  expect_value_error([&] { e.logits({}); }, "prompt_ids");
  e.add_request(2, p, greedy(4));
  const auto r = run(e);
  EXPECT_EQ(first_events + r.at(1).tokens.size(), 30u);
  EXPECT_EQ(r.at(2).tokens.size(), 4u);
  EngineConfig bad;
  bad.max_seqs = 0;
  expect_value_error([&] { Engine x(fx().model, bad); }, "max_seqs");
  Model unfinished(fx().cfg, "w16a16");
  expect_value_error([&] { Engine x(unfinished); }, "finalize");
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// A step whose forward throws (here: a recipe whose kernel this build lacks) must leave no reserved
// KV behind; the requests wait again and abort cleanly. Skipped once the kernel exists.
TEST(EngineErrors, FailingStepRequeuesAndFreesKV) {
  Model m(fx().cfg, "w4a4");
  testing_ref::load(m, fx().weights);
  Engine e(m);
  e.add_request(1, random_tokens(20, 16), greedy(3));
  e.add_request(2, random_tokens(5, 17), greedy(3));
  try {
    e.step();
    GTEST_SKIP() << "w4a4 runs on this build: no failing step to test";
  } catch (const Error& err) {
    EXPECT_EQ(int(err.kind()), int(ErrorKind::kNotSupported)) << err.what();
  }
  EngineStats s = e.stats();
  EXPECT_EQ(s.num_free_blocks, s.num_blocks);
  EXPECT_EQ(s.waiting, 2);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.preemptions, 0);
  e.abort(1);
  e.abort(2);
  const auto events = e.step();
  EXPECT_EQ(events.size(), 2u);
  EXPECT_FALSE(e.has_unfinished());
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// Penalties see prompt + generated tokens: with a huge repetition penalty greedy decoding never
// picks a token it has already seen (unseen tokens with positive logits always exist here).
TEST(EngineGenerate, RepetitionPenaltyCoversPromptAndOutput) {
  const auto prompt = random_tokens(12, 18);
  RequestOptions o = greedy(12);
  Engine plain(fx().model);
  plain.add_request(1, prompt, o);
  const auto base = run(plain)[1].tokens;
  o.repetition_penalty = 1e6f;
  Engine e(fx().model);
  e.add_request(1, prompt, o);
  const auto got = run(e)[1].tokens;
  std::vector<int32_t> seen = prompt;
  for (int32_t t : got) {
    EXPECT_EQ(std::count(seen.begin(), seen.end(), t), 0) << "token " << t << " repeated";
    seen.push_back(t);
  }
  std::vector<int32_t> base_seen = prompt;
  bool base_repeats = false;  // the test only means something if plain greedy does repeat
  for (int32_t t : base) {
    base_repeats |= std::count(base_seen.begin(), base_seen.end(), t) > 0;
    base_seen.push_back(t);
  }
  EXPECT_TRUE(base_repeats);
}

// Ending a session while its request runs: the request finishes normally and its KV is freed.
TEST(EngineGenerate, EndSessionWhileRunning) {
  Engine e(fx().model);
  RequestOptions o = greedy(6);
  o.session_id = 4;
  e.add_request(1, random_tokens(10, 19), o);
  e.step();
  e.end_session(4);
  const auto r = run(e);
  EXPECT_EQ(r.at(1).tokens.size() + 1, 6u);  // the first step's event was not collected by run()
  EXPECT_EQ(e.stats().sessions, 0);
  EXPECT_EQ(e.stats().num_free_blocks, e.stats().num_blocks);
}

}  // namespace
}  // namespace lowbit
