// ops::rope: argument checks, then the kernel for the tensors' device.
#include "kernels/cpu/rope_cpu.h"
#include "lowbit/ops/ops.h"
#include "ops/op_checks.h"
#include "ops/op_device.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::ops {

namespace {

void check_rope_input(const Tensor& t, const char* op, const char* arg) {
  LOWBIT_CHECK_TYPE(t.dtype() == ScalarType::f32 || t.dtype() == ScalarType::f16 || t.dtype() == ScalarType::bf16,
                    op, ": argument '", arg, "' must be f32, f16 or bf16, got ", name_of(t.dtype()));
  check_dim(t, 3, op, arg);
  LOWBIT_CHECK(t.stride(2) == 1 || t.size(2) <= 1, op, ": argument '", arg,
               "' must be contiguous in its last dimension, got strides ", shape_str(t.strides()));
}

}  // namespace

Device check_rope_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& positions,
                       const RopeConfig& cfg) {
  LOWBIT_CHECK(q.defined() || k.defined(), op, ": arguments 'q' and 'k' are both undefined");
  if (q.defined()) check_rope_input(q, op, "q");
  if (k.defined()) check_rope_input(k, op, "k");
  const Tensor& any = q.defined() ? q : k;
  const int64_t T = any.size(0), D = any.size(2);
  if (q.defined() && k.defined()) {
    LOWBIT_CHECK(k.size(0) == T && k.size(2) == D, op, ": arguments 'q' ", shape_str(q.shape()), " and 'k' ",
                 shape_str(k.shape()), " must agree on tokens (dim 0) and head_dim (dim 2)");
  }
  check_defined(positions, op, "positions");
  check_dtype(positions, ScalarType::s32, op, "positions");
  check_shape(positions, {T}, op, "positions");
  check_contiguous(positions, op, "positions");
  const Device dev = op_device(op, {{"q", &q}, {"k", &k}, {"positions", &positions}});
  const int64_t rd = cfg.rotary_dim > 0 ? cfg.rotary_dim : D;
  LOWBIT_CHECK(cfg.rotary_dim >= 0 && rd <= D && rd % 2 == 0, op, ": rotary_dim ", cfg.rotary_dim,
               " must be even and in [0, head_dim = ", D, "] (0 = head_dim)");
  LOWBIT_CHECK(cfg.theta > 0, op, ": theta must be positive, got ", cfg.theta);
  LOWBIT_CHECK(cfg.linear_factor > 0, op, ": linear scaling factor must be positive, got ", cfg.linear_factor);
  if (cfg.llama3) {
    LOWBIT_CHECK(cfg.factor > 0, op, ": llama3 factor must be positive, got ", cfg.factor);
    LOWBIT_CHECK(cfg.high_freq_factor > cfg.low_freq_factor && cfg.low_freq_factor > 0, op,
                 ": llama3 needs 0 < low_freq_factor < high_freq_factor, got ", cfg.low_freq_factor, " and ",
                 cfg.high_freq_factor);
    LOWBIT_CHECK(cfg.original_max_position > 0, op, ": llama3 original_max_position must be positive, got ",
                 cfg.original_max_position);
  }
  return dev;
}

void rope(Tensor& q, Tensor& k, const Tensor& positions, const RopeConfig& cfg) {
  const Device dev = check_rope_args("rope", q, k, positions, cfg);
  if (dev.is_cpu()) return cpu::rope_cpu(q, k, positions, cfg);
#ifdef LOWBIT_WITH_CUDA
  // The same frequency table as the CPU kernel (llama3 / linear scaling applied in double).
  const int64_t D = q.defined() ? q.size(2) : k.size(2);
  const int rd = cfg.rotary_dim > 0 ? cfg.rotary_dim : static_cast<int>(D);
  cuda::rope(q, k, positions, cpu::rope_inv_freq(cfg, rd), cfg.neox, cuda::current_stream());
#endif
}

}  // namespace lowbit::ops
