// RankThreads (engine/rank_threads.h).
#include "engine/rank_threads.h"

#include <chrono>

#include "lowbit/core/error.h"

namespace lowbit {

RankThreads::RankThreads(int world, std::function<void(int)> bind, bool spin)
    : world_(world), spin_(spin), bind_(std::move(bind)) {
  LOWBIT_CHECK(world >= 1, "RankThreads: world must be >= 1, got ", world);
  if (world_ > 1)
    for (int r = 0; r < world_; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

// Returns once ready() holds or kSpinMicros have passed (the caller then blocks on cv_ as without spinning).
template <class Ready>
void RankThreads::spin_until(Ready ready) const {
  if (!spin_) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
  for (int i = 0; !ready(); ++i) {
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return;
    std::this_thread::yield();
  }
}

void RankThreads::run(const std::function<void(int)>& fn, const std::function<void(const std::string&)>& on_error) {
  if (world_ == 1) {
    fn(0);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  on_error_ = &on_error;
  first_error_ = nullptr;
  pending_ = world_;
  ++generation_;
  cv_.notify_all();
  lock.unlock();
  spin_until([&] { return pending_.load() == 0; });
  lock.lock();
  cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  on_error_ = nullptr;
  if (first_error_) std::rethrow_exception(first_error_);
}

void RankThreads::loop(int rank) {
  std::exception_ptr bind_error;
  try {
    if (bind_) bind_(rank);
  } catch (...) {
    bind_error = std::current_exception();  // reported by every job of this rank
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    const std::function<void(const std::string&)>* on_error;
    {
      spin_until([&] { return stop_.load() || generation_.load() != seen; });
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      on_error = on_error_;
    }
    std::exception_ptr error = bind_error;
    if (!error) {
      try {
        (*job)(rank);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {
      std::string what = "rank " + std::to_string(rank) + " failed";
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        what = "rank " + std::to_string(rank) + ": " + e.what();
      } catch (...) {
      }
      bool first;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = !first_error_;
        if (first) first_error_ = error;
      }
      if (first && on_error && *on_error) (*on_error)(what);  // outside the lock: it wakes the other ranks
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) cv_.notify_all();
  }
}

}  // namespace lowbit
