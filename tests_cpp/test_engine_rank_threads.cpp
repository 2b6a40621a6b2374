// RankThreads (engine/rank_threads.h): every rank runs at once; a rank that throws while another waits in a
// collective aborts the group instead of hanging, and the first error is the one rethrown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "engine/rank_threads.h"
#include "lowbit/dist/communicator.h"

namespace lowbit {
namespace {

class RankThreadsBothWaits : public ::testing::TestWithParam<bool> {};  // blocking, spinning hand-offs

TEST_P(RankThreadsBothWaits, RunsEveryRankConcurrentlyAndBindsOnce) {
  std::atomic<int> binds{0};
  RankThreads threads(3, [&](int) { ++binds; }, GetParam());
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

TEST_P(RankThreadsBothWaits, AFailingRankAbortsTheOthersInsteadOfHanging) {
  RankThreads threads(2, nullptr, GetParam());
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

// Many short jobs back to back (the decode loop's rhythm) and a pause longer than the spin (the waits block, then
// wake): every rank runs every job once, in order.
TEST_P(RankThreadsBothWaits, ManyShortJobsAndAPause) {
  RankThreads threads(2, nullptr, GetParam());
  std::vector<int> runs(2, 0);
  for (int job = 0; job < 2000; ++job) {
    if (job == 1000) std::this_thread::sleep_for(std::chrono::microseconds(2 * RankThreads::kSpinMicros));
    threads.run([&](int r) { EXPECT_EQ(runs[size_t(r)]++, job); }, [](const std::string&) {});
  }
  EXPECT_EQ(runs, std::vector<int>(2, 2000));
}

INSTANTIATE_TEST_SUITE_P(Waits, RankThreadsBothWaits, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "spin" : "block"; });

}  // namespace
}  // namespace lowbit
