// The thread communicator (dist/communicator.h) against float64: all-reduce, all-gather and broadcast
// for 1-4 ranks, half precision, and an abort that wakes a rank waiting for a peer that never comes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "lowbit/dist/communicator.h"
#include "random_tensor.h"

namespace lowbit {
namespace {

using testing_data::random_tensor;

// Runs fn(rank) on `world` threads at once.
template <typename F>
void on_ranks(int world, F fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

TEST(ThreadCommunicator, AllReduceGatherBroadcastMatchFloat64) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = make_thread_communicators(world);
    const int64_t n = 1037;  // odd on purpose
    const size_t ranks = static_cast<size_t>(world);
    std::vector<Tensor> x(ranks), gathered(ranks), bcast(ranks);
    std::vector<double> sum(static_cast<size_t>(n), 0.0);
    std::mt19937 rng(uint32_t(7 + world));
    for (int r = 0; r < world; ++r) {
      x[size_t(r)] = random_tensor({n}, rng, -3.f, 3.f);
      bcast[size_t(r)] = random_tensor({n}, rng, -3.f, 3.f);
      gathered[size_t(r)] = Tensor::empty({world * n}, ScalarType::f32);
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += x[size_t(r)].data<float>()[i];
    }
    std::vector<Tensor> inputs;
    for (const Tensor& t : x) inputs.push_back(t.clone());
    const Tensor root_values = bcast[size_t(world - 1)].clone();
    on_ranks(world, [&](int r) {
      comms[size_t(r)]->all_gather(inputs[size_t(r)], gathered[size_t(r)]);
      comms[size_t(r)]->all_reduce_sum(x[size_t(r)]);
      comms[size_t(r)]->broadcast(bcast[size_t(r)], world - 1);
    });
    for (int r = 0; r < world; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(x[size_t(r)].data<float>()[i], sum[size_t(i)], 1e-5 * world) << "world " << world << " rank " << r;
        // every rank gets the same bits
        ASSERT_EQ(x[size_t(r)].data<float>()[i], x[0].data<float>()[i]);
        ASSERT_EQ(bcast[size_t(r)].data<float>()[i], root_values.data<float>()[i]);
      }
      for (int q = 0; q < world; ++q)
        ASSERT_EQ(0, std::memcmp(gathered[size_t(r)].data<float>() + q * n, inputs[size_t(q)].data_ptr(), size_t(n) * 4));
    }
  }
}

TEST(ThreadCommunicator, HalfPrecisionAndErrors) {
  auto comms = make_thread_communicators(2);
  Tensor a = Tensor::empty({5}, ScalarType::f16), b = Tensor::empty({5}, ScalarType::f16);
  for (int i = 0; i < 5; ++i) {
    a.data<uint16_t>()[i] = f32_to_f16_bits(0.5f * float(i) + 0.25f);
    b.data<uint16_t>()[i] = f32_to_f16_bits(-1.5f + float(i));
  }
  on_ranks(2, [&](int r) { comms[size_t(r)]->all_reduce_sum(r == 0 ? a : b); });
  for (int i = 0; i < 5; ++i) EXPECT_EQ(f16_bits_to_f32(a.data<uint16_t>()[i]), 1.5f * float(i) - 1.25f);
  Tensor ints = Tensor::empty({4}, ScalarType::s32);
  EXPECT_THROW(comms[0]->all_reduce_sum(ints), Error);
}

TEST(ThreadCommunicator, AbortWakesAWaitingRank) {
  auto comms = make_thread_communicators(2);
  Tensor t = Tensor::zeros({8}, ScalarType::f32);
  std::string error;
  std::thread waiter([&] {
    try {
      comms[0]->all_reduce_sum(t);  // rank 1 never joins
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[1]->abort("rank 1 raised");
  waiter.join();
  EXPECT_NE(error.find("aborted (rank 1 raised)"), std::string::npos) << error;
  EXPECT_THROW(comms[1]->all_reduce_sum(t), Error);  // and it stays aborted
}


}  // namespace
}  // namespace lowbit
