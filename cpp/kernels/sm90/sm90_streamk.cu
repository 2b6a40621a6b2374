// The stream-K scratch of each device (sm90_streamk.cuh): allocated on first use and kept for the process.
#include "kernels/sm90/sm90_streamk.cuh"

#include <algorithm>
#include <mutex>

#include "lowbit/cuda/check.h"

namespace lowbit::cuda::sm90 {

StreamKWorkspace streamk_workspace(const char* op, int device, int max_ctas, int64_t slot_floats,
                                   cudaStream_t stream) {
  struct Slot {
    void* base = nullptr;
    int ctas = 0;
    int64_t floats = 0;
  };
  static std::mutex mu;
  static Slot slots[64];
  LOWBIT_CHECK(device >= 0 && device < 64, op, ": device ", device, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  Slot& s = slots[device];
  if (s.ctas < max_ctas || s.floats < slot_floats) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LOWBIT_CUDA_CHECK(op, cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return {nullptr, nullptr};  // no allocation inside a capture
    // Grown while no launch may use the old one: wait for the device (first use only, in practice).
    LOWBIT_CUDA_CHECK(op, cudaDeviceSynchronize());
    if (s.base != nullptr) LOWBIT_CUDA_CHECK(op, cudaFree(s.base));
    s.base = nullptr;
    const int ctas = std::max(s.ctas, max_ctas);
    const int64_t floats = std::max(s.floats, slot_floats);
    const int64_t fb = (static_cast<int64_t>(ctas) * 4 + 255) / 256 * 256;
    LOWBIT_CUDA_CHECK(op, cudaMalloc(&s.base, fb + static_cast<int64_t>(ctas) * floats * 4));
    LOWBIT_CUDA_CHECK(op, cudaMemset(s.base, 0, fb));
    LOWBIT_CUDA_CHECK(op, cudaDeviceSynchronize());
    s.ctas = ctas, s.floats = floats;
  }
  const int64_t fb = (static_cast<int64_t>(s.ctas) * 4 + 255) / 256 * 256;
  return {reinterpret_cast<float*>(static_cast<uint8_t*>(s.base) + fb), static_cast<int*>(s.base)};
}

}  // namespace lowbit::cuda::sm90
