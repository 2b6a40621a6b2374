// Small CUDA runtime helpers shared by every GPU kernel: argument checks and device queries.
#include <mutex>
#include <vector>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/stream.h"

namespace lowbit::cuda {

void check_cuda_tensor(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK_TYPE(t.device().is_cuda(), op, ": argument '", arg, "' must be a CUDA tensor, got ", t.str());
  require_device(t.device(), op);
}

void check_same_device(const Tensor& t, const Tensor& ref, const char* op, const char* arg) {
  check_cuda_tensor(t, op, arg);
  LOWBIT_CHECK_TYPE(t.device() == ref.device(), op, ": argument '", arg, "' is on ", t.device().str(),
                    " but the other operands are on ", ref.device().str());
}

DeviceInfo device_info(int index) {
  require_device(Device::cuda(index), "cuda_device_info");
  cudaDeviceProp p{};
  LOWBIT_CUDA_CHECK("cuda_device_info", cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  d.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  d.l2_bytes = p.l2CacheSize;
  d.max_smem_per_block_optin = static_cast<int>(p.sharedMemPerBlockOptin);
  LOWBIT_CUDA_CHECK("cuda_device_info", cudaRuntimeGetVersion(&d.runtime_version));
  LOWBIT_CUDA_CHECK("cuda_device_info", cudaDriverGetVersion(&d.driver_version));
  return d;
}

namespace {
thread_local cudaStream_t g_current_stream = nullptr;
}  // namespace

cudaStream_t current_stream() { return g_current_stream; }

StreamScope::StreamScope(cudaStream_t stream) : previous_(g_current_stream) { g_current_stream = stream; }
StreamScope::~StreamScope() { g_current_stream = previous_; }

int multiprocessor_count(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    LOWBIT_CUDA_CHECK("multiprocessor_count",
                      cudaDeviceGetAttribute(&cache[device], cudaDevAttrMultiProcessorCount, device));
  }
  return cache[device];
}

int compute_capability_major(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    LOWBIT_CUDA_CHECK("compute_capability_major",
                      cudaDeviceGetAttribute(&cache[device], cudaDevAttrComputeCapabilityMajor, device));
  }
  return cache[device];
}

}  // namespace lowbit::cuda
