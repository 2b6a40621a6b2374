// Where a tensor lives: the host, or CUDA device N.
#pragma once
#include <cstdint>
#include <string>

namespace lowbit {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device& o) const { return kind == o.kind && (kind == DeviceKind::cpu || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;                      // "cpu", "cuda:0"
  static Device parse(const std::string& s);    // "cpu", "cuda", "cuda:1"
};

// CUDA availability at run time (false when built without CUDA or when no driver/GPU is present).
bool cuda_available();
int cuda_device_count();
// Throws a clear error naming the reason when `d` is a CUDA device that cannot be used.
void require_device(const Device& d, const char* op);

}  // namespace lowbit
