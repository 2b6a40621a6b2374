// StreamFork (stream_fork.h): the per-thread, per-device side stream and its two events.
#include "kernels/sm90/stream_fork.h"

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

struct Side {
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;
};

// Made on first use on `device` (the current device switched for it and back), never destroyed: a stream or event
// destroyed at thread or process exit could outlive the CUDA context.
const Side& side_of(int device, const char* op) {
  constexpr int kDevices = 64;
  thread_local Side sides[kDevices];
  LOWBIT_CHECK(device >= 0 && device < kDevices, op, ": device ", device, " is past the side streams' ", kDevices);
  Side& s = sides[device];
  if (s.stream == nullptr) {
    int current = 0;
    LOWBIT_CUDA_CHECK(op, cudaGetDevice(&current));
    if (current != device) LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
    int least = 0, greatest = 0;
    Side made;
    cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (err == cudaSuccess) err = cudaStreamCreateWithPriority(&made.stream, cudaStreamNonBlocking, greatest);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&made.forked, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&made.joined, cudaEventDisableTiming);
    if (current != device) cudaSetDevice(current);
    if (err != cudaSuccess) {  // nothing kept: the next call tries again
      if (made.joined) cudaEventDestroy(made.joined);
      if (made.forked) cudaEventDestroy(made.forked);
      if (made.stream) cudaStreamDestroy(made.stream);
    }
    LOWBIT_CUDA_CHECK(op, err);
    s = made;
  }
  return s;
}

}  // namespace

StreamFork::StreamFork(cudaStream_t main, int device, const char* op) : main_(main), op_(op) {
  const Side& s = side_of(device, op);
  LOWBIT_CUDA_CHECK(op, cudaEventRecord(s.forked, main));
  LOWBIT_CUDA_CHECK(op, cudaStreamWaitEvent(s.stream, s.forked, 0));
  side_ = s.stream;
  joined_ = s.joined;
  open_ = true;
}

void StreamFork::join() {
  if (!open_) return;
  open_ = false;
  LOWBIT_CUDA_CHECK(op_, cudaEventRecord(joined_, side_));
  LOWBIT_CUDA_CHECK(op_, cudaStreamWaitEvent(main_, joined_, 0));
}

StreamFork::~StreamFork() {
  if (!open_) return;
  // An error path (an exception on its way): join without throwing; a failure here leaves the first error standing.
  if (cudaEventRecord(joined_, side_) == cudaSuccess) cudaStreamWaitEvent(main_, joined_, 0);
  cudaGetLastError();
}

}  // namespace lowbit::cuda
