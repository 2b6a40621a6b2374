// RankThreads: one persistent host thread per tensor-parallel rank. run(fn) calls fn(rank) on every
// rank's thread at once and waits; the ranks' collectives meet each other inside fn. With one rank,
// fn runs on the caller's thread.
//
// Why threads in one process rather than a process per GPU: the engine (scheduler, paged-block
// allocator, prefix cache, sampler, sessions) exists once and hands the same host-side batch to every
// rank, so the ranks never need to agree on scheduling or exchange sampled tokens: rank 0's tokens are
// simply the next step's input of every rank. NCCL's single-process mode (ncclCommInitAll) gives each
// thread its GPU's communicator; a library embedded by other stacks stays one object to create.
//
// Hand-offs spin before they block (GPU ranks only): a decode step crosses from the engine to the rank threads
// and back every few hundred microseconds, and a blocked thread's wake-up cost tens of them (measured on 2x H200:
// the host's share of a TP=2 batch-1 step 0.127 ms against 0.035 ms at TP=1). CPU ranks block at once: their
// spinning threads would take cores from the ranks' own compute.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lowbit {

class RankThreads {
 public:
  // `bind(rank)` runs once on each rank's thread before any job (e.g. selects the rank's GPU). `spin`: waits spin
  // for up to kSpinMicros before they block.
  RankThreads(int world, std::function<void(int)> bind, bool spin = false);
  static constexpr int kSpinMicros = 20000;
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int world() const { return world_; }
  // Runs fn(rank) on every rank and waits for all of them. When a rank throws, `on_error(message)` runs
  // at once (it must unblock ranks waiting in a collective: abort the communicators), the others are
  // awaited, and the first exception is rethrown.
  void run(const std::function<void(int)>& fn, const std::function<void(const std::string&)>& on_error);

 private:
  void loop(int rank);
  template <class Ready>
  void spin_until(Ready ready) const;

  const int world_;
  const bool spin_;
  std::function<void(int)> bind_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;
  const std::function<void(const std::string&)>* on_error_ = nullptr;
  // Written under mu_; atomics so that a spinning wait may read them without it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr first_error_;
};

}  // namespace lowbit
