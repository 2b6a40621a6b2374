#include "lowbit/core/dlpack.h"

#include <memory>
#include <vector>

namespace lowbit {
namespace {

DLDataType to_dl_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::f32: return {kDLFloat, 32, 1};
    case ScalarType::f16: return {kDLFloat, 16, 1};
    case ScalarType::bf16: return {kDLBfloat, 16, 1};
    case ScalarType::e4m3: return {kDLFloat8_e4m3fn, 8, 1};
    case ScalarType::e5m2: return {kDLFloat8_e5m2, 8, 1};
    case ScalarType::s8: return {kDLInt, 8, 1};
    case ScalarType::u8: return {kDLUInt, 8, 1};
    case ScalarType::s32: return {kDLInt, 32, 1};
    case ScalarType::s64: return {kDLInt, 64, 1};
    default: break;
  }
  LOWBIT_FAIL(ErrorKind::kType, "to_dlpack: dtype ", name_of(t), " has no DLPack code");
}

ScalarType from_dl_dtype(const DLDataType& d) {
  LOWBIT_CHECK_TYPE(d.lanes == 1, "from_dlpack: vector dtypes (lanes=", d.lanes, ") are not supported");
  if (d.code == kDLFloat && d.bits == 32) return ScalarType::f32;
  if (d.code == kDLFloat && d.bits == 16) return ScalarType::f16;
  if (d.code == kDLBfloat && d.bits == 16) return ScalarType::bf16;
  if (d.code == kDLFloat8_e4m3fn && d.bits == 8) return ScalarType::e4m3;
  if (d.code == kDLFloat8_e5m2 && d.bits == 8) return ScalarType::e5m2;
  if (d.code == kDLInt && d.bits == 8) return ScalarType::s8;
  if (d.code == kDLUInt && d.bits == 8) return ScalarType::u8;
  if (d.code == kDLInt && d.bits == 32) return ScalarType::s32;
  if (d.code == kDLInt && d.bits == 64) return ScalarType::s64;
  if (d.code == 6 /* kDLBool */ && d.bits == 8) return ScalarType::u8;
  LOWBIT_FAIL(ErrorKind::kType, "from_dlpack: unsupported DLPack dtype (code=", int(d.code), ", bits=", int(d.bits),
              "); supported: float32/16, bfloat16, float8 e4m3fn/e5m2, int8, uint8, int32, int64");
}

// Owns the exported view (keeps the storage alive) plus the shape/stride arrays DLPack points at.
template <typename Managed>
struct ExportCtx {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  Managed managed;
};

Tensor exportable(const Tensor& t_in) {
  check_defined(t_in, "to_dlpack", "tensor");
  if (!is_sub_byte(t_in.dtype())) return t_in;
  LOWBIT_CHECK(t_in.is_contiguous(), "to_dlpack: sub-byte tensor ", t_in.str(), " must be contiguous to export");
  return t_in.as_dtype_view(ScalarType::u8);
}

void fill_dl_tensor(const Tensor& t, std::vector<int64_t>& shape, std::vector<int64_t>& strides, DLTensor& dl) {
  // Point at the storage base and carry the offset in byte_offset, as DLPack recommends.
  dl.data = t.storage()->data();
  dl.byte_offset = static_cast<uint64_t>(t.byte_offset());
  dl.device = {t.device().is_cpu() ? kDLCPU : kDLCUDA, t.device().is_cpu() ? 0 : t.device().index};
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = to_dl_dtype(t.dtype());
  dl.shape = shape.data();
  dl.strides = strides.data();
}

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t_in) {
  using Ctx = ExportCtx<DLManagedTensor>;
  Tensor t = exportable(t_in);
  auto* ctx = new Ctx{t, t.shape(), t.strides(), {}};
  fill_dl_tensor(t, ctx->shape, ctx->strides, ctx->managed.dl_tensor);
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Ctx*>(self->manager_ctx); };
  return &ctx->managed;
}

DLManagedTensorVersioned* to_dlpack_versioned(const Tensor& t_in) {
  using Ctx = ExportCtx<DLManagedTensorVersioned>;
  Tensor t = exportable(t_in);
  auto* ctx = new Ctx{t, t.shape(), t.strides(), {}};
  fill_dl_tensor(t, ctx->shape, ctx->strides, ctx->managed.dl_tensor);
  ctx->managed.version = {1, 0};
  ctx->managed.flags = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensorVersioned* self) { delete static_cast<Ctx*>(self->manager_ctx); };
  return &ctx->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  LOWBIT_CHECK(managed != nullptr, "from_dlpack: null DLManagedTensor");
  // From here on the producer's deleter must run exactly once, also on error.
  std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  Device device;
  if (dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDAHost) device = Device::cpu();
  else if (dl.device.device_type == kDLCUDA) device = Device::cuda(dl.device.device_id);
  else LOWBIT_FAIL(ErrorKind::kType, "from_dlpack: unsupported device type ", dl.device.device_type, " (cpu and cuda only)");
  const ScalarType dtype = from_dl_dtype(dl.dtype);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : Tensor::contiguous_strides(shape);
  // Storage spans from `data` to the last element reachable through the strides.
  int64_t span = 1;
  bool empty = false;
  for (int i = 0; i < dl.ndim; ++i) {
    if (shape[i] == 0) empty = true;
    LOWBIT_CHECK(strides[i] >= 0, "from_dlpack: negative strides are not supported");
    span += (shape[i] - 1) * strides[i];
  }
  const size_t bytes = empty ? 0 : static_cast<size_t>(dl.byte_offset + span * bits_of(dtype) / 8);
  auto storage = Storage::wrap(dl.data, bytes, device, [owner]() mutable { owner.reset(); });
  return Tensor(storage, shape, strides, dtype, static_cast<int64_t>(dl.byte_offset));
}

}  // namespace lowbit
