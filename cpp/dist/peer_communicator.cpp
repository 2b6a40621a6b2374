// The one-shot all-reduce group (peer_communicator.h, kernel: cuda/allreduce_oneshot.h).
//
// A wrapper around the NCCL communicators rather than a branch inside them: the NCCL class stays a plain binding of
// NCCL, this one owns the peer buffers and their lifetime, and everything it does not do (large all-reduces,
// all_gather, broadcast, abort of NCCL's work) is handed to the NCCL rank it wraps, in the same stream order.
#include "dist/peer_communicator.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#if defined(LOWBIT_WITH_NCCL) && defined(LOWBIT_WITH_CUDA)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>

#include "cuda/allreduce_norm_push.h"
#include "cuda/allreduce_oneshot.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit {

int64_t oneshot_bound(int64_t requested) {
  constexpr const char* op = "make_nccl_communicators";
  LOWBIT_CHECK(requested >= -1 && requested <= kOneShotCapacityBytes, op, ": argument 'oneshot_max_bytes' must be -1 ",
               "(default), 0 (off) or a byte count <= ", kOneShotCapacityBytes, ", got ", requested);
  if (requested >= 0) return requested;
  const char* on = std::getenv("LOWBIT_TP_ONESHOT");
  if (on && std::string(on) == "0") return 0;
  const char* bound = std::getenv("LOWBIT_TP_ONESHOT_MAX_BYTES");
  if (!bound || !*bound) return kOneShotDefaultBytes;
  char* end = nullptr;
  const long long v = std::strtoll(bound, &end, 10);
  LOWBIT_CHECK(*end == '\0' && v >= 0 && v <= kOneShotCapacityBytes, op, ": LOWBIT_TP_ONESHOT_MAX_BYTES must be a ",
               "byte count in [0, ", kOneShotCapacityBytes, "], got '", bound, "'");
  return v;
}

#if defined(LOWBIT_WITH_NCCL) && defined(LOWBIT_WITH_CUDA)
namespace {

// The group's device memory, shared by its ranks' communicators; freed with the last of them.
class PeerBuffers {
 public:
  PeerBuffers(const std::vector<int>& devices, int64_t max_bytes) : devices_(devices) {
    constexpr const char* op = "make_nccl_communicators (one-shot all-reduce)";
    const int world = int(devices.size());
    args_.world = world;
    args_.max_blocks = cuda::kOneShotMaxBlocks;
    for (int d : devices) {
      int sms = 0;
      LOWBIT_CUDA_CHECK(op, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
      args_.max_blocks = std::min(args_.max_blocks, sms);  // every block resident at once on every GPU
    }
    // whole 16-byte packs per block slot, at least one pack per thread of a full block (256 threads)
    const int64_t unit = 16 * int64_t(args_.max_blocks);
    args_.capacity = std::max<int64_t>((max_bytes + unit - 1) / unit * unit, 256 * unit);
    push_.world = world;
    // the fused norm takes decode-sized calls only (each byte of bound costs every rank 4 x world bytes of inbox)
    push_.capacity = (std::min<int64_t>(max_bytes, kOneShotDefaultBytes) + 15) / 16 * 16;
    try {
      LOWBIT_CUDA_CHECK(op, cudaHostAlloc(reinterpret_cast<void**>(&abort_), sizeof(int),
                                          cudaHostAllocMapped | cudaHostAllocPortable));
      *abort_ = 0;
      args_.abort = push_.abort = abort_;  // unified addressing: the host pointer is valid on every device
      for (int r = 0; r < world; ++r) {
        LOWBIT_CUDA_CHECK(op, cudaSetDevice(devices[size_t(r)]));
        LOWBIT_CUDA_CHECK(op, cudaMalloc(&args_.staging[r], size_t(2 * args_.capacity)));
        LOWBIT_CUDA_CHECK(op, cudaMalloc(reinterpret_cast<void**>(&args_.flags[r]), kFlagBytes));
        LOWBIT_CUDA_CHECK(op, cudaMalloc(reinterpret_cast<void**>(&counters_[r]), kCounterBytes));
        LOWBIT_CUDA_CHECK(op, cudaMemset(args_.flags[r], 0, kFlagBytes));
        LOWBIT_CUDA_CHECK(op, cudaMemset(counters_[r], 0, kCounterBytes));
        // the fused norm's inbox (cuda/allreduce_norm_push.h): zero flags never match a step (steps start at 1)
        const int64_t inbox = cuda::push_norm_inbox_bytes(world, push_.capacity);
        LOWBIT_CUDA_CHECK(op, cudaMalloc(&push_.inbox[r], size_t(inbox)));
        LOWBIT_CUDA_CHECK(op, cudaMalloc(reinterpret_cast<void**>(&push_counters_[r]), kPushCounterBytes));
        LOWBIT_CUDA_CHECK(op, cudaMemset(push_.inbox[r], 0, size_t(inbox)));
        LOWBIT_CUDA_CHECK(op, cudaMemset(push_counters_[r], 0, kPushCounterBytes));
        LOWBIT_CUDA_CHECK(op, cudaDeviceSynchronize());  // zeroed before any rank's stream (maybe non-blocking) runs
      }
    } catch (...) {
      release();  // what was allocated before the failure
      throw;
    }
  }
  ~PeerBuffers() { release(); }
  PeerBuffers(const PeerBuffers&) = delete;
  PeerBuffers& operator=(const PeerBuffers&) = delete;

  cuda::OneShotArgs args_for(int rank) const {
    cuda::OneShotArgs a = args_;
    a.rank = rank;
    a.counters = counters_[rank];
    return a;
  }
  cuda::PushNormArgs push_args_for(int rank) const {
    cuda::PushNormArgs a = push_;
    a.rank = rank;
    a.own_inbox = push_.inbox[rank];
    a.counters = push_counters_[rank];
    return a;
  }
  int64_t max_message_bytes() const { return cuda::oneshot_max_message_bytes(args_); }
  // Releases every rank's waiting kernel (they leave garbage; the group is failed anyway).
  void abort() { *static_cast<volatile int*>(abort_) = 1; }

 private:
  void release() {
    int previous = 0;
    cudaGetDevice(&previous);
    for (size_t r = 0; r < devices_.size(); ++r) {
      cudaSetDevice(devices_[r]);
      if (args_.staging[r]) cudaFree(args_.staging[r]);
      if (args_.flags[r]) cudaFree(args_.flags[r]);
      if (counters_[r]) cudaFree(counters_[r]);
      if (push_.inbox[r]) cudaFree(push_.inbox[r]);
      if (push_counters_[r]) cudaFree(push_counters_[r]);
    }
    if (abort_) cudaFreeHost(abort_);
    cudaSetDevice(previous);
    (void)cudaGetLastError();
  }

  static constexpr size_t kFlagBytes = sizeof(uint32_t) * cuda::kOneShotMaxBlocks * cuda::kOneShotMaxWorld;
  static constexpr size_t kCounterBytes = sizeof(uint32_t) * cuda::kOneShotMaxBlocks;
  static constexpr size_t kPushCounterBytes = 2 * sizeof(uint32_t);
  std::vector<int> devices_;
  cuda::OneShotArgs args_;
  uint32_t* counters_[cuda::kOneShotMaxWorld] = {};
  cuda::PushNormArgs push_;  // the fused norm's inboxes (one per rank, in its GPU's memory)
  uint32_t* push_counters_[cuda::kOneShotMaxWorld] = {};
  int* abort_ = nullptr;
};

class PeerCommunicator final : public Communicator {
 public:
  PeerCommunicator(std::shared_ptr<Communicator> nccl, std::shared_ptr<PeerBuffers> buffers, int device,
                   int64_t max_bytes, bool fused_norm)
      : nccl_(std::move(nccl)), buffers_(std::move(buffers)), args_(buffers_->args_for(nccl_->rank())),
        push_(buffers_->push_args_for(nccl_->rank())), device_(device), max_bytes_(max_bytes), fused_norm_(fused_norm) {}
  int rank() const override { return nccl_->rank(); }
  int world_size() const override { return nccl_->world_size(); }
  std::string backend() const override { return "nccl"; }
  std::string all_reduce_name() const override {
    return "one-shot peer memory <= " + std::to_string(max_bytes_ >> 10) + " KiB" +
           (fused_norm_ ? " (fused with the residual add and RMSNorm)" : "") + ", nccl above";
  }
  bool capturable() const override { return true; }

  void all_reduce_sum(Tensor& t) override {
    constexpr const char* op = "Communicator.all_reduce_sum";
    const bool float_type = t.defined() && (t.dtype() == ScalarType::f32 || t.dtype() == ScalarType::f16 ||
                                            t.dtype() == ScalarType::bf16);
    if (!float_type || t.numel() * int64_t(t.dtype() == ScalarType::f32 ? 4 : 2) > max_bytes_) {
      nccl_->all_reduce_sum(t);  // large messages; other types raise there with NCCL's message
      return;
    }
    check_contiguous(t, op, "t");
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !aborted_, op, ": the tensor-parallel group was aborted after an error ",
                      "on another rank");
    LOWBIT_CHECK_TYPE(t.device().is_cuda(), op, ": argument 't' must be on a CUDA device, got ", t.str());
    LOWBIT_CHECK(t.device().index == device_, op, ": rank ", rank(), " runs on cuda:", device_, ", the tensor is on ",
                 t.device().str());
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device_));
    cuda::oneshot_all_reduce(args_, t.data_ptr(), t.numel(), t.dtype(), cuda::current_stream());
  }
  bool all_reduce_add_rms_norm(const Tensor& partial, Tensor& residual, const Tensor& weight, float eps, Tensor& out,
                               Tensor& q, Tensor& scales) override {
    constexpr const char* op = "Communicator.all_reduce_add_rms_norm";
    if (!fused_norm_ || !partial.defined() || partial.dim() != 2 || !residual.defined() || !weight.defined())
      return false;
    cuda::ReduceNormRows n;
    n.rows = partial.size(0);
    n.cols = partial.size(1);
    n.dtype = partial.dtype();
    n.weight_dtype = weight.dtype();
    const bool float_rows = n.dtype == ScalarType::f32 || n.dtype == ScalarType::f16 || n.dtype == ScalarType::bf16;
    // the same bound as all_reduce_sum (above it NCCL is as fast), and what the kernel takes (shapes only)
    if (!float_rows || n.rows * n.cols * (n.dtype == ScalarType::f32 ? 4 : 2) > max_bytes_) return false;
    const bool codes = !out.defined();
    const Tensor& rows_out = codes ? q : out;
    if (residual.dtype() != n.dtype || residual.dim() != 2 || residual.size(0) != n.rows ||
        residual.size(1) != n.cols || weight.numel() != n.cols || !rows_out.defined() || rows_out.dim() != 2 ||
        rows_out.size(0) != n.rows || rows_out.size(1) != n.cols || (!codes && out.dtype() != n.dtype) ||
        (codes && (!scales.defined() || scales.dtype() != ScalarType::f32 || scales.numel() != n.rows)))
      return false;  // shapes the plain ops check and explain
    if (partial.stride(1) != 1 || residual.stride(1) != 1 || rows_out.stride(1) != 1) return false;
    if (!weight.is_contiguous()) return false;
    n.ld_partial = partial.stride(0);
    n.ld_residual = residual.stride(0);
    n.eps = eps;
    n.partial = partial.data_ptr();
    n.residual = residual.data_ptr();
    n.weight = weight.data_ptr();
    if (codes) {
      n.q = q.data_ptr();
      n.ldq = q.stride(0);
      n.q_type = q.dtype();
      n.scales = static_cast<float*>(scales.data_ptr());
    } else {
      n.out = out.data_ptr();
      n.ld_out = out.stride(0);
    }
    if (!cuda::push_add_rms_norm_fits(push_, n)) return false;
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !aborted_, op, ": the tensor-parallel group was aborted after an error ",
                      "on another rank");
    const Tensor* all[] = {&partial, &residual, &weight, &rows_out, &scales};
    for (const Tensor* t : all)
      LOWBIT_CHECK(!t->defined() || (t->device().is_cuda() && t->device().index == device_), op, ": rank ", rank(),
                   " runs on cuda:", device_, ", a tensor is on ", t->device().str());
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device_));
    cuda::push_add_rms_norm(push_, n, cuda::current_stream());
    return true;
  }
  void all_gather(const Tensor& in, Tensor& out) override { nccl_->all_gather(in, out); }
  void broadcast(Tensor& t, int root) override { nccl_->broadcast(t, root); }
  void abort(const std::string& why) override {
    if (aborted_.exchange(true)) return;
    buffers_->abort();
    nccl_->abort(why);
  }

 private:
  std::shared_ptr<Communicator> nccl_;
  std::shared_ptr<PeerBuffers> buffers_;
  const cuda::OneShotArgs args_;
  const cuda::PushNormArgs push_;
  const int device_;
  const int64_t max_bytes_;
  const bool fused_norm_;  // all_reduce_add_rms_norm in one kernel (on unless LOWBIT_TP_FUSED_NORM=0)
  std::atomic<bool> aborted_{false};
};

// The first pair of `devices` without peer access, or {-1, -1}.
std::pair<int, int> missing_peer_access(const std::vector<int>& devices) {
  for (int a : devices)
    for (int b : devices) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) {
        (void)cudaGetLastError();
        return {a, b};
      }
    }
  return {-1, -1};
}

void enable_peer_access(const std::vector<int>& devices) {
  constexpr const char* op = "make_nccl_communicators (one-shot all-reduce)";
  for (int a : devices) {
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(a));
    for (int b : devices) {
      if (a == b) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // NCCL or an earlier group enabled it: fine
        continue;
      }
      LOWBIT_CUDA_CHECK(op, e);
    }
  }
}

}  // namespace

std::vector<std::shared_ptr<Communicator>> with_oneshot_all_reduce(std::vector<std::shared_ptr<Communicator>> nccl,
                                                                   const std::vector<int>& devices, int64_t max_bytes) {
  const int world = int(devices.size());
  if (max_bytes == 0 || world < 2 || world > cuda::kOneShotMaxWorld) return nccl;
  const auto [a, b] = missing_peer_access(devices);
  if (a >= 0) {
    static std::once_flag said;
    std::call_once(said, [&, a = a, b = b] {
      std::fprintf(stderr, "lowbit: tensor parallel: cuda:%d cannot access cuda:%d's memory (no peer access); "
                   "all-reduce over NCCL only\n", a, b);
    });
    return nccl;
  }
  int previous = 0;
  LOWBIT_CUDA_CHECK("make_nccl_communicators", cudaGetDevice(&previous));
  enable_peer_access(devices);
  auto buffers = std::make_shared<PeerBuffers>(devices, max_bytes);
  LOWBIT_CUDA_CHECK("make_nccl_communicators", cudaSetDevice(previous));
  // On unless LOWBIT_TP_FUSED_NORM=0: on 2x H200 the pushed kernel is 1.7-3.4% faster per batch-1 token than the
  // one-shot all-reduce + add_rms_norm (docs/benchmarks_gpu.md, issue 20).
  const char* fused = std::getenv("LOWBIT_TP_FUSED_NORM");
  const bool fused_norm = !(fused && std::string(fused) == "0");
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r)
    out.push_back(std::make_shared<PeerCommunicator>(nccl[size_t(r)], buffers, devices[size_t(r)],
                                                     std::min(max_bytes, buffers->max_message_bytes()), fused_norm));
  return out;
}
#endif

}  // namespace lowbit
