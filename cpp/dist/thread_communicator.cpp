// The thread communicator (dist/communicator.h): ranks are threads of this process. Each collective
// publishes a host f32 copy of every rank's tensor, waits for all ranks, and combines them in rank
// order, so every rank gets bit-identical results whatever the thread timing.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "lowbit/dist/communicator.h"

namespace lowbit {
namespace {

// What all ranks of one group share: a reusable barrier and each rank's published buffer.
class ThreadGroup {
 public:
  explicit ThreadGroup(int world) : world_(world), published_(size_t(world), nullptr) {}
  int world() const { return world_; }

  // Blocks until every rank has arrived; throws once the group is aborted.
  void barrier(const char* op) {
    std::unique_lock<std::mutex> lock(mu_);
    check_alive(op);
    const uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    check_alive(op);
  }
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) why_ = why;
    aborted_ = true;
    cv_.notify_all();
  }
  void publish(int rank, const std::vector<float>* buf) { published_[size_t(rank)] = buf; }
  const std::vector<float>& published(int rank) const { return *published_[size_t(rank)]; }

 private:
  void check_alive(const char* op) const {
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !aborted_, op, ": the tensor-parallel group was aborted (", why_, ")");
  }
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
  std::vector<const std::vector<float>*> published_;
};

void check_float(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK_TYPE(t.dtype() == ScalarType::f32 || t.dtype() == ScalarType::f16 || t.dtype() == ScalarType::bf16, op,
                    ": argument '", arg, "' must be f32, f16 or bf16, got ", name_of(t.dtype()));
  check_contiguous(t, op, arg);
}

// The tensor's values as f32 on the host (a copy; device tensors are downloaded).
std::vector<float> read_f32(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  const int64_t n = host.numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (host.dtype()) {
    case ScalarType::f32: std::memcpy(out.data(), host.data_ptr(), size_t(n) * 4); break;
    case ScalarType::f16:
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = f16_bits_to_f32(host.data<uint16_t>()[i]);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = bf16_bits_to_f32(host.data<uint16_t>()[i]);
  }
  return out;
}

// values[offset, offset + t.numel()) into t (rounded to t's dtype, uploaded when t is on a device).
void write_f32(Tensor& t, const std::vector<float>& values, size_t offset) {
  Tensor host = t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype());
  const int64_t n = host.numel();
  const float* v = values.data() + offset;
  switch (host.dtype()) {
    case ScalarType::f32: std::memcpy(host.data_ptr(), v, size_t(n) * 4); break;
    case ScalarType::f16:
      for (int64_t i = 0; i < n; ++i) host.data<uint16_t>()[i] = f32_to_f16_bits(v[i]);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) host.data<uint16_t>()[i] = f32_to_bf16_bits(v[i]);
  }
  if (!t.device().is_cpu()) t.copy_(host);
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world(); }
  std::string backend() const override { return "threads"; }
  bool capturable() const override { return false; }

  void all_reduce_sum(Tensor& t) override {
    constexpr const char* op = "Communicator.all_reduce_sum";
    check_float(t, op, "t");
    const std::vector<float> mine = read_f32(t);
    std::vector<float> sum(mine.size(), 0.f);
    exchange(op, mine, [&] {
      for (int r = 0; r < world_size(); ++r) {
        const std::vector<float>& other = group_->published(r);
        LOWBIT_CHECK(other.size() == mine.size(), op, ": rank ", rank_, " has ", mine.size(), " elements, rank ", r,
                     " has ", other.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += other[i];
      }
    });
    write_f32(t, sum, 0);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    constexpr const char* op = "Communicator.all_gather";
    check_float(in, op, "in");
    check_float(out, op, "out");
    LOWBIT_CHECK(out.numel() == in.numel() * world_size() && out.dtype() == in.dtype(), op, ": argument 'out' must ",
                 "hold ", world_size(), " x ", in.numel(), " elements of ", name_of(in.dtype()), ", got ", out.str());
    const std::vector<float> mine = read_f32(in);
    std::vector<float> all(static_cast<size_t>(out.numel()));
    exchange(op, mine, [&] {
      for (int r = 0; r < world_size(); ++r) {
        const std::vector<float>& other = group_->published(r);
        LOWBIT_CHECK(other.size() == mine.size(), op, ": rank ", rank_, " has ", mine.size(), " elements, rank ", r,
                     " has ", other.size());
        std::copy(other.begin(), other.end(), all.begin() + int64_t(r) * int64_t(mine.size()));
      }
    });
    write_f32(out, all, 0);
  }

  void broadcast(Tensor& t, int root) override {
    constexpr const char* op = "Communicator.broadcast";
    check_float(t, op, "t");
    LOWBIT_CHECK(root >= 0 && root < world_size(), op, ": argument 'root' must be in [0, ", world_size(), "), got ",
                 root);
    const std::vector<float> mine = read_f32(t);
    std::vector<float> got;
    exchange(op, mine, [&] { got = group_->published(root); });
    LOWBIT_CHECK(got.size() == mine.size(), op, ": rank ", rank_, " has ", mine.size(), " elements, root ", root,
                 " has ", got.size());
    write_f32(t, got, 0);
  }

  void abort(const std::string& why) override { group_->abort(why); }

 private:
  // Publish `mine`, wait for every rank, run `combine` (reads the others' buffers), wait again so
  // that no rank's buffer is freed while another still reads it. An error in `combine` aborts the group.
  template <typename F>
  void exchange(const char* op, const std::vector<float>& mine, F&& combine) {
    group_->publish(rank_, &mine);
    group_->barrier(op);
    try {
      combine();
    } catch (const std::exception& e) {
      group_->abort(e.what());
      throw;
    }
    group_->barrier(op);
  }

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_thread_communicators(int world) {
  LOWBIT_CHECK(world >= 1, "make_thread_communicators: argument 'world' must be >= 1, got ", world);
  auto group = std::make_shared<ThreadGroup>(world);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_shared<ThreadCommunicator>(group, r));
  return out;
}

}  // namespace lowbit
