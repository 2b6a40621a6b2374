// A fork of the caller's stream onto a second one and the join back, for a launch that needs nothing the caller's
// next launches write and is needed by a later one only (the per-channel prefill's tail split beside the copy and
// the f16 head split: prefill_attention_sm90.cu). Events order it both ways, so it runs eagerly and under stream
// capture (the side stream joins the capture at the fork and is joined back before the capture can end).
#pragma once
#include <cuda_runtime_api.h>

namespace lowbit::cuda {

// On construction: an event recorded on `main`, and the side stream waits on it (what `main` had queued, including
// the work that last used a block the caching allocator now hands out again, comes first). join(): `main` waits on
// what was launched on side() so far. The destructor joins if join() was not reached (an error path), so a capture
// never ends with a branch left open. The side stream and both events belong to the host thread and `device` (made
// once, kept for the process): a thread's fork cannot take another thread's event, and a multi-GPU process gets
// one side stream per device. The side stream is non-blocking (work on the legacy default stream would otherwise
// wait on it and undo the overlap) and of the device's highest priority (its few CTAs start ahead of the main
// stream's larger grids). Every CUDA call is checked (errors name `op`).
class StreamFork {
 public:
  StreamFork(cudaStream_t main, int device, const char* op);
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;
  cudaStream_t side() const { return side_; }
  void join();

 private:
  cudaStream_t main_ = nullptr, side_ = nullptr;
  cudaEvent_t joined_ = nullptr;
  const char* op_;
  bool open_ = false;
};

}  // namespace lowbit::cuda
