// The stream-K scratch of each device and stream (sm90_streamk.cuh): allocated on first use and kept for the process.
#include "kernels/sm90/sm90_streamk.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "lowbit/cuda/check.h"

namespace lowbit::cuda::sm90 {

StreamKWorkspace streamk_workspace(const char* op, int device, int max_ctas, int64_t slot_floats,
                                   cudaStream_t stream) {
  struct Slot {
    void* base = nullptr;
    int ctas = 0;
    int64_t floats = 0;
  };
  // One scratch per (device, stream): launches on one stream run in order, so they never share flags mid-flight.
  // A scratch that must grow is replaced, never freed: a CUDA graph captured earlier keeps its pointers and may
  // still replay.
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Slot> slots;
  LOWBIT_CHECK(device >= 0, op, ": device ", device, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  Slot& s = slots[{device, stream}];
  if (s.ctas < max_ctas || s.floats < slot_floats) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LOWBIT_CUDA_CHECK(op, cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return {nullptr, nullptr};  // no allocation inside a capture
    const int ctas = std::max(s.ctas, max_ctas);
    const int64_t floats = std::max(s.floats, slot_floats);
    const int64_t fb = (static_cast<int64_t>(ctas) * 4 + 255) / 256 * 256;
    void* base = nullptr;
    LOWBIT_CUDA_CHECK(op, cudaMalloc(&base, fb + static_cast<int64_t>(ctas) * floats * 4));
    // The flags start at 0 before any launch on `stream` can see them.
    LOWBIT_CUDA_CHECK(op, cudaMemsetAsync(base, 0, fb, stream));
    s.base = base, s.ctas = ctas, s.floats = floats;
  }
  const int64_t fb = (static_cast<int64_t>(s.ctas) * 4 + 255) / 256 * 256;
  return {reinterpret_cast<float*>(static_cast<uint8_t*>(s.base) + fb), static_cast<int*>(s.base)};
}

}  // namespace lowbit::cuda::sm90
