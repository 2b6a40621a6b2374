// The NCCL communicator (dist/communicator.h): one rank per GPU of this process, collectives enqueued
// on the calling thread's current stream, so a decode step's CUDA graph captures them with the rest.
#include "lowbit/dist/communicator.h"

#include "dist/peer_communicator.h"

#ifdef LOWBIT_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <set>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit {

#ifdef LOWBIT_WITH_NCCL
namespace {

#define LOWBIT_NCCL_CHECK(op, call)                                                                      \
  do {                                                                                                    \
    const ncclResult_t _r = (call);                                                                       \
    LOWBIT_CHECK_KIND(::lowbit::ErrorKind::kRuntime, _r == ncclSuccess, op, ": NCCL error ", int(_r), " (", \
                      ncclGetErrorString(_r), ")");                                                       \
  } while (0)

ncclDataType_t nccl_type(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  check_contiguous(t, op, arg);
  LOWBIT_CHECK_TYPE(t.device().is_cuda(), op, ": argument '", arg, "' must be on a CUDA device, got ", t.str());
  switch (t.dtype()) {
    case ScalarType::f32: return ncclFloat32;
    case ScalarType::f16: return ncclFloat16;
    case ScalarType::bf16: return ncclBfloat16;
    default:
      LOWBIT_FAIL(ErrorKind::kType, op, ": argument '", arg, "' must be f32, f16 or bf16, got ", name_of(t.dtype()));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int world, int device)
      : comm_(comm), rank_(rank), world_(world), device_(device) {}
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }
  bool capturable() const override { return true; }

  void all_reduce_sum(Tensor& t) override {
    constexpr const char* op = "Communicator.all_reduce_sum";
    const ncclDataType_t type = nccl_type(t, op, "t");
    enter(op, t);
    LOWBIT_NCCL_CHECK(op, ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), type, ncclSum, comm_,
                                        cuda::current_stream()));
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    constexpr const char* op = "Communicator.all_gather";
    const ncclDataType_t type = nccl_type(in, op, "in");
    nccl_type(out, op, "out");
    LOWBIT_CHECK(out.numel() == in.numel() * world_ && out.dtype() == in.dtype(), op, ": argument 'out' must hold ",
                 world_, " x ", in.numel(), " elements of ", name_of(in.dtype()), ", got ", out.str());
    enter(op, in);
    LOWBIT_NCCL_CHECK(op, ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), type, comm_,
                                        cuda::current_stream()));
  }
  void broadcast(Tensor& t, int root) override {
    constexpr const char* op = "Communicator.broadcast";
    const ncclDataType_t type = nccl_type(t, op, "t");
    LOWBIT_CHECK(root >= 0 && root < world_, op, ": argument 'root' must be in [0, ", world_, "), got ", root);
    enter(op, t);
    LOWBIT_NCCL_CHECK(op, ncclBroadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()), type, root, comm_,
                                        cuda::current_stream()));
  }
  // Stops this rank's outstanding NCCL work so that no stream waits forever on a peer that raised.
  void abort(const std::string&) override {
    if (aborted_.exchange(true)) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void enter(const char* op, const Tensor& t) {
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !aborted_, op, ": the tensor-parallel group was aborted after an error ",
                      "on another rank");
    LOWBIT_CHECK(t.device().index == device_, op, ": rank ", rank_, " runs on cuda:", device_, ", the tensor is on ",
                 t.device().str());
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device_));
  }
  ncclComm_t comm_;
  int rank_, world_, device_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

bool nccl_available(std::string* why) {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
    if (why) *why = "ncclGetVersion failed (is libnccl.so.2 loadable?)";
    return false;
  }
  return true;
}

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices,
                                                                   int64_t oneshot_max_bytes) {
  constexpr const char* op = "make_nccl_communicators";
  LOWBIT_CHECK(!devices.empty(), op, ": argument 'devices' is empty");
  const int64_t oneshot = oneshot_bound(oneshot_max_bytes);
  int count = 0;
  LOWBIT_CUDA_CHECK(op, cudaGetDeviceCount(&count));
  std::set<int> seen;
  for (int d : devices) {
    LOWBIT_CHECK(d >= 0 && d < count, op, ": cuda:", d, " does not exist (", count, " CUDA device(s) visible)");
    LOWBIT_CHECK(seen.insert(d).second, op, ": cuda:", d, " is listed twice; NCCL needs one GPU per rank");
  }
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  LOWBIT_NCCL_CHECK(op, ncclCommInitAll(comms.data(), int(devices.size()), devices.data()));
  std::vector<std::shared_ptr<Communicator>> out;
  for (size_t r = 0; r < devices.size(); ++r)
    out.push_back(std::make_shared<NcclCommunicator>(comms[r], int(r), int(devices.size()), devices[r]));
#ifdef LOWBIT_WITH_CUDA
  return with_oneshot_all_reduce(std::move(out), devices, oneshot);
#else
  return out;
#endif
}

#else

bool nccl_available(std::string* why) {
  if (why) *why = "this build of lowbit has no NCCL (build with the nvidia-nccl-cu13 wheel installed, or point "
                  "LOWBIT_NCCL_ROOT at an NCCL install)";
  return false;
}

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<int>&, int64_t oneshot_max_bytes) {
  oneshot_bound(oneshot_max_bytes);  // a bad argument is reported as such first
  std::string why;
  nccl_available(&why);
  LOWBIT_NOT_SUPPORTED("make_nccl_communicators: tensor parallelism over GPUs is unavailable: ", why);
}

#endif

}  // namespace lowbit
