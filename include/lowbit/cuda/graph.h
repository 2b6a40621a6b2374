// A CUDA graph captured from ordinary launches: capture() runs `body` once on `stream` in capture
// mode (nothing executes), then instantiates the graph; replay() launches it. The body must launch
// on cuda::current_stream() (capture() makes `stream` current) and must not synchronize or copy
// synchronously; its device allocations should come from a GraphMemoryPool (core/allocator.h).
#pragma once
#include <cuda_runtime_api.h>

#include <functional>

namespace lowbit::cuda {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Throws (naming `what`) when capture or instantiation fails; the graph stays empty then.
  void capture(cudaStream_t stream, const std::function<void()>& body, const char* what);
  void replay(cudaStream_t stream, const char* what) const;
  bool captured() const { return exec_ != nullptr; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace lowbit::cuda
