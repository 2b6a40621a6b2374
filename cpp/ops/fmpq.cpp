// ops::quantize_fmpq: COMET FMPQ activations on x's device (the CPU reference, or the GPU kernel that
// gives the same bytes, optionally gathering x[:, perm] as it reads).
#include "lowbit/ops/ops.h"
#include "lowbit/quant/activation.h"
#include "ops/op_device.h"

#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::ops {

void quantize_fmpq(const Tensor& x, const Tensor& block_bits, FmpqActivation& out) {
  quantize_fmpq(x, block_bits, Tensor(), out);
}

void quantize_fmpq(const Tensor& x, const Tensor& block_bits, const Tensor& perm, FmpqActivation& out) {
  constexpr const char* op = "quantize_fmpq";
  check_defined(x, op, "x");
  if (x.device().is_cpu()) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, !perm.defined(), op,
                      ": on the CPU the permutation is a separate gather (Model does it); pass none");
    return lowbit::quantize_fmpq(x, block_bits, out);
  }
  const Device dev = op_device(op, {{"x", &x}, {"perm", &perm}, {"q", &out.q}, {"scales", &out.scales}});
#ifdef LOWBIT_WITH_CUDA
  check_dim(x, 2, op, "x");
  const int64_t m = x.size(0), k = x.size(1), blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  if (!out.q.defined()) out.q = Tensor::empty({m, k}, ScalarType::s8, dev);
  if (!out.scales.defined()) out.scales = Tensor::empty({m, blocks}, ScalarType::f32, dev);
  cuda::quantize_fmpq(x, block_bits, out.q, out.scales, cuda::current_stream(), perm);
  out.block_bits = block_bits;
#else
  LOWBIT_NOT_SUPPORTED(op, ": ", dev.str(), " needs a CUDA build of lowbit");
#endif
}

}  // namespace lowbit::ops
