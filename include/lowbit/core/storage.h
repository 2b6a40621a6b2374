// A Storage is one contiguous allocation. Tensors share it through shared_ptr; the deleter is
// either the allocator that made it or a foreign owner (DLPack import keeps the producer alive).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "lowbit/core/device.h"

namespace lowbit {

class Storage {
 public:
  // Allocates `bytes` on `device` through its allocator.
  static std::shared_ptr<Storage> allocate(size_t bytes, const Device& device);
  // Wraps memory owned elsewhere; `release` runs when the last tensor lets go.
  static std::shared_ptr<Storage> wrap(void* data, size_t bytes, const Device& device,
                                       std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

 private:
  Storage(void* data, size_t bytes, Device device, std::function<void()> release)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}
  void* data_;
  size_t bytes_;
  Device device_;
  std::function<void()> release_;
};

}  // namespace lowbit
