// An Engine over a tensor-parallel group of CPU models (thread communicator): logits against one rank
// and the float64 reference with KV heads split (2 ranks) and replicated (4 ranks over 2 KV heads), an
// uneven vocabulary split, q/k/v biases, greedy generation through the scheduler, and shape errors.
#include <gtest/gtest.h>

#include <cmath>

#include "lowbit/dist/communicator.h"
#include "lowbit/engine/engine.h"
#include "lowbit/model/tensor_parallel_group.h"
#include "test_model_reference.h"

namespace lowbit {
namespace {

using namespace testing_ref;

// Greedy tokens and logprobs of an Engine: one request, `n` tokens.
std::vector<TokenEvent> generate(Engine& e, const std::vector<int32_t>& prompt, int n) {
  RequestOptions o;
  o.max_tokens = n;
  e.add_request(1, prompt, o);
  std::vector<TokenEvent> out;
  while (e.has_unfinished())
    for (TokenEvent& ev : e.step()) out.push_back(ev);
  return out;
}

// A group of `world` CPU models with the weights `w`; each rank keeps its shard.
std::vector<std::unique_ptr<Model>> sharded_models(const ModelConfig& c, const Weights& w, const std::string& recipe,
                                                   int world) {
  auto models = make_tensor_parallel_models(c, recipe, "cpu", "f32", world);
  for (auto& m : models) load(*m, w);
  return models;
}

TEST(TensorParallelEngine, LogitsMatchOneRankAndTheReference) {
  ModelConfig c = tiny_config();  // 4 heads, 2 KV heads: world 2 splits KV heads, world 4 replicates them
  c.tie_word_embeddings = false;  // vocab 97: world 2 and 4 leave the last rank a shorter vocabulary slice
  c.attention_bias = true;
  const Weights w = random_weights(c, 11);
  const std::vector<int32_t> prompt = {5, 17, 3, 88, 42, 9, 61};
  const std::vector<double> ref = reference_logits(c, w, prompt);
  Model one(c, "w16a16", "cpu", "f32");
  load(one, w);
  Engine single(one, EngineConfig{});
  const Tensor base = single.logits(prompt);
  for (int world : {2, 4}) {
    auto models = sharded_models(c, w, "w16a16", world);
    std::vector<const Model*> ranks;
    for (auto& m : models) ranks.push_back(m.get());
    Engine e(ranks, EngineConfig{});
    EXPECT_EQ(e.tensor_parallel(), world);
    const Tensor got = e.logits(prompt);
    ASSERT_EQ(got.shape(), base.shape());
    double err = 0, scale = 0, err_ref = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      err = std::max(err, double(std::abs(got.data<float>()[i] - base.data<float>()[i])));
      err_ref = std::max(err_ref, std::abs(double(got.data<float>()[i]) - ref[size_t(i)]));
      scale = std::max(scale, std::abs(ref[size_t(i)]));
    }
    EXPECT_LT(err / scale, 1e-5) << "world " << world;
    EXPECT_LT(err_ref / scale, 1e-4) << "world " << world;
    // Generation through the scheduler: the same greedy tokens as one rank.
    Engine fresh_single(one, EngineConfig{});
    const auto a = generate(fresh_single, prompt, 12);
    const auto b = generate(e, prompt, 12);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].token, b[i].token) << "world " << world << " token " << i;
      EXPECT_NEAR(a[i].logprob, b[i].logprob, 1e-4);
    }
  }
}

// a8 recipes: a row-parallel linear (o, down) quantizes its input per token on each rank over the rank's own
// channels. The float64 reference with that rule (act_shards) matches within the single-rank test's tolerance, and
// differs from the one-rank rule by more, so the test sees which rule ran.
TEST(TensorParallelEngine, ActivationQuantizedRecipesQuantizePerRank) {
  ModelConfig c = tiny_config();
  c.intermediate_size = 128;  // shards of 64 (down) and 32 (o) input channels: whole groups of 32
  const Weights w = random_weights(c, 21);
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46};
  struct Case {
    const char* recipe;
    WeightFormat format;
    int group;
  };
  for (const Case k : {Case{"w8a8", WeightFormat::w8, 0}, Case{"w4a8g32", WeightFormat::qoq, 32}}) {
    SCOPED_TRACE(k.recipe);
    auto models = sharded_models(c, w, k.recipe, 2);
    Engine e({models[0].get(), models[1].get()}, EngineConfig{});
    const Tensor got = e.logits(prompt);
    const Weights ew = effective_weights(c, w, k.format, k.group, /*quantize_head=*/false);
    const std::vector<double> per_rank = reference_logits(c, ew, prompt, 16, 16, true, /*act_shards=*/2);
    const std::vector<double> one_rank = reference_logits(c, ew, prompt, 16, 16, true, 1);
    double err = 0, rule_gap = 0, scale = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      err = std::max(err, std::abs(double(got.data<float>()[i]) - per_rank[size_t(i)]));
      rule_gap = std::max(rule_gap, std::abs(one_rank[size_t(i)] - per_rank[size_t(i)]));
      scale = std::max(scale, std::abs(per_rank[size_t(i)]));
    }
    EXPECT_LT(err / scale, 1e-4);
    EXPECT_GT(rule_gap / scale, 1e-3);
  }
}

TEST(TensorParallelEngine, ShapeErrorsNameTheField) {
  ModelConfig c = tiny_config();
  auto comms = make_thread_communicators(3);  // 4 heads do not split three ways
  Model m(c, "w16a16", "cpu", "f32");
  try {
    m.set_tensor_parallel(comms[0]);
    FAIL() << "4 heads over 3 ranks must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 attention heads"), std::string::npos) << e.what();
  }
  // Models of a group given out of order.
  const Weights w = random_weights(c, 2);
  auto models = sharded_models(c, w, "w16a16", 2);
  EXPECT_THROW(Engine({models[1].get(), models[0].get()}, EngineConfig{}), Error);
  EXPECT_THROW(make_tensor_parallel_models(c, "w16a16", "cpu", "f32", 2, "nccl"), Error);  // NCCL needs GPUs
  // A weight quantized with a group that the shard would cut (intermediate 96 / 2 = 48, group 32).
  Model g(c, "w4a16g32", "cpu", "f32");
  g.set_tensor_parallel(make_thread_communicators(2)[0]);
  try {
    g.set_weight("model.layers.0.mlp.down_proj.weight", w.at("model.layers.0.mlp.down_proj.weight"));
    FAIL() << "a g32 down_proj split at 48 input channels must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lowbit
