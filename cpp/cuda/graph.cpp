// CudaGraph (lowbit/cuda/graph.h): stream capture of a body of launches, instantiate, replay.
#include "lowbit/cuda/graph.h"

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/stream.h"

namespace lowbit::cuda {

CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void CudaGraph::capture(cudaStream_t stream, const std::function<void()>& body, const char* what) {
  LOWBIT_CHECK(!captured(), what, ": the graph is already captured");
  LOWBIT_CHECK(stream != nullptr, what, ": CUDA graphs cannot be captured on the legacy default stream");
  // Relaxed mode: kernels' one-time setup calls (cudaFuncSetAttribute) and a first-use cudaMalloc
  // of the graph's pool stay legal; a launch on another stream still breaks the capture (an error).
  LOWBIT_CUDA_CHECK(what, cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    StreamScope scope(stream);
    body();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);  // leave capture mode before the error propagates
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();
    throw;
  }
  LOWBIT_CUDA_CHECK(what, cudaStreamEndCapture(stream, &graph_));
  const cudaError_t err = cudaGraphInstantiate(&exec_, graph_, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph_);
    graph_ = nullptr;
    exec_ = nullptr;
    LOWBIT_CUDA_CHECK(what, err);
  }
}

void CudaGraph::replay(cudaStream_t stream, const char* what) const {
  LOWBIT_CHECK(captured(), what, ": replay of a graph that was never captured");
  LOWBIT_CUDA_CHECK(what, cudaGraphLaunch(exec_, stream));
}

}  // namespace lowbit::cuda
