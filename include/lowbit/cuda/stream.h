// The stream lowbit's ops launch on, per host thread: the legacy default stream unless a
// StreamScope says otherwise (CUDA graph capture needs a stream of its own). Ops read it with
// current_stream() instead of passing a fixed stream, so one forward pass can run eagerly or be
// captured into a graph without change.
#pragma once
#include <cuda_runtime_api.h>

namespace lowbit::cuda {

cudaStream_t current_stream();

// Makes `stream` the current stream of this thread until destruction (scopes nest).
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

}  // namespace lowbit::cuda
