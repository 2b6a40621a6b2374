#include "lowbit/core/tensor.h"

#include <cstdint>
#include <cstring>
#include <sstream>

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lowbit {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, ScalarType dtype, int64_t byte_offset)
    : storage_(std::move(storage)), shape_(std::move(shape)), strides_(std::move(strides)), dtype_(dtype),
      byte_offset_(byte_offset) {
  LOWBIT_CHECK(shape_.size() == strides_.size(), "Tensor: shape ", shape_str(shape_), " and strides ",
               shape_str(strides_), " differ in rank");
  for (int64_t d : shape_) LOWBIT_CHECK(d >= 0, "Tensor: negative dimension in shape ", shape_str(shape_));
}

Shape Tensor::contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, ScalarType dtype, const Device& device) {
  // elements * bits must fit in int64 (bytes_for): a wrapped count would allocate too few bytes.
  constexpr int64_t kMaxElements = INT64_MAX / 64;
  bool has_zero = false;
  for (int64_t d : shape) {
    LOWBIT_CHECK(d >= 0, "Tensor::empty: negative dimension in shape ", shape_str(shape));
    has_zero = has_zero || d == 0;
  }
  int64_t n = has_zero ? 0 : 1;
  for (int64_t d : shape) {
    if (has_zero) break;
    LOWBIT_CHECK(n <= kMaxElements / d, "Tensor::empty: shape ", shape_str(shape), " of ", name_of(dtype),
                 " has more elements than a tensor can hold (2^57)");
    n *= d;
  }
  if (is_sub_byte(dtype) && !shape.empty())
    LOWBIT_CHECK(shape.back() * bits_of(dtype) % 8 == 0, "Tensor::empty: last dimension ", shape.back(),
                 " of a ", name_of(dtype), " tensor must fill whole bytes");
  auto storage = Storage::allocate(static_cast<size_t>(bytes_for(dtype, n)), device);
  return Tensor(storage, shape, contiguous_strides(shape), dtype, 0);
}

Tensor Tensor::zeros(const Shape& shape, ScalarType dtype, const Device& device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_bytes_(0);
  return t;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, d >= 0 && d < n, "Tensor::size: dimension ", d, " out of range for ",
                    n, "-D tensor");
  return shape_[d];
}

int64_t Tensor::stride(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, d >= 0 && d < n, "Tensor::stride: dimension ", d, " out of range");
  return strides_[d];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  LOWBIT_CHECK(is_contiguous(), "Tensor::view: tensor ", str(), " is not contiguous");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LOWBIT_CHECK(infer < 0, "Tensor::view: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    LOWBIT_CHECK(known > 0 && numel() % known == 0, "Tensor::view: cannot view ", str(), " as ", shape_str(shape));
    s[infer] = numel() / known;
  }
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  LOWBIT_CHECK(n == numel(), "Tensor::view: shape ", shape_str(shape), " has ", n, " elements but ", str(),
               " has ", numel());
  return Tensor(storage_, s, contiguous_strides(s), dtype_, byte_offset_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, d >= 0 && d < n, "Tensor::slice: dimension ", d, " out of range");
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, 0 <= start && start <= end && end <= shape_[d], "Tensor::slice: range [",
                    start, ", ", end, ") out of bounds for dimension ", d, " of size ", shape_[d]);
  const int64_t elem_off = start * strides_[d];
  LOWBIT_CHECK(!is_sub_byte(dtype_) || (elem_off * bits_of(dtype_)) % 8 == 0,
               "Tensor::slice: slice of a ", name_of(dtype_), " tensor must start on a byte boundary");
  Shape s = shape_;
  s[d] = end - start;
  return Tensor(storage_, s, strides_, dtype_, byte_offset_ + elem_off * bits_of(dtype_) / 8);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  Tensor t = slice(d, index, index + 1);
  Shape s = t.shape_, st = t.strides_;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return Tensor(storage_, s, st, dtype_, t.byte_offset_);
}

Tensor Tensor::as_dtype_view(ScalarType dtype) const {
  LOWBIT_CHECK(is_contiguous(), "Tensor::as_dtype_view: tensor ", str(), " is not contiguous");
  Shape s = shape_;
  if (s.empty()) s = {1};
  const int64_t last_bits = s.back() * bits_of(dtype_);
  LOWBIT_CHECK(last_bits % bits_of(dtype) == 0, "Tensor::as_dtype_view: last dimension of ", str(),
               " does not fill whole ", name_of(dtype), " elements");
  s.back() = last_bits / bits_of(dtype);
  return Tensor(storage_, s, contiguous_strides(s), dtype, byte_offset_);
}

namespace {
// Recursive strided copy on the host for byte-sized elements.
void copy_strided_host(char* dst, const Shape& dst_st, const char* src, const Shape& src_st, const Shape& shape,
                       int64_t elem, int64_t d) {
  if (d == static_cast<int64_t>(shape.size())) {
    std::memcpy(dst, src, static_cast<size_t>(elem));
    return;
  }
  for (int64_t i = 0; i < shape[d]; ++i)
    copy_strided_host(dst + i * dst_st[d] * elem, dst_st, src + i * src_st[d] * elem, src_st, shape, elem, d + 1);
}
}  // namespace

void Tensor::copy_(const Tensor& src) {
  check_defined(*this, "copy_", "self");
  check_defined(src, "copy_", "src");
  LOWBIT_CHECK(shape_ == src.shape_, "copy_: shape mismatch, self ", str(), " vs src ", src.str());
  LOWBIT_CHECK_TYPE(dtype_ == src.dtype_, "copy_: dtype mismatch, self ", name_of(dtype_), " vs src ",
                    name_of(src.dtype_));
  if (numel() == 0) return;
  const bool both_contig = is_contiguous() && src.is_contiguous();
  if (device().is_cpu() && src.device().is_cpu()) {
    if (both_contig) {
      std::memmove(data_ptr(), src.data_ptr(), static_cast<size_t>(nbytes()));
    } else {
      LOWBIT_CHECK(!is_sub_byte(dtype_), "copy_: strided copy of sub-byte type ", name_of(dtype_),
                   " is not supported");
      copy_strided_host(static_cast<char*>(data_ptr()), strides_, static_cast<const char*>(src.data_ptr()),
                        src.strides_, shape_, bits_of(dtype_) / 8, 0);
    }
    return;
  }
#ifdef LOWBIT_WITH_CUDA
  if (!both_contig) {
    // Stage through contiguous host copies; GPU-side strided copies belong to the ops layer.
    LOWBIT_CHECK(src.device().is_cpu() || src.is_contiguous(), "copy_: non-contiguous CUDA source ", src.str(),
                 " (make it contiguous first)");
    LOWBIT_CHECK(device().is_cpu() || is_contiguous(), "copy_: non-contiguous CUDA destination ", str());
  }
  Tensor s = src.device().is_cpu() ? src.contiguous() : src;
  if (device().is_cpu() && !is_contiguous()) {
    Tensor tmp = s.to(Device::cpu());
    copy_(tmp);
    return;
  }
  const cudaError_t err = cudaMemcpy(data_ptr(), s.data_ptr(), static_cast<size_t>(nbytes()), cudaMemcpyDefault);
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, err == cudaSuccess, "copy_: cudaMemcpy ", s.device().str(), " -> ",
                    device().str(), " failed: ", cudaGetErrorString(err));
#else
  LOWBIT_FAIL(ErrorKind::kNotSupported, "copy_: CUDA tensors need a CUDA build of lowbit");
#endif
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(const Device& device) const {
  Tensor out = empty(shape_, dtype_, device);
  out.copy_(*this);
  return out;
}

Tensor Tensor::clone() const { return to(device()); }

void Tensor::fill_bytes_(uint8_t byte) {
  check_contiguous(*this, "fill_bytes_", "self");
  if (device().is_cpu()) {
    std::memset(data_ptr(), byte, static_cast<size_t>(nbytes()));
    return;
  }
#ifdef LOWBIT_WITH_CUDA
  const cudaError_t err = cudaMemset(data_ptr(), byte, static_cast<size_t>(nbytes()));
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, err == cudaSuccess, "fill_bytes_: cudaMemset failed: ",
                    cudaGetErrorString(err));
#endif
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << name_of(dtype_) << shape_str(shape_) << ", " << device().str() << ")";
  return os.str();
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  LOWBIT_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}
void check_dtype(const Tensor& t, ScalarType expected, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK_TYPE(t.dtype() == expected, op, ": argument '", arg, "' must have dtype ", name_of(expected),
                    ", got ", name_of(t.dtype()), " (", t.str(), ")");
}
void check_dim(const Tensor& t, int64_t dims, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK(t.dim() == dims, op, ": argument '", arg, "' must be ", dims, "-D, got shape ", shape_str(t.shape()));
}
void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* arg) {
  check_defined(t, op, arg);
  bool ok = t.dim() == static_cast<int64_t>(expected.size());
  for (size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || expected[i] == t.shape()[i];
  LOWBIT_CHECK(ok, op, ": argument '", arg, "' must have shape ", shape_str(expected), " (-1 = any), got ",
               shape_str(t.shape()));
}
void check_contiguous(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK(t.is_contiguous(), op, ": argument '", arg, "' must be contiguous, got strides ",
               shape_str(t.strides()), " for shape ", shape_str(t.shape()));
}
void check_device(const Tensor& t, const Device& expected, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK_TYPE(t.device() == expected, op, ": argument '", arg, "' must be on ", expected.str(), ", got ",
                    t.device().str());
}

}  // namespace lowbit
