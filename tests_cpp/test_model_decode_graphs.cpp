// The bucketing of CUDA-graph decode steps (model/decode_graphs.h) and the refusals of decode_step,
// decode_launch and decode_wait on the CPU. The graphs themselves need a GPU: tests_py/test_gpu_engine.py
// and test_gpu_overlap_steps.py run them there.
#include <gtest/gtest.h>

#include <memory>

#include "model/decode_graphs.h"
#include "test_model_reference.h"

namespace lowbit {
namespace {

TEST(DecodeGraphs, BatchBucketsArePowersOfTwoCappedAtMaxRows) {
  const int64_t expected[][3] = {{1, 64, 1}, {2, 64, 2}, {3, 64, 4}, {5, 64, 8}, {17, 64, 32},
                                 {33, 64, 64}, {64, 64, 64}, {40, 48, 48}, {33, 48, 48}, {7, 6, 6}};
  for (const auto& e : expected) EXPECT_EQ(decode_batch_bucket(e[0], e[1]), e[2]) << e[0] << " of " << e[1];
  for (int64_t n = 1; n <= 100; ++n) EXPECT_GE(decode_batch_bucket(n, 100), n);
}

TEST(DecodeGraphs, ContextBucketsStartAt256AndCapAtTheLongestSequence) {
  const int64_t expected[][3] = {{1, 8192, 256}, {256, 8192, 256}, {257, 8192, 512}, {4000, 8192, 4096},
                                 {8191, 8192, 8192}, {300, 300, 300}, {5000, 6000, 6000}};
  for (const auto& e : expected) EXPECT_EQ(decode_kv_bucket(e[0], e[1]), e[2]) << e[0] << " of " << e[1];
}

// A tiny finalized model on the CPU with its cache and workspace.
class DecodeGraphsOnCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    testing_ref::load(m, testing_ref::random_weights(c, 1));
    cache = std::make_unique<KVCache>(m.kv_cache_config(8, 16));
    ws = m.make_workspace(16, 16);
  }
  ModelConfig c = testing_ref::tiny_config();
  Model m{c, "w16a16"};
  std::unique_ptr<KVCache> cache;
  ModelWorkspace ws;
};

TEST_F(DecodeGraphsOnCpu, DecodeStepNeedsACudaModel) {
  EXPECT_EQ(m.max_decode_rows(ws), 0);
  ForwardBatch b;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  try {
    m.decode_step(b, {}, *cache, ws, tokens, logprobs);
    FAIL() << "decode_step ran on a CPU model";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}

TEST_F(DecodeGraphsOnCpu, LaunchAndWaitNeedACudaModelAndALaunchedStep) {
  ForwardBatch b;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  EXPECT_THROW(m.decode_launch(b, {}, {}, DecodeFeedSource{}, *cache, ws), Error);
  try {  // nothing was launched: the wait must say so (a CPU build: that graphs need CUDA)
    m.decode_wait(ws, tokens, logprobs);
    FAIL() << "decode_wait returned without a launched step";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("in flight") != std::string::npos || what.find("CUDA") != std::string::npos) << what;
  }
  EXPECT_EQ(m.decode_feed_source(ws).tokens, nullptr);  // no graphs, no tokens to feed
}

}  // namespace
}  // namespace lowbit
