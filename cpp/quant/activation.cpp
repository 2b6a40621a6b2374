// Dynamic activation quantization: per-token s8 (QServe / SmoothQuant W8A8) and COMET's FMPQ blocks.
#include "lowbit/quant/activation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace lowbit {
namespace {

// x as contiguous host f32 [m, k], every value finite.
Tensor float_activation(const Tensor& x, const char* op) {
  check_defined(x, op, "x");
  check_dim(x, 2, op, "x");
  LOWBIT_CHECK_TYPE(x.device().is_cpu(), op, ": argument 'x' must be on the CPU, got ", x.device().str());
  LOWBIT_CHECK_TYPE(x.dtype() == ScalarType::f32 || x.dtype() == ScalarType::f16 || x.dtype() == ScalarType::bf16,
                    op, ": argument 'x' must be f32, f16 or bf16, got ", name_of(x.dtype()));
  const Tensor c = x.contiguous();
  const int64_t count = c.numel();
  Tensor out = c.dtype() == ScalarType::f32 ? c : Tensor::empty(c.shape(), ScalarType::f32);
  float* dst = out.data<float>();
  if (c.dtype() != ScalarType::f32) {
    const uint16_t* src = c.data<uint16_t>();
    const bool half = c.dtype() == ScalarType::f16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) dst[i] = half ? f16_bits_to_f32(src[i]) : bf16_bits_to_f32(src[i]);
  }
  int64_t bad = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : bad)
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(dst[i])) bad = std::min(bad, i);
  const int64_t k = std::max<int64_t>(1, x.size(1));
  LOWBIT_CHECK(bad == INT64_MAX, op, ": argument 'x' must be finite, got ", bad == INT64_MAX ? 0.f : dst[bad],
               " at row ", bad / k, " column ", bad % k);
  return out;
}

// Allocates `t` when undefined, else checks it can receive the result.
void prepare_output(Tensor& t, const Shape& shape, ScalarType dtype, const char* op, const char* arg) {
  if (!t.defined()) {
    t = Tensor::empty(shape, dtype);
    return;
  }
  check_dtype(t, dtype, op, arg);
  check_shape(t, shape, op, arg);
  check_contiguous(t, op, arg);
  LOWBIT_CHECK_TYPE(t.device().is_cpu(), op, ": argument '", arg, "' must be on the CPU, got ", t.device().str());
}

// Symmetric quantization of x[0, len) with qmax levels each side; returns the scale.
float quantize_span(const float* x, int64_t len, float qmax, int8_t* q) {
  float amax = 0.f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax > 0.f ? amax / qmax : 1.f;
  for (int64_t i = 0; i < len; ++i) {
    const float r = std::nearbyint(x[i] / s);
    q[i] = static_cast<int8_t>(r < -qmax ? -qmax : (r > qmax ? qmax : r));
  }
  return s;
}

}  // namespace

void quantize_per_token_s8(const Tensor& x, Tensor& q, Tensor& scales) {
  constexpr const char* kOp = "quantize_per_token_s8";
  const Tensor xf = float_activation(x, kOp);
  const int64_t m = xf.size(0), k = xf.size(1);
  prepare_output(q, {m, k}, ScalarType::s8, kOp, "q");
  prepare_output(scales, {m}, ScalarType::f32, kOp, "scales");
  const float* xp = xf.data<float>();
  int8_t* qp = q.data<int8_t>();
  float* sp = scales.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) sp[r] = quantize_span(xp + r * k, k, 127.f, qp + r * k);
}

void quantize_fmpq(const Tensor& x, const Tensor& block_bits, FmpqActivation& out) {
  constexpr const char* kOp = "quantize_fmpq";
  const Tensor xf = float_activation(x, kOp);
  const int64_t m = xf.size(0), k = xf.size(1), blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  check_defined(block_bits, kOp, "block_bits");
  check_dtype(block_bits, ScalarType::u8, kOp, "block_bits");
  check_shape(block_bits, {blocks}, kOp, "block_bits");
  LOWBIT_CHECK_TYPE(block_bits.device().is_cpu(), kOp, ": argument 'block_bits' must be on the CPU, got ",
                    block_bits.device().str());
  const Tensor bits = block_bits.contiguous().clone();
  const uint8_t* bp = bits.data<uint8_t>();
  for (int64_t b = 0; b < blocks; ++b)
    LOWBIT_CHECK(bp[b] == 4 || bp[b] == 8, kOp, ": argument 'block_bits' must hold 4 or 8 per block of ", kFmpqBlock,
                 " channels, got ", int(bp[b]), " for block ", b);
  prepare_output(out.q, {m, k}, ScalarType::s8, kOp, "q");
  prepare_output(out.scales, {m, blocks}, ScalarType::f32, kOp, "scales");
  out.block_bits = bits;
  const float* xp = xf.data<float>();
  int8_t* qp = out.q.data<int8_t>();
  float* sp = out.scales.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kFmpqBlock, len = std::min<int64_t>(kFmpqBlock, k - c0);
      sp[r * blocks + b] = quantize_span(xp + r * k + c0, len, bp[b] == 4 ? 7.f : 127.f, qp + r * k + c0);
    }
}

}  // namespace lowbit
