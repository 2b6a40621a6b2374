// ops::linear: argument checks (op, argument, expected vs actual), then the kernel: the plan's for
// the token bucket, or (unplanned calls) the registry's choice for the call's descriptor.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm_cpu.h"
#include "quant/pack_cpu_layout.h"
#include "lowbit/kernels/registry.h"
#include "lowbit/ops/ops.h"
#include "ops/op_device.h"

namespace lowbit::ops {
namespace {

constexpr const char* kOp = "linear";

const char* act_name(LinearActivation a) {
  switch (a) {
    case LinearActivation::float16: return "float";
    case LinearActivation::int8_per_token: return "int8_per_token";
    case LinearActivation::fmpq_mixed: return "fmpq";
    case LinearActivation::fp8_per_token: return "fp8_per_token";
  }
  return "unknown";
}

void check_float_2d(const Tensor& t, const char* arg) {
  check_defined(t, kOp, arg);
  LOWBIT_CHECK_TYPE(t.dtype() == ScalarType::f32 || t.dtype() == ScalarType::f16 || t.dtype() == ScalarType::bf16,
                    kOp, ": argument '", arg, "' must be f32, f16 or bf16, got ", name_of(t.dtype()));
  check_dim(t, 2, kOp, arg);
}

// Whether x's rows are 16-byte aligned (start and row stride), as cp.async kernels need.
bool aligned_rows(const Tensor& x) {
  const int64_t bytes = x.nbytes() / std::max<int64_t>(1, x.numel());
  return reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 && (x.stride(0) * bytes) % 16 == 0;
}

// The GPU's own argument rules (the kernels compute in f16).
void check_gpu_linear(const Tensor& x, const PackedWeight& w, const Tensor& bias) {
  LOWBIT_CHECK(w.target == PackTarget::sm80, kOp, ": the weight was packed for ", name_of(w.target),
               " but the GPU linear needs a weight packed for sm80 (Model does this at finalize)");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, x.dtype() == ScalarType::f16, kOp,
                    ": GPU linears take f16 activations, got ", name_of(x.dtype()));
  if (bias.defined())
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, bias.dtype() == ScalarType::f16, kOp,
                      ": GPU linears take an f16 bias, got ", name_of(bias.dtype()));
}

// The CPU's rules on the activation mode, with a hint for each.
void check_cpu_linear(const PackedWeight& w, LinearActivation act) {
  LOWBIT_CHECK(w.target == PackTarget::cpu, kOp, ": the weight was packed for target code ", static_cast<int>(w.target),
               "; the CPU linear needs pack_weight(..., PackTarget::cpu, ...)");
  switch (act) {
    case LinearActivation::float16: break;
    case LinearActivation::int8_per_token:
      if (w.format != WeightFormat::w8 && w.format != WeightFormat::qoq && w.format != WeightFormat::liquid)
        LOWBIT_NOT_SUPPORTED(kOp, ": act=int8_per_token needs a w8, qoq or liquid weight, got ",
                             name_of(w.format), " (use act=float for it)");
      break;
    case LinearActivation::fp8_per_token:
      if (w.format != WeightFormat::e4m3)
        LOWBIT_NOT_SUPPORTED(kOp, ": act=fp8_per_token needs an e4m3 weight, got ", name_of(w.format),
                             " (use act=float for it)");
      break;
    case LinearActivation::fmpq_mixed:
      LOWBIT_NOT_SUPPORTED(kOp, ": act=", act_name(act),
                           " (COMET mixed int4/int8 activations) needs the layer's block precision map: quantize x "
                           "with quantize_fmpq and call linear_fmpq; linear itself offers act=float for every "
                           "format and act=int8_per_token for w8/qoq/liquid");
  }
}

// Runs `kernel` (the plan's, or the registry's choice).
void launch(const kernels::GemmKernel* kernel, const Tensor& x, const Tensor& x_scales, const PackedWeight& w,
            const Tensor& bias, Tensor& y, LinearActivation act, const kernels::KernelTuning& tuning,
            const Tensor* block_bits = nullptr) {
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, kernel != nullptr && kernel->launch != nullptr, kOp, ": kernel ",
                    kernel ? kernel->name : "(none)", " is not built into this library");
  kernel->launch(kernels::GemmArgs{x, x_scales, w, bias, y, act, tuning, block_bits});
}


}  // namespace

void linear(const Tensor& x, const PackedWeight& w, const Tensor& bias, Tensor& y, LinearActivation act,
            const std::string& kernel) {
  check_float_2d(x, "x");
  check_float_2d(y, "y");
  LOWBIT_CHECK_TYPE(y.dtype() == x.dtype(), kOp, ": argument 'y' must have the dtype of 'x' (", name_of(x.dtype()),
                    "), got ", name_of(y.dtype()));
  LOWBIT_CHECK(x.size(1) == w.k, kOp, ": argument 'x' ", shape_str(x.shape()), " must have k = ", w.k,
               " features (the weight is [n=", w.n, ", k=", w.k, "])");
  check_shape(y, {x.size(0), w.n}, kOp, "y");
  LOWBIT_CHECK(x.stride(1) == 1 || x.size(1) <= 1, kOp, ": argument 'x' must be contiguous in its last dimension, got strides ",
               shape_str(x.strides()));
  LOWBIT_CHECK(y.stride(1) == 1 || y.size(1) <= 1, kOp, ": argument 'y' must be contiguous in its last dimension, got strides ",
               shape_str(y.strides()));
  if (bias.defined()) {
    LOWBIT_CHECK_TYPE(bias.dtype() == ScalarType::f32 || bias.dtype() == ScalarType::f16 ||
                          bias.dtype() == ScalarType::bf16,
                      kOp, ": argument 'bias' must be f32, f16 or bf16, got ", name_of(bias.dtype()));
    check_shape(bias, {w.n}, kOp, "bias");
  }
  check_defined(w.data, kOp, "w.data");
  LOWBIT_CHECK(w.n > 0 && w.k > 0, kOp, ": weight must have n > 0 and k > 0, got n=", w.n, " k=", w.k);

  const Device dev = op_device(kOp, {{"x", &x}, {"y", &y}, {"w.data", &w.data}, {"bias", &bias}});
  if (dev.is_cuda() && act == LinearActivation::fmpq_mixed)
    LOWBIT_NOT_SUPPORTED(kOp, ": act=fmpq (COMET mixed int4/int8 activations) needs the layer's block map: quantize x "
                         "with quantize_fmpq and call linear_fmpq (both run on the GPU)");
  if (dev.is_cuda())
    check_gpu_linear(x, w, bias);
  else
    check_cpu_linear(w, act);
  if (x.size(0) == 0) return;  // no tokens
  // cp.async kernels read 16-byte rows of x and, for f16 weights, of W (k % 8 != 0 breaks those).
  const bool aligned = aligned_rows(x) && (w.format != WeightFormat::f16 || aligned_rows(w.data));
  const kernels::GemmDesc desc = kernels::describe_gemm(dev, act, x.dtype(), y.dtype(), w, x.size(0), aligned);
  launch(kernels::select_gemm(desc, kernel, false, kOp).kernel, x, Tensor(), w, bias, y, act, {});
}

void linear(const Tensor& x, const PackedWeight& w, const Tensor& bias, Tensor& y, const kernels::LinearPlan& plan) {
  check_float_2d(x, "x");
  check_float_2d(y, "y");
  LOWBIT_CHECK(x.size(1) == w.k && y.size(0) == x.size(0) && y.size(1) == w.n, kOp, ": x ", shape_str(x.shape()),
               " and y ", shape_str(y.shape()), " do not match the weight [n=", w.n, ", k=", w.k, "]");
  if (x.size(0) == 0) return;
  launch(plan.kernel_for(x.size(0)), x, Tensor(), w, bias, y, plan.act, plan.tuning);
}

void linear_quantized(const Tensor& q, const Tensor& scales, const PackedWeight& w, const Tensor& bias, Tensor& y) {
  constexpr const char* op = "linear_quantized";
  check_defined(q, op, "q");
  check_dim(q, 2, op, "q");
  LOWBIT_CHECK(q.size(1) == w.k, op, ": argument 'q' ", shape_str(q.shape()), " must have k = ", w.k,
               " features (the weight is [n=", w.n, ", k=", w.k, "])");
  check_defined(y, op, "y");
  check_shape(y, {q.size(0), w.n}, op, "y");
  check_defined(w.data, op, "w.data");
  const Device dev = op_device(op, {{"q", &q}, {"scales", &scales}, {"y", &y}, {"w.data", &w.data}, {"bias", &bias}});
  if (!dev.is_cuda())
    LOWBIT_NOT_SUPPORTED(op, ": runs on the GPU only (on the CPU, linear quantizes its activations itself)");
#ifdef LOWBIT_WITH_CUDA
  LOWBIT_CHECK(w.target == PackTarget::sm80, op, ": the weight was packed for ", name_of(w.target),
               " but the GPU linear needs a weight packed for sm80");
  check_dtype(y, ScalarType::f16, op, "y");
  if (bias.defined()) {
    check_dtype(bias, ScalarType::f16, op, "bias");
    check_shape(bias, {w.n}, op, "bias");
  }
  if (q.size(0) == 0) return;
  const LinearActivation act =
      q.dtype() == ScalarType::e4m3 ? LinearActivation::fp8_per_token : LinearActivation::int8_per_token;
  const bool s8_weight =
      w.format == WeightFormat::w8 || w.format == WeightFormat::qoq || w.format == WeightFormat::liquid;
  if ((q.dtype() != ScalarType::s8 || !s8_weight) && (q.dtype() != ScalarType::e4m3 || w.format != WeightFormat::e4m3))
    LOWBIT_NOT_SUPPORTED(op, ": ", name_of(q.dtype()), " activations with a ", name_of(w.format),
                         " weight (s8 goes with w8, qoq or liquid, e4m3 with e4m3)");
  const kernels::GemmDesc desc = kernels::describe_gemm(dev, act, q.dtype(), y.dtype(), w, q.size(0), true);
  launch(kernels::select_gemm(desc, "", false, op).kernel, q, scales, w, bias, y, act, {});
#endif
}

void linear_quantized(const Tensor& q, const Tensor& scales, const PackedWeight& w, const Tensor& bias, Tensor& y,
                      const kernels::LinearPlan& plan) {
  LOWBIT_CHECK(q.dim() == 2 && q.size(1) == w.k && y.size(0) == q.size(0) && y.size(1) == w.n, "linear_quantized: q ",
               shape_str(q.shape()), " and y ", shape_str(y.shape()), " do not match the weight [n=", w.n, ", k=",
               w.k, "]");
  if (q.size(0) == 0) return;
  launch(plan.kernel_for(q.size(0)), q, scales, w, bias, y, plan.act, plan.tuning);
}

void linear_fmpq(const FmpqActivation& x, const PackedWeight& w, const Tensor& bias, Tensor& y,
                 const std::string& kernel) {
  constexpr const char* op = "linear_fmpq";
  check_defined(x.q, op, "x.q");
  check_dtype(x.q, ScalarType::s8, op, "x.q");
  check_dim(x.q, 2, op, "x.q");
  const int64_t m = x.q.size(0), blocks = (w.k + cpu::kFmpqBlockK - 1) / cpu::kFmpqBlockK;
  LOWBIT_CHECK(x.q.size(1) == w.k, op, ": argument 'x.q' ", shape_str(x.q.shape()), " must have k = ", w.k,
               " features (the weight is [n=", w.n, ", k=", w.k, "])");
  check_defined(x.scales, op, "x.scales");
  check_dtype(x.scales, ScalarType::f32, op, "x.scales");
  check_shape(x.scales, {m, blocks}, op, "x.scales");
  check_defined(y, op, "y");
  LOWBIT_CHECK_TYPE(y.dtype() == ScalarType::f32 || y.dtype() == ScalarType::f16 || y.dtype() == ScalarType::bf16, op,
                    ": argument 'y' must be f32, f16 or bf16, got ", name_of(y.dtype()));
  check_shape(y, {m, w.n}, op, "y");
  LOWBIT_CHECK(y.stride(1) == 1 || y.size(1) <= 1, op, ": argument 'y' must be contiguous in its last dimension");
  if (bias.defined()) {
    LOWBIT_CHECK_TYPE(bias.dtype() == ScalarType::f32 || bias.dtype() == ScalarType::f16 ||
                          bias.dtype() == ScalarType::bf16,
                      op, ": argument 'bias' must be f32, f16 or bf16, got ", name_of(bias.dtype()));
    check_shape(bias, {w.n}, op, "bias");
  }
  check_defined(w.data, op, "w.data");
  const Device dev = op_device(op, {{"x.q", &x.q}, {"x.scales", &x.scales}, {"y", &y}, {"w.data", &w.data},
                                    {"bias", &bias}});
  if (dev.is_cuda())
    LOWBIT_CHECK(w.target == PackTarget::sm80, op, ": the weight was packed for ", name_of(w.target),
                 " but the GPU kernel needs a weight packed for sm80 (pack_weight(..., 'sm80', 'cuda'))");
  else
    LOWBIT_CHECK(w.target == PackTarget::cpu, op, ": the weight was packed for target code ",
                 static_cast<int>(w.target), "; the CPU kernel needs pack_weight(..., PackTarget::cpu, ...)");
  if (w.format != WeightFormat::w8 && w.format != WeightFormat::qoq && w.format != WeightFormat::liquid)
    LOWBIT_NOT_SUPPORTED(op, ": FMPQ activations need a weight with s8 values (qoq, liquid or w8), got ",
                         name_of(w.format));
  if (m == 0) return;
  const kernels::GemmDesc desc =
      kernels::describe_gemm(dev, LinearActivation::fmpq_mixed, x.q.dtype(), y.dtype(), w, m, true);
  launch(kernels::select_gemm(desc, kernel, false, op).kernel, x.q, x.scales, w, bias, y, LinearActivation::fmpq_mixed, {},
         x.block_bits.defined() ? &x.block_bits : nullptr);
}

void linear_fmpq(const FmpqActivation& x, const PackedWeight& w, const Tensor& bias, Tensor& y,
                 const kernels::LinearPlan& plan) {
  LOWBIT_CHECK(x.q.dim() == 2 && x.q.size(1) == w.k && y.size(0) == x.q.size(0), "linear_fmpq: x.q ",
               shape_str(x.q.shape()), " does not match the weight [n=", w.n, ", k=", w.k, "]");
  if (x.q.size(0) == 0) return;
  launch(plan.kernel_for(x.q.size(0)), x.q, x.scales, w, bias, y, LinearActivation::fmpq_mixed, plan.tuning,
         x.block_bits.defined() ? &x.block_bits : nullptr);
}

}  // namespace lowbit::ops
