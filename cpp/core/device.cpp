#include "lowbit/core/device.h"

#include <cstdlib>
#include <string>

#include "lowbit/core/error.h"
#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lowbit {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    const long idx = std::strtol(s.c_str() + 5, &end, 10);
    if (end && *end == '\0' && end != s.c_str() + 5 && idx >= 0) return cuda(static_cast<int>(idx));
  }
  LOWBIT_FAIL(ErrorKind::kValue, "unknown device '", s, "' (expected 'cpu', 'cuda' or 'cuda:N')");
}

int cuda_device_count() {
#ifdef LOWBIT_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

void require_device(const Device& d, const char* op) {
  if (d.is_cpu()) return;
#ifndef LOWBIT_WITH_CUDA
  LOWBIT_FAIL(ErrorKind::kNotSupported, op, ": device ", d.str(),
              " requested but this lowbit build has no CUDA support (rebuild with LOWBIT_CUDA=ON)");
#else
  const int n = cuda_device_count();
  if (n == 0)
    LOWBIT_FAIL(ErrorKind::kRuntime, op, ": device ", d.str(),
                " requested but no CUDA GPU is available (no driver or no device); use device='cpu'");
  if (d.index >= n)
    LOWBIT_FAIL(ErrorKind::kValue, op, ": device ", d.str(), " does not exist (", n, " CUDA device(s) visible)");
#endif
}

}  // namespace lowbit
