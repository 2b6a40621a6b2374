#include "model/host_convert.h"

#include <cstring>

namespace lowbit::model_detail {

Tensor to_f32_host(const Tensor& t, const std::string& what) {
  LOWBIT_CHECK(t.defined(), "Model.set_weight: tensor '", what, "' is undefined");
  const ScalarType dt = t.dtype();
  LOWBIT_CHECK_TYPE(dt == ScalarType::f32 || dt == ScalarType::f16 || dt == ScalarType::bf16, "Model.set_weight: ",
                    "tensor '", what, "' must be f32, f16 or bf16, got ", name_of(dt));
  Tensor host = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
  Tensor out = Tensor::empty(host.shape(), ScalarType::f32);
  dtype_to_f32_host(host, out.data<float>());
  return out;
}

void dtype_to_f32_host(const Tensor& t, float* out) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case ScalarType::f32: std::memcpy(out, t.data<float>(), size_t(n) * 4); break;
    case ScalarType::f16: {
      const uint16_t* p = t.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(p[i]);
      break;
    }
    case ScalarType::bf16: {
      const uint16_t* p = t.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(p[i]);
      break;
    }
    default: LOWBIT_FAIL(ErrorKind::kType, "dtype_to_f32_host: unsupported dtype ", name_of(t.dtype()));
  }
}

Tensor f32_to_dtype_host(const Tensor& t, ScalarType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype);
  const float* src = t.data<float>();
  const int64_t n = t.numel();
  switch (dtype) {
    case ScalarType::f32: std::memcpy(out.data<float>(), src, size_t(n) * 4); break;
    case ScalarType::f16:
      for (int64_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = f32_to_f16_bits(src[i]);
      break;
    case ScalarType::bf16:
      for (int64_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = f32_to_bf16_bits(src[i]);
      break;
    default: LOWBIT_FAIL(ErrorKind::kType, "f32_to_dtype_host: unsupported dtype ", name_of(dtype));
  }
  return out;
}

Tensor concat_rows(const std::vector<Tensor>& parts, const char* what) {
  int defined = 0;
  for (const Tensor& p : parts) defined += p.defined();
  if (defined == 0) return Tensor();
  LOWBIT_CHECK(defined == int(parts.size()), "Model.finalize: cannot fuse ", what, ": some parts lack a tensor the ",
               "others have");
  const Tensor& first = parts[0];
  Shape shape = first.shape();
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    LOWBIT_CHECK_TYPE(p.dtype() == first.dtype(), "Model.finalize: cannot fuse ", what, ": dtype ", name_of(p.dtype()),
                      " vs ", name_of(first.dtype()));
    LOWBIT_CHECK(p.dim() == first.dim() && p.dim() >= 1, "Model.finalize: cannot fuse ", what, ": shapes ",
                 shape_str(p.shape()), " vs ", shape_str(first.shape()));
    for (int64_t d = 1; d < p.dim(); ++d)
      LOWBIT_CHECK(p.size(d) == first.size(d), "Model.finalize: cannot fuse ", what, ": shapes ", shape_str(p.shape()),
                   " vs ", shape_str(first.shape()));
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, p.numel() * bits_of(p.dtype()) % 8 == 0, "Model.finalize: cannot ",
                      "fuse ", what, ": sub-byte part ", p.str(), " does not end on a byte boundary");
    rows += p.size(0);
  }
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, first.dtype());
  char* dst = static_cast<char*>(out.data_ptr());
  for (const Tensor& p : parts) {
    Tensor host = p.device().is_cpu() ? p.contiguous() : p.to(Device::cpu());
    std::memcpy(dst, host.data_ptr(), size_t(host.nbytes()));
    dst += host.nbytes();
  }
  return out;
}

}  // namespace lowbit::model_detail
