// Elementwise / normalisation ops: argument checks, then the kernel for the operands' device
// (CPU, or the CUDA kernels of cpp/cuda/rows_cuda.cu on the default stream).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/elementwise_cpu.h"
#include "lowbit/ops/ops.h"
#include "ops/op_device.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::ops {
namespace {

void check_float(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK_TYPE(t.dtype() == ScalarType::f32 || t.dtype() == ScalarType::f16 || t.dtype() == ScalarType::bf16,
                    op, ": argument '", arg, "' must be f32, f16 or bf16, got ", name_of(t.dtype()));
}

// [.., cols] as rows of contiguous elements: 1-D is one row; 2-D may have any row stride; more
// dimensions must be contiguous.
cpu::RowView rows_of(const Tensor& t, const char* op, const char* arg) {
  LOWBIT_CHECK(t.dim() >= 1, op, ": argument '", arg, "' must have at least 1 dimension, got a scalar");
  LOWBIT_CHECK(t.stride(-1) == 1 || t.size(-1) <= 1, op, ": argument '", arg,
               "' must be contiguous in its last dimension, got strides ", shape_str(t.strides()));
  cpu::RowView v;
  v.base = static_cast<char*>(t.data_ptr());
  v.dtype = t.dtype();
  v.cols = t.size(-1);
  v.rows = v.cols ? t.numel() / v.cols : 0;
  if (t.dim() == 1) {
    v.rows = 1;
    v.stride = v.cols;
  } else if (t.dim() == 2) {
    v.stride = t.stride(0);
  } else {
    check_contiguous(t, op, arg);
    v.stride = v.cols;
  }
  return v;
}

void check_same_rows(const Tensor& a, const char* an, const Tensor& b, const char* bn, const char* op) {
  LOWBIT_CHECK(a.shape() == b.shape(), op, ": arguments '", an, "' ", shape_str(a.shape()), " and '", bn, "' ",
               shape_str(b.shape()), " must have the same shape");
}

#ifdef LOWBIT_WITH_CUDA
cuda::Rows gpu_rows(const cpu::RowView& v) { return cuda::Rows{v.base, v.dtype, v.rows, v.cols, v.stride}; }
#endif

// Every kernel of this file runs where its operands are; a CUDA build is needed for CUDA operands.
[[maybe_unused]] [[noreturn]] void no_cuda_kernel(const char* op) {
  LOWBIT_NOT_SUPPORTED(op, ": CUDA operands need a CUDA build of lowbit");
}

void check_norm_weight(const Tensor& weight, int64_t h, const char* op) {
  check_float(weight, op, "weight");
  check_shape(weight, {h}, op, "weight");
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  constexpr const char* op = "rms_norm";
  check_float(x, op, "x");
  check_float(out, op, "out");
  check_same_rows(x, "x", out, "out", op);
  check_norm_weight(weight, x.dim() ? x.size(-1) : 0, op);
  LOWBIT_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const Device dev = op_device(op, {{"x", &x}, {"weight", &weight}, {"out", &out}});
  const cpu::RowView xv = rows_of(x, op, "x"), wv = rows_of(weight, op, "weight"), ov = rows_of(out, op, "out");
  if (dev.is_cpu()) return cpu::rms_norm_cpu(xv, wv, eps, ov);
#ifdef LOWBIT_WITH_CUDA
  cuda::rms_norm(gpu_rows(xv), gpu_rows(wv), eps, gpu_rows(ov), cuda::current_stream());
#else
  no_cuda_kernel(op);
#endif
}

void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  constexpr const char* op = "add_rms_norm";
  check_float(residual, op, "residual");
  check_float(x, op, "x");
  check_float(out, op, "out");
  check_same_rows(residual, "residual", x, "x", op);
  check_same_rows(residual, "residual", out, "out", op);
  check_norm_weight(weight, x.dim() ? x.size(-1) : 0, op);
  LOWBIT_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const Device dev =
      op_device(op, {{"residual", &residual}, {"x", &x}, {"weight", &weight}, {"out", &out}});
  const cpu::RowView rv = rows_of(residual, op, "residual"), xv = rows_of(x, op, "x");
  const cpu::RowView wv = rows_of(weight, op, "weight"), ov = rows_of(out, op, "out");
  if (dev.is_cpu()) return cpu::add_rms_norm_cpu(rv, xv, wv, eps, ov);
#ifdef LOWBIT_WITH_CUDA
  cuda::add_rms_norm(gpu_rows(rv), gpu_rows(xv), gpu_rows(wv), eps, gpu_rows(ov), cuda::current_stream());
#else
  no_cuda_kernel(op);
#endif
}

void rms_norm_quantize(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& q,
                       Tensor& scales) {
  constexpr const char* op = "rms_norm_quantize";
  check_float(residual, op, "residual");
  if (x.defined()) {
    check_float(x, op, "x");
    check_same_rows(residual, "residual", x, "x", op);
  }
  check_defined(q, op, "q");
  LOWBIT_CHECK_TYPE(q.dtype() == ScalarType::s8 || q.dtype() == ScalarType::e4m3, op,
                    ": argument 'q' must be s8 or e4m3, got ", name_of(q.dtype()));
  check_dim(residual, 2, op, "residual");
  check_shape(q, residual.shape(), op, "q");
  LOWBIT_CHECK(q.stride(1) == 1 || q.size(1) <= 1, op, ": argument 'q' must be contiguous in its last dimension");
  check_defined(scales, op, "scales");
  check_dtype(scales, ScalarType::f32, op, "scales");
  check_shape(scales, {residual.size(0)}, op, "scales");
  check_contiguous(scales, op, "scales");
  check_norm_weight(weight, residual.size(-1), op);
  LOWBIT_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const Device dev =
      op_device(op, {{"residual", &residual}, {"x", &x}, {"weight", &weight}, {"q", &q}, {"scales", &scales}});
  if (dev.is_cpu())
    LOWBIT_NOT_SUPPORTED(op, ": runs on the GPU only (on the CPU, rms_norm and the linear's own quantizer)");
#ifdef LOWBIT_WITH_CUDA
  const cpu::RowView rv = rows_of(residual, op, "residual"), wv = rows_of(weight, op, "weight");
  const cuda::Rows xr = x.defined() ? gpu_rows(rows_of(x, op, "x")) : cuda::Rows{};
  cuda::norm_quantize(gpu_rows(rv), xr, gpu_rows(wv), eps, q.data_ptr(), q.stride(0), q.dtype(),
                      scales.data<float>(), cuda::current_stream());
#else
  no_cuda_kernel(op);
#endif
}

void silu_mul(const Tensor& gate_up, Tensor& out) {
  constexpr const char* op = "silu_mul";
  check_float(gate_up, op, "gate_up");
  check_float(out, op, "out");
  LOWBIT_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, op,
               ": argument 'gate_up' must have an even last dimension [.., 2 * I], got ", shape_str(gate_up.shape()));
  Shape expect = gate_up.shape();
  expect.back() /= 2;
  LOWBIT_CHECK(out.shape() == expect, op, ": argument 'out' must have shape ", shape_str(expect), ", got ",
               shape_str(out.shape()));
  const Device dev = op_device(op, {{"gate_up", &gate_up}, {"out", &out}});
  const cpu::RowView gv = rows_of(gate_up, op, "gate_up"), ov = rows_of(out, op, "out");
  if (dev.is_cpu()) return cpu::silu_mul_cpu(gv, ov);
#ifdef LOWBIT_WITH_CUDA
  cuda::silu_mul(gpu_rows(gv), gpu_rows(ov), cuda::current_stream());
#else
  no_cuda_kernel(op);
#endif
}

void silu_mul_quantize(const Tensor& gate_up, Tensor& q, Tensor& scales, bool pdl) {
  constexpr const char* op = "silu_mul_quantize";
  check_float(gate_up, op, "gate_up");
  check_dim(gate_up, 2, op, "gate_up");
  LOWBIT_CHECK(gate_up.size(1) % 2 == 0, op, ": argument 'gate_up' must have an even last dimension [T, 2 * I], got ",
               shape_str(gate_up.shape()));
  LOWBIT_CHECK_TYPE(gate_up.dtype() == ScalarType::f16, op, ": argument 'gate_up' must be f16 (the GPU linears' ",
                    "activations), got ", name_of(gate_up.dtype()));
  check_defined(q, op, "q");
  LOWBIT_CHECK_TYPE(q.dtype() == ScalarType::s8 || q.dtype() == ScalarType::e4m3, op,
                    ": argument 'q' must be s8 or e4m3, got ", name_of(q.dtype()));
  check_shape(q, {gate_up.size(0), gate_up.size(1) / 2}, op, "q");
  LOWBIT_CHECK(q.stride(1) == 1 || q.size(1) <= 1, op, ": argument 'q' must be contiguous in its last dimension");
  check_defined(scales, op, "scales");
  check_dtype(scales, ScalarType::f32, op, "scales");
  check_shape(scales, {gate_up.size(0)}, op, "scales");
  check_contiguous(scales, op, "scales");
  const Device dev = op_device(op, {{"gate_up", &gate_up}, {"q", &q}, {"scales", &scales}});
  if (dev.is_cpu())
    LOWBIT_NOT_SUPPORTED(op, ": runs on the GPU only (on the CPU, silu_mul and the linear's own quantizer)");
#ifdef LOWBIT_WITH_CUDA
  const cpu::RowView gv = rows_of(gate_up, op, "gate_up");
  const cudaStream_t stream = cuda::current_stream();
  if (cuda::silu_mul_quantize(gpu_rows(gv), q.data_ptr(), q.stride(0), q.dtype(), scales.data<float>(), pdl, stream))
    return;
  // Rows the fused kernel does not take: the two kernels it replaces (the same bytes).
  Tensor act = Tensor::empty({gate_up.size(0), gate_up.size(1) / 2}, ScalarType::f16, dev);
  silu_mul(gate_up, act);
  if (q.dtype() == ScalarType::e4m3) cuda::quantize_per_token_e4m3(act, q, scales, stream);
  else cuda::quantize_per_token_s8(act, q, scales, stream);
#else
  (void)pdl;
  no_cuda_kernel(op);
#endif
}

#ifdef LOWBIT_WITH_CUDA
namespace {

// out.q / out.scales for FMPQ codes of [T, k] on `dev` (undefined ones allocated), checked; the block map recorded.
void fmpq_outputs(FmpqActivation& out, int64_t T, int64_t k, const Tensor& block_bits, const Tensor& perm,
                  const Device& dev, const char* op) {
  const int64_t blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  LOWBIT_CHECK(block_bits.defined() && block_bits.dim() == 1 && block_bits.size(0) == blocks, op,
               ": argument 'block_bits' must have shape [", blocks, "] (one entry per ", kFmpqBlock,
               " channels of k=", k, "), got ", block_bits.defined() ? shape_str(block_bits.shape()) : "undefined");
  if (!out.q.defined()) out.q = Tensor::empty({T, k}, ScalarType::s8, dev);
  if (!out.scales.defined()) out.scales = Tensor::empty({T, blocks}, ScalarType::f32, dev);
  check_dtype(out.q, ScalarType::s8, op, "q");
  check_shape(out.q, {T, k}, op, "q");
  LOWBIT_CHECK(out.q.stride(1) == 1 || k <= 1, op, ": argument 'q' must be contiguous in its last dimension");
  check_dtype(out.scales, ScalarType::f32, op, "scales");
  check_shape(out.scales, {T, blocks}, op, "scales");
  check_contiguous(out.scales, op, "scales");
  if (perm.defined()) {  // its values were checked where it was set (Model.set_input_permutation)
    check_dtype(perm, ScalarType::s32, op, "perm");
    check_shape(perm, {k}, op, "perm");
    check_contiguous(perm, op, "perm");
  }
  out.block_bits = block_bits;
}

}  // namespace
#endif

void rms_norm_quantize_fmpq(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                            const Tensor& block_bits, const Tensor& perm, FmpqActivation& out) {
  constexpr const char* op = "rms_norm_quantize_fmpq";
  check_float(residual, op, "residual");
  check_dim(residual, 2, op, "residual");
  if (x.defined()) {
    check_float(x, op, "x");
    check_same_rows(residual, "residual", x, "x", op);
  }
  check_norm_weight(weight, residual.size(-1), op);
  LOWBIT_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const Device dev = op_device(op, {{"residual", &residual}, {"x", &x}, {"weight", &weight}, {"perm", &perm},
                                    {"q", &out.q}, {"scales", &out.scales}});
  if (dev.is_cpu())
    LOWBIT_NOT_SUPPORTED(op, ": runs on the GPU only (on the CPU, rms_norm, the permutation and quantize_fmpq)");
#ifdef LOWBIT_WITH_CUDA
  const int64_t T = residual.size(0), H = residual.size(1);
  fmpq_outputs(out, T, H, block_bits, perm, dev, op);
  const cuda::FmpqBits bits = cuda::fmpq_bits_of(block_bits, op);
  const cudaStream_t stream = cuda::current_stream();
  const cuda::Rows rv = gpu_rows(rows_of(residual, op, "residual")), wv = gpu_rows(rows_of(weight, op, "weight"));
  const cuda::Rows xv = x.defined() ? gpu_rows(rows_of(x, op, "x")) : cuda::Rows{};
  if (cuda::norm_quantize_fmpq(rv, xv, wv, eps, bits, perm.defined() ? perm.data<int32_t>() : nullptr,
                               out.q.data<int8_t>(), out.q.stride(0), out.scales.data<float>(), stream))
    return;
  // Rows the fused kernel does not take: the two kernels it replaces (the same bytes).
  Tensor normed = Tensor::empty({T, H}, residual.dtype(), dev);
  if (x.defined()) add_rms_norm(residual, x, weight, eps, normed);
  else rms_norm(residual, weight, eps, normed);
  cuda::quantize_fmpq(normed, block_bits, out.q, out.scales, stream, perm);
#else
  (void)block_bits;
  no_cuda_kernel(op);
#endif
}

void silu_mul_quantize_fmpq(const Tensor& gate_up, const Tensor& block_bits, const Tensor& perm,
                            FmpqActivation& out) {
  constexpr const char* op = "silu_mul_quantize_fmpq";
  check_float(gate_up, op, "gate_up");
  check_dim(gate_up, 2, op, "gate_up");
  LOWBIT_CHECK(gate_up.size(1) % 2 == 0, op, ": argument 'gate_up' must have an even last dimension [T, 2 * I], got ",
               shape_str(gate_up.shape()));
  const Device dev =
      op_device(op, {{"gate_up", &gate_up}, {"perm", &perm}, {"q", &out.q}, {"scales", &out.scales}});
  if (dev.is_cpu())
    LOWBIT_NOT_SUPPORTED(op, ": runs on the GPU only (on the CPU, silu_mul, the permutation and quantize_fmpq)");
#ifdef LOWBIT_WITH_CUDA
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  fmpq_outputs(out, T, I, block_bits, perm, dev, op);
  const cudaStream_t stream = cuda::current_stream();
  if (gate_up.dtype() == ScalarType::f16) {
    cuda::silu_mul_quantize_fmpq(gate_up, block_bits, out.q, out.scales, stream, perm);
    return;
  }
  Tensor act = Tensor::empty({T, I}, gate_up.dtype(), dev);  // f32 / bf16 rows: the two kernels
  silu_mul(gate_up, act);
  cuda::quantize_fmpq(act, block_bits, out.q, out.scales, stream, perm);
#else
  (void)block_bits;
  no_cuda_kernel(op);
#endif
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  constexpr const char* op = "embedding";
  check_defined(ids, op, "ids");
  check_dtype(ids, ScalarType::s32, op, "ids");
  check_dim(ids, 1, op, "ids");
  check_float(table, op, "table");
  check_dim(table, 2, op, "table");
  check_float(out, op, "out");
  check_shape(out, {ids.size(0), table.size(1)}, op, "out");
  const Device dev = op_device(op, {{"ids", &ids}, {"table", &table}, {"out", &out}});
  const cpu::RowView tv = rows_of(table, op, "table"), ov = rows_of(out, op, "out");
  if (dev.is_cuda()) {
#ifdef LOWBIT_WITH_CUDA
    // The ids live on the device: checking them here would cost a synchronizing copy, so the
    // kernel writes a NaN row for an id outside the table instead (callers check ids on the host).
    check_contiguous(ids, op, "ids");
    return cuda::embedding(ids.data<int32_t>(), gpu_rows(tv), gpu_rows(ov), cuda::current_stream());
#else
    no_cuda_kernel(op);
#endif
  }
  const Tensor idc = ids.contiguous();
  const int32_t* id = idc.data<int32_t>();
  for (int64_t t = 0; t < ids.size(0); ++t)
    LOWBIT_CHECK_KIND(ErrorKind::kIndex, id[t] >= 0 && id[t] < table.size(0), op, ": ids[", t, "] = ", id[t],
                      " is out of range for a table of ", table.size(0), " rows");
  cpu::embedding_cpu(id, tv, ov);
}

void gather_columns(const Tensor& x, const Tensor& perm, Tensor& out) {
  constexpr const char* op = "gather_columns";
  check_float(x, op, "x");
  check_dim(x, 2, op, "x");
  check_dtype(out, x.dtype(), op, "out");
  check_shape(out, {x.size(0), x.size(1)}, op, "out");
  check_contiguous(out, op, "out");
  check_defined(perm, op, "perm");
  check_dtype(perm, ScalarType::s32, op, "perm");
  check_shape(perm, {x.size(1)}, op, "perm");
  check_contiguous(perm, op, "perm");
  const Device dev = op_device(op, {{"x", &x}, {"perm", &perm}, {"out", &out}});
  LOWBIT_CHECK(x.data_ptr() != out.data_ptr(), op, ": 'out' must not alias 'x' (a gather in place would read "
               "columns it already overwrote)");
  const cpu::RowView xv = rows_of(x, op, "x"), ov = rows_of(out, op, "out");
  if (dev.is_cuda()) {
#ifdef LOWBIT_WITH_CUDA
    return cuda::gather_columns(gpu_rows(xv), perm.data<int32_t>(), gpu_rows(ov), cuda::current_stream());
#else
    no_cuda_kernel(op);
#endif
  }
  const int32_t* p = perm.data<int32_t>();
  const int64_t k = x.size(1);
  for (int64_t j = 0; j < k; ++j)
    LOWBIT_CHECK_KIND(ErrorKind::kIndex, p[j] >= 0 && p[j] < k, op, ": perm[", j, "] = ", p[j],
                      " is out of range for rows of ", k, " columns");
  const size_t es = size_t(x.nbytes() / std::max<int64_t>(1, x.numel()));
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t t = 0; t < x.size(0); ++t)  // the element bytes are copied as they are
    for (int64_t j = 0; j < k; ++j) std::memcpy(dst + (t * k + j) * es, src + (t * xv.stride + p[j]) * es, es);
}

void softmax(const Tensor& x, Tensor& out) {
  constexpr const char* op = "softmax";
  check_float(x, op, "x");
  check_float(out, op, "out");
  check_same_rows(x, "x", out, "out", op);
  const Device dev = op_device(op, {{"x", &x}, {"out", &out}});
  if (!dev.is_cpu()) LOWBIT_NOT_SUPPORTED(op, ": no GPU kernel (sampling runs on the host); got ", x.str());
  const cpu::RowView xv = rows_of(x, op, "x"), ov = rows_of(out, op, "out");
  cpu::softmax_cpu(xv, ov);
}

}  // namespace lowbit::ops
