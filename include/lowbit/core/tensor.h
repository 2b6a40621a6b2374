// Tensor: a strided view (shape, strides in elements, byte offset) of a Storage.
// Sub-byte tensors (u4 s4 u2) must be contiguous in their last dimension, which packs
// 8/bits elements per byte; their strides are still counted in elements.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/core/device.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/core/storage.h"

namespace lowbit {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() is false
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, ScalarType dtype,
         int64_t byte_offset = 0);

  static Tensor empty(const Shape& shape, ScalarType dtype, const Device& device = Device::cpu());
  static Tensor zeros(const Shape& shape, ScalarType dtype, const Device& device = Device::cpu());
  static Shape contiguous_strides(const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  int64_t nbytes() const { return bytes_for(dtype_, numel()); }
  ScalarType dtype() const { return dtype_; }
  const Device& device() const { return storage_->device(); }
  int64_t byte_offset() const { return byte_offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool is_contiguous() const;

  void* data_ptr() const { return static_cast<char*>(storage_->data()) + byte_offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(data_ptr()); }

  // Views share storage.
  Tensor view(const Shape& shape) const;                 // contiguous tensors only; one dim may be -1
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;  // [start, end) along dim
  Tensor select(int64_t dim, int64_t index) const;       // drops `dim`
  Tensor as_dtype_view(ScalarType dtype) const;          // reinterpret bytes (contiguous, same total bytes)

  // Copies.
  Tensor contiguous() const;                   // self when already contiguous
  Tensor to(const Device& device) const;       // deep copy to device (contiguous result)
  Tensor clone() const;
  void copy_(const Tensor& src);               // same shape and dtype; any devices
  void fill_bytes_(uint8_t byte);              // poison / zero the whole view (contiguous only)

  std::string str() const;  // "Tensor(f16[2, 3], cpu)"

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_, strides_;
  ScalarType dtype_ = ScalarType::f32;
  int64_t byte_offset_ = 0;
};

// Argument checks shared by every op; they throw messages naming op, argument and expectation.
void check_defined(const Tensor& t, const char* op, const char* arg);
void check_dtype(const Tensor& t, ScalarType expected, const char* op, const char* arg);
void check_dim(const Tensor& t, int64_t dims, const char* op, const char* arg);
void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* arg);  // -1 = any
void check_contiguous(const Tensor& t, const char* op, const char* arg);
void check_device(const Tensor& t, const Device& expected, const char* op, const char* arg);

}  // namespace lowbit
