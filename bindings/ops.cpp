// Op entry points for Python: linear, norms, elementwise, sampling. Tensors come in as lowbit.Tensor
// or any DLPack object (torch, numpy) zero-copy; an `out` given by the caller is written in place and
// returned, otherwise a new lowbit.Tensor is returned.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bind.h"
#include "bindings/tensor_arg.h"
#include "lowbit/ops/ops.h"
#include "lowbit/quant/activation.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"
#endif

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

ops::LinearActivation activation_from_name(const std::string& s) {
  if (s == "float" || s == "a16") return ops::LinearActivation::float16;
  if (s == "int8_per_token" || s == "int8" || s == "a8") return ops::LinearActivation::int8_per_token;
  if (s == "fmpq" || s == "fmpq_mixed" || s == "a4") return ops::LinearActivation::fmpq_mixed;
  if (s == "fp8_per_token" || s == "fp8") return ops::LinearActivation::fp8_per_token;
  LOWBIT_FAIL(ErrorKind::kValue,
              "linear: argument 'act' must be one of 'float', 'int8_per_token', 'fmpq', 'fp8_per_token', got '",
              s, "'");
}

Tensor optional_tensor(nb::handle obj, const char* arg) { return obj.is_none() ? Tensor() : tensor_from_python(obj, arg); }

// `out` as given, or a new tensor of the shape and dtype the op produces on the device of its input
// (a CPU default would refuse GPU inputs by naming an 'out' the caller never passed).
Tensor output(nb::handle obj, const Shape& shape, ScalarType dtype, const Device& device, const char* arg = "out") {
  return obj.is_none() ? Tensor::empty(shape, dtype, device) : tensor_from_python(obj, arg);
}

nb::object result(nb::handle given, const Tensor& made) { return given.is_none() ? nb::cast(made) : nb::borrow(given); }

// One row of f32 logits on the CPU, as the sampling ops take it.
Tensor logits_row(nb::handle obj, const char* op) {
  Tensor t = tensor_from_python(obj, "logits");
  check_dtype(t, ScalarType::f32, op, "logits");
  check_dim(t, 1, op, "logits");
  check_contiguous(t, op, "logits");
  LOWBIT_CHECK(t.size(0) > 0, op, ": argument 'logits' is empty (a vocabulary of 0 tokens)");
  if (!t.device().is_cpu())
    LOWBIT_NOT_SUPPORTED(op, ": argument 'logits' is on ", t.device().str(), "; sampling runs on CPU logits");
  return t;
}

ops::SamplingParams sampling_params(float temperature, int top_k, float top_p, float min_p) {
  ops::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

}  // namespace

void bind_ops(nb::module_& m) {
  m.def(
      "linear",
      [](nb::handle x, const PackedWeight& w, nb::handle bias, nb::handle out, const std::string& act,
         const std::string& kernel) {
        const Tensor xt = tensor_from_python(x, "x");
        Tensor y = output(out, {xt.dim() == 2 ? xt.size(0) : 0, w.n}, xt.dtype(), xt.device());
        ops::linear(xt, w, optional_tensor(bias, "bias"), y, activation_from_name(act), kernel);
        return result(out, y);
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("out") = nb::none(),
      nb::arg("act") = "float", nb::arg("kernel") = "",
      "y[m, n] = x[m, k] @ W.T (+ bias). x: f32/f16/bf16; w: a PackedWeight (pack_weight(..., 'cpu')); act: "
      "'float' (dequantize weights, f32 accumulate), 'int8_per_token' (w8/qoq/liquid: exact int32 s8 x s8) or "
      "'fp8_per_token' (e4m3: per-token e4m3 activations, f32 sums of exact products). kernel: a registered "
      "GEMM kernel name to force (lowbit._core.kernels.gemm_kernels() lists them; one that cannot run raises with its reason), "
      "'' for the registry's choice.");
  m.def(
      "linear_fmpq",
      [](nb::handle q, nb::handle scales, const PackedWeight& w, nb::handle bias, nb::handle out,
         nb::handle block_bits, const std::string& kernel) {
        FmpqActivation x;
        x.q = tensor_from_python(q, "q");
        x.scales = tensor_from_python(scales, "scales");
        x.block_bits = optional_tensor(block_bits, "block_bits");
        Tensor y = output(out, {x.q.dim() == 2 ? x.q.size(0) : 0, w.n}, ScalarType::f32, x.q.device());
        ops::linear_fmpq(x, w, optional_tensor(bias, "bias"), y, kernel);
        return result(out, y);
      },
      nb::arg("q"), nb::arg("scales"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("out") = nb::none(),
      nb::arg("block_bits") = nb::none(), nb::arg("kernel") = "",
      "COMET W4Ax: (q, scales) from quantize_fmpq times a qoq/liquid/w8 weight, exact int32 per 128-channel "
      "block; returns f32 [m, n] unless `out` (f32/f16/bf16) is given. block_bits (a host uint8 tensor of 4 / 8 "
      "per block, optional) lets the GPU run the int4 blocks on int4 tensor cores (gemm_fmpq_s4_sm80); kernel: a "
      "registered GEMM kernel name to force, '' for the registry's choice");
  m.def(
      "rms_norm",
      [](nb::handle x, nb::handle weight, float eps, nb::handle out) {
        const Tensor xt = tensor_from_python(x, "x");
        Tensor o = output(out, xt.shape(), xt.dtype(), xt.device());
        ops::rms_norm(xt, tensor_from_python(weight, "weight"), eps, o);
        return result(out, o);
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("eps") = 1e-5f, nb::arg("out") = nb::none(),
      "x / sqrt(mean(x^2) + eps) * weight over the last dimension (f32 math)");
  m.def(
      "add_rms_norm",
      [](nb::handle residual, nb::handle x, nb::handle weight, float eps, nb::handle out) {
        Tensor r = tensor_from_python(residual, "residual");
        Tensor o = output(out, r.shape(), r.dtype(), r.device());
        ops::add_rms_norm(r, tensor_from_python(x, "x"), tensor_from_python(weight, "weight"), eps, o);
        return result(out, o);
      },
      nb::arg("residual"), nb::arg("x"), nb::arg("weight"), nb::arg("eps") = 1e-5f, nb::arg("out") = nb::none(),
      "residual += x (in place), then returns rms_norm(residual) * weight");
  m.def(
      "silu_mul",
      [](nb::handle gate_up, nb::handle out) {
        const Tensor g = tensor_from_python(gate_up, "gate_up");
        Shape s = g.shape();
        if (!s.empty()) s.back() /= 2;
        Tensor o = output(out, s, g.dtype(), g.device());
        ops::silu_mul(g, o);
        return result(out, o);
      },
      nb::arg("gate_up"), nb::arg("out") = nb::none(), "silu(gate) * up for gate_up = [gate | up] on the last dim");
  m.def(
      "silu_mul_quantize",
      [](nb::handle gate_up, nb::handle q, nb::handle scales, bool pdl) {
        const Tensor g = tensor_from_python(gate_up, "gate_up");
        Tensor qt = tensor_from_python(q, "q"), st = tensor_from_python(scales, "scales");
        if (qt.dtype() == ScalarType::u8) qt = qt.as_dtype_view(ScalarType::e4m3);  // e4m3 codes as their bytes
        ops::silu_mul_quantize(g, qt, st, pdl);
      },
      nb::arg("gate_up"), nb::arg("q"), nb::arg("scales"), nb::arg("pdl") = true,
      "GPU: silu_mul with the per-token quantizer fused: q (s8, or e4m3 / its uint8 bytes [T, I]) and scales "
      "(f32 [T]) of the f16 rows silu_mul would write");
  m.def(
      "rms_norm_quantize",
      [](nb::handle residual, nb::handle x, nb::handle weight, float eps, nb::handle q, nb::handle scales) {
        Tensor r = tensor_from_python(residual, "residual");
        const Tensor xt = x.is_none() ? Tensor{} : tensor_from_python(x, "x");
        Tensor qt = tensor_from_python(q, "q"), st = tensor_from_python(scales, "scales");
        if (qt.dtype() == ScalarType::u8) qt = qt.as_dtype_view(ScalarType::e4m3);  // e4m3 codes as their bytes
        ops::rms_norm_quantize(r, xt, tensor_from_python(weight, "weight"), eps, qt, st);
      },
      nb::arg("residual"), nb::arg("x").none(), nb::arg("weight"), nb::arg("eps"), nb::arg("q"), nb::arg("scales"),
      "GPU: (residual += x when x is given) then the per-token codes q (s8, or e4m3 / its uint8 bytes) and scales "
      "(f32) of the f16 rows rms_norm(residual) * weight would write");
  m.def(
      "rms_norm_quantize_fmpq",
      [](nb::handle residual, nb::handle x, nb::handle weight, float eps, nb::handle block_bits, nb::handle perm,
         nb::handle q, nb::handle scales) {
        Tensor r = tensor_from_python(residual, "residual");
        FmpqActivation a;
        a.q = optional_tensor(q, "q");
        a.scales = optional_tensor(scales, "scales");
        ops::rms_norm_quantize_fmpq(r, optional_tensor(x, "x"), tensor_from_python(weight, "weight"), eps,
                                    tensor_from_python(block_bits, "block_bits"), optional_tensor(perm, "perm"), a);
        return nb::make_tuple(a.q, a.scales);
      },
      nb::arg("residual"), nb::arg("x").none(), nb::arg("weight"), nb::arg("eps"), nb::arg("block_bits"),
      nb::arg("perm").none() = nb::none(), nb::arg("q").none() = nb::none(), nb::arg("scales").none() = nb::none(),
      "GPU: (residual += x when x is given) then the COMET FMPQ codes (s8 [T, H]) and block scales (f32 [T, blocks]) "
      "quantize_fmpq makes of the f16 rows rms_norm(residual) * weight would write, gathered through perm (s32 [H] on "
      "the device, optional); block_bits: a host uint8 tensor of 4 / 8 per 128 channels. Returns (q, scales)");
  m.def(
      "silu_mul_quantize_fmpq",
      [](nb::handle gate_up, nb::handle block_bits, nb::handle perm, nb::handle q, nb::handle scales) {
        FmpqActivation a;
        a.q = optional_tensor(q, "q");
        a.scales = optional_tensor(scales, "scales");
        ops::silu_mul_quantize_fmpq(tensor_from_python(gate_up, "gate_up"), tensor_from_python(block_bits, "block_bits"),
                                    optional_tensor(perm, "perm"), a);
        return nb::make_tuple(a.q, a.scales);
      },
      nb::arg("gate_up"), nb::arg("block_bits"), nb::arg("perm").none() = nb::none(), nb::arg("q").none() = nb::none(),
      nb::arg("scales").none() = nb::none(),
      "GPU: silu_mul with quantize_fmpq fused: the COMET FMPQ codes and block scales of the f16 rows silu_mul would "
      "write (gate_up [T, 2I]), gathered through perm (optional). Returns (q, scales)");
  m.def(
      "_row_cluster_mode",
      [](int mode) {
#ifdef LOWBIT_WITH_CUDA
        return cuda::set_row_cluster_mode(mode);
#else
        (void)mode;
        return -1;
#endif
      },
      nb::arg("mode"),
      "GPU (sm_90) test knob: -1 row clusters for few rows (default), 0 never, 1 always; returns the previous mode");
  m.def(
      "embedding",
      [](nb::handle ids, nb::handle table, nb::handle out) {
        const Tensor i = tensor_from_python(ids, "ids"), t = tensor_from_python(table, "table");
        Tensor o = output(out, {i.dim() ? i.size(0) : 0, t.dim() == 2 ? t.size(1) : 0}, t.dtype(), t.device());
        ops::embedding(i, t, o);
        return result(out, o);
      },
      nb::arg("ids"), nb::arg("table"), nb::arg("out") = nb::none(), "Rows of table (f32/f16/bf16 [V, H]) at s32 ids");
  m.def(
      "gather_columns",
      [](nb::handle x, nb::handle perm, nb::handle out) {
        const Tensor xt = tensor_from_python(x, "x"), p = tensor_from_python(perm, "perm");
        Tensor o = output(out, xt.shape(), xt.dtype(), xt.device());
        ops::gather_columns(xt, p, o);
        return result(out, o);
      },
      nb::arg("x"), nb::arg("perm"), nb::arg("out") = nb::none(),
      "out[t, j] = x[t, perm[j]] (an act-order linear's input permutation); perm: s32 [k]");
  m.def(
      "softmax",
      [](nb::handle x, nb::handle out) {
        const Tensor xt = tensor_from_python(x, "x");
        Tensor o = output(out, xt.shape(), ScalarType::f32, xt.device());
        ops::softmax(xt, o);
        return result(out, o);
      },
      nb::arg("x"), nb::arg("out") = nb::none(), "Softmax over the last dimension (f32 math; default output f32)");
  m.def(
      "apply_penalties",
      [](nb::handle logits, const std::vector<int32_t>& history, float repetition_penalty, float presence_penalty,
         float frequency_penalty) {
        Tensor l = logits_row(logits, "apply_penalties");
        ops::SamplingParams p;
        p.repetition_penalty = repetition_penalty;
        p.presence_penalty = presence_penalty;
        p.frequency_penalty = frequency_penalty;
        ops::apply_penalties(l.data<float>(), l.size(0), history, p);
      },
      nb::arg("logits"), nb::arg("history"), nb::arg("repetition_penalty") = 1.f, nb::arg("presence_penalty") = 0.f,
      nb::arg("frequency_penalty") = 0.f,
      "In place on f32 logits [V]: HF repetition penalty, then OpenAI presence/frequency penalties");
  m.def(
      "sample_token",
      [](nb::handle logits, float temperature, int top_k, float top_p, float min_p, double uniform) {
        const Tensor l = logits_row(logits, "sample_token");
        return ops::sample_token(l.data<float>(), l.size(0), sampling_params(temperature, top_k, top_p, min_p),
                                 uniform);
      },
      nb::arg("logits"), nb::arg("temperature") = 1.f, nb::arg("top_k") = 0, nb::arg("top_p") = 1.f,
      nb::arg("min_p") = 0.f, nb::arg("uniform") = 0.5,
      "Greedy when temperature == 0, else temperature, top-k, top-p, min-p and the inverse CDF at `uniform`");
  m.def(
      "sample_rows",
      [](nb::handle logits, nb::handle params, nb::handle tokens, nb::handle logprobs) {
        constexpr const char* op = "sample_rows";
        const Tensor l = tensor_from_python(logits, "logits"), p = tensor_from_python(params, "params");
        const Tensor t = tensor_from_python(tokens, "tokens"), lp = tensor_from_python(logprobs, "logprobs");
#ifdef LOWBIT_WITH_CUDA
        cuda::check_cuda_tensor(l, op, "logits");
        LOWBIT_CHECK_TYPE(l.dtype() == ScalarType::f32 || l.dtype() == ScalarType::f16 || l.dtype() == ScalarType::bf16,
                          op, ": argument 'logits' must be f32, f16 or bf16, got ", name_of(l.dtype()));
        check_dim(l, 2, op, "logits");
        LOWBIT_CHECK(l.stride(1) == 1, op, ": argument 'logits' needs unit stride in the last dim");
        const int64_t rows = l.size(0);
        cuda::check_same_device(p, l, op, "params");
        check_dtype(p, ScalarType::s64, op, "params");
        check_shape(p, {rows, 5}, op, "params");
        check_contiguous(p, op, "params");
        cuda::check_same_device(t, l, op, "tokens");
        check_dtype(t, ScalarType::s32, op, "tokens");
        check_shape(t, {rows}, op, "tokens");
        cuda::check_same_device(lp, l, op, "logprobs");
        check_dtype(lp, ScalarType::f32, op, "logprobs");
        check_shape(lp, {rows}, op, "logprobs");
        cuda::sample_rows(cuda::Rows{l.data_ptr(), l.dtype(), rows, l.size(1), l.stride(0)},
                          static_cast<const double*>(p.data_ptr()), t.data<int32_t>(), lp.data<float>(), nullptr);
        LOWBIT_CUDA_CHECK(op, cudaStreamSynchronize(nullptr));
#else
        (void)l, (void)p, (void)t, (void)lp;
        LOWBIT_NOT_SUPPORTED(op, ": needs a CUDA build of lowbit");
#endif
      },
      nb::arg("logits"), nb::arg("params"), nb::arg("tokens"), nb::arg("logprobs"),
      "GPU: one token per row of logits [rows, V] (CUDA, f32/f16/bf16) with sample_token's semantics; params: f64 "
      "(temperature, top_k, top_p, min_p, uniform) per row, passed as int64 [rows, 5] bits; writes tokens (s32) and "
      "their log-softmax (f32), and waits for the result");
  m.def(
      "token_logprob",
      [](nb::handle logits, int32_t token) {
        const Tensor l = logits_row(logits, "token_logprob");
        return ops::token_logprob(l.data<float>(), l.size(0), token);
      },
      nb::arg("logits"), nb::arg("token"));
  m.def(
      "top_logprobs",
      [](nb::handle logits, int n) {
        const Tensor l = logits_row(logits, "top_logprobs");
        return ops::top_logprobs(l.data<float>(), l.size(0), n);
      },
      nb::arg("logits"), nb::arg("n"), "The n best (token, logprob) pairs, best first");
}

}  // namespace lowbit::bindings
