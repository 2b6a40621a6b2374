// RankThreads (engine/rank_threads.h): every rank runs at once; a rank that throws while another waits in a
// collective aborts the group instead of hanging, and the first error is the one rethrown.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "engine/rank_threads.h"
#include "lowbit/dist/communicator.h"

namespace lowbit {
namespace {

TEST(RankThreads, RunsEveryRankConcurrentlyAndBindsOnce) {
  std::atomic<int> binds{0};
  RankThreads threads(3, [&](int) { ++binds; });
  auto comms = make_thread_communicators(3);
  for (int round = 0; round < 5; ++round) {
    std::vector<float> got(3, 0.f);
    threads.run(
        [&](int r) {
          Tensor t = Tensor::empty({4}, ScalarType::f32);
          for (int i = 0; i < 4; ++i) t.data<float>()[i] = float(r + 1);
          comms[size_t(r)]->all_reduce_sum(t);  // needs all three ranks at once
          got[size_t(r)] = t.data<float>()[3];
        },
        [](const std::string&) {});
    EXPECT_EQ(got, std::vector<float>(3, 6.f));
  }
  EXPECT_EQ(binds.load(), 3);
}

TEST(RankThreads, AFailingRankAbortsTheOthersInsteadOfHanging) {
  RankThreads threads(2, nullptr);
  auto comms = make_thread_communicators(2);
  std::string aborted_with;
  try {
    threads.run(
        [&](int r) {
          if (r == 1) throw Error(ErrorKind::kNotSupported, "rank 1 has no kernel");
          Tensor t = Tensor::zeros({4}, ScalarType::f32);
          comms[0]->all_reduce_sum(t);  // rank 1 never joins
        },
        [&](const std::string& why) {
          aborted_with = why;
          for (auto& c : comms) c->abort(why);
        });
    FAIL() << "the run must rethrow rank 1's error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 1 has no kernel");  // the cause, not the abort it caused
    EXPECT_EQ(e.kind(), ErrorKind::kNotSupported);
  }
  EXPECT_EQ(aborted_with, "rank 1: rank 1 has no kernel");
}

}  // namespace
}  // namespace lowbit
