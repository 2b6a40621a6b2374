// The mma.sync GEMM kernels (cpp/kernels/sm80/gemm_*_sm80.cu, sm_80 and newer) in the GEMM registry.
// Their can_run is plain C++ so that a CPU-only build still knows them (docs/support.md); the
// launches exist only in CUDA builds. GPU linears compute in f16 and take the bias in f16.
#include "kernels/registry/registration.h"

#include <utility>

#include "kernels/sm80/gemv_rules.h"  // plain C++: the GEMVs' shape rules, shared with the ops
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::kernels {

// Shared by the sm90 entries (gemm_sm90_entries.cpp).
bool gpu_gemm_common(const GemmDesc& d, std::string* why, int min_sm) {
  if (!on_device(DeviceKind::cuda, d.device, why)) return false;
  if (d.sm < min_sm) return refuse(why, "needs sm_" + std::to_string(min_sm) + " or newer"), false;
  if (d.packed != PackTarget::sm80) return refuse(why, "needs a weight packed for sm80"), false;
  if (d.y_type != ScalarType::f16) return refuse(why, "writes f16 rows"), false;
  return true;
}

// Shared-memory opt-in per block by compute capability: sm_86/89 offer 99 KB, sm_80/87 163 KB, sm_90 227 KB.
int smem_optin_kb(int sm) { return sm == 86 || sm == 89 ? 99 : sm >= 90 ? 227 : 163; }

namespace {

bool f16_gemm(const GemmDesc& d, std::string* why) {
  if (!gpu_gemm_common(d, why, 80)) return false;
  if (d.act != ActivationMode::float16) return refuse(why, "float activations only"), false;
  if (d.x_type != ScalarType::f16) return refuse(why, "needs f16 activations"), false;
  if (d.weight != WeightFormat::f16) return refuse(why, std::string("needs f16 weights, got ") + name_of(d.weight)), false;
  return true;
}

// The f16 mma tiles: 32 tokens (92 KB of shared memory) up to m = 32, 64/128 tokens (110 KB) beyond.
bool mma_tile_fits(const GemmDesc& d) {
  const bool small_tile = decode_sized(d.m);
  return smem_optin_kb(d.sm) >= (small_tile ? 90 : 108);
}

Fit gemv_can_run(const GemmDesc& d, std::string* why) {
  if (!f16_gemm(d, why)) return Fit::no;
  if (!decode_sized(d.m))
    return slow(why, "one warp per output column re-reads the weight every 16 rows: slow past 16 tokens");
  return fits(why, "one warp per output column, <= 16 rows per pass");
}
int gemv_rank(const GemmDesc& d) { return d.m == MBucket::m1 ? 3 : decode_sized(d.m) ? 1 : -1; }

Fit mma_can_run(const GemmDesc& d, std::string* why) {
  if (!f16_gemm(d, why)) return Fit::no;
  if (!d.aligned_rows) return refuse(why, "cp.async needs 16-byte aligned rows (k % 8 == 0)");
  if (!mma_tile_fits(d))
    return refuse(why, "its " + std::string(name_of(d.m)) + " tile needs 110 KB of shared memory, " +
                           arch_name(d.device, d.sm) + " offers " + std::to_string(smem_optin_kb(d.sm)) + " KB");
  return fits(why, "mma.sync m16n8k16, cp.async pipeline, split-K for small m");
}
int mma_rank(const GemmDesc&) { return 2; }

Fit wmma_can_run(const GemmDesc& d, std::string* why) {
  if (!f16_gemm(d, why)) return Fit::no;
  if (!decode_sized(d.m) && (!d.aligned_rows || !mma_tile_fits(d)))
    return slow(why, "wmma 16x16x16 without a cp.async pipeline: the mma kernel cannot run this shape");
  return fits(why, "wmma 16x16x16, any alignment");
}
int wmma_rank(const GemmDesc&) { return 0; }

}  // namespace

// W4A16 (u4 groups x f16 activations): shared by the mma.sync kernels here and the wgmma one
// (gemm_sm90_entries.cpp), which read the same packed weight.
Fit w4a16_can_run(const GemmDesc& d, std::string* why) {
  if (!gpu_gemm_common(d, why, 80)) return Fit::no;
  if (d.act != ActivationMode::float16) return refuse(why, "float activations only");
  if (d.x_type != ScalarType::f16) return refuse(why, "needs f16 activations");
  if (d.weight != WeightFormat::w4) return refuse(why, std::string("needs w4 weights, got ") + name_of(d.weight));
  if (d.group <= 0 || d.group % 32 != 0)
    return refuse(why, "group " + std::to_string(d.group) + " has no W4A16 GPU kernel (groups must be multiples of 32)");
  if (d.k % 64 != 0) return refuse(why, "needs k a multiple of 64, got k=" + std::to_string(d.k));
  return fits(why);
}

namespace {

Fit w4a16_small_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = w4a16_can_run(d, why);
  if (f == Fit::yes && why) *why = "8..64-token tiles, dequantize per warp, split-K to fill the SMs";
  return f;
}
Fit w4a16_large_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = w4a16_can_run(d, why);
  if (f == Fit::yes && why) *why = "64/128-token tiles, dequantize once per block";
  return f;
}
// The register-direct GEMV (gemm_w4a16_gemv_sm80.cu): one token per plan bucket (the op takes 1-8 when named).
Fit w4a16_gemv_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = w4a16_can_run(d, why);
  if (f != Fit::yes) return f;
  if (d.m != MBucket::m1) return refuse(why, "a GEMV: its plans serve one token (the op takes 1-8 when named)");
  if (why) *why = "weights streamed straight into registers (no shared-memory staging), mma.sync, k split in the CTA";
  return f;
}
// At one token on sm_90, every layer of k <= 32768 (the kernel's limit), above decode90 (rank 3 on layers of 16384
// rows or more) and the small kernel (rank 2): at its automatic configuration (32 or 24 warps per SM) it was measured
// 1.09-1.14x decode90 on gate_up and 1.12-1.49x the small kernel on the other Llama-3-8B and 70B/TP2 layers (H200,
// docs/benchmarks_gpu.md, "W4A16 decode on Hopper", round 4); on other GPUs it is unmeasured, so forced only
// (pick_kernel in gemm_w4a16_sm80.cu is the op's copy of this rule).
int w4a16_gemv_rank(const GemmDesc& d) { return d.m == MBucket::m1 && d.sm == 90 && d.k <= 32768 ? 4 : 0; }
// From 128 tokens the large-M kernel wins (it dequantizes each weight chunk once per block).
int w4a16_small_rank(const GemmDesc& d) { return d.m == MBucket::m_large ? 1 : 2; }
int w4a16_large_rank(const GemmDesc& d) { return d.m == MBucket::m_large ? 2 : 0; }

}  // namespace

// 8-bit GEMMs (s8 x s8 W8A8, e4m3 x e4m3 FP8): the activations arrive as f16 rows (the launch
// quantizes them per token) or as codes with f32 scales (the fused norm made them).
Fit gemm8_can_run(const GemmDesc& d, std::string* why, int min_sm, bool fp8) {
  if (!gpu_gemm_common(d, why, min_sm)) return Fit::no;
  const ActivationMode act = fp8 ? ActivationMode::fp8_per_token : ActivationMode::int8_per_token;
  const WeightFormat wf = fp8 ? WeightFormat::e4m3 : WeightFormat::w8;
  const ScalarType codes = fp8 ? ScalarType::e4m3 : ScalarType::s8;
  if (d.act != act) return refuse(why, std::string(name_of(act)) + " activations only");
  if (d.weight != wf) return refuse(why, std::string("needs ") + name_of(wf) + " weights, got " + name_of(d.weight));
  if (d.x_type != ScalarType::f16 && d.x_type != codes)
    return refuse(why, std::string("needs f16 rows or ") + name_of(codes) + " codes");
  if (d.k % 64 != 0) return refuse(why, "needs k a multiple of 64, got " + std::to_string(d.k));
  if (d.group > 0) return refuse(why, "needs per-channel weight scales (grouped w8 runs with f16 activations)");
  return fits(why);
}

namespace {
// W8A16: w8 weights (per channel, or grouped as GGUF Q8_0 stores them) x f16 activations.
Fit w8a16_can_run(const GemmDesc& d, std::string* why) {
  if (!gpu_gemm_common(d, why, 80)) return Fit::no;
  if (d.act != ActivationMode::float16) return refuse(why, "float activations only");
  if (d.x_type != ScalarType::f16) return refuse(why, "needs f16 activations");
  if (d.weight != WeightFormat::w8) return refuse(why, std::string("needs w8 weights, got ") + name_of(d.weight));
  if (d.group < 0 || d.group % 32 != 0)
    return refuse(why, "group " + std::to_string(d.group) + " has no W8A16 GPU kernel (per channel or multiples of 32)");
  if (d.k % 64 != 0) return refuse(why, "needs k a multiple of 64, got k=" + std::to_string(d.k));
  return fits(why, d.m == MBucket::m_large ? "mma.sync, 128x128 tiles (no wgmma version yet)"
                                           : "mma.sync, 8..64-token tiles, split-K to fill the SMs");
}

// Weight-only FP8: e4m3 weights (per channel) x f16 activations on the W8A16 kernel, codes -> f16 exactly.
Fit wfp8a16_can_run(const GemmDesc& d, std::string* why) {
  if (!gpu_gemm_common(d, why, 80)) return Fit::no;
  if (d.act != ActivationMode::float16) return refuse(why, "float activations only");
  if (d.x_type != ScalarType::f16) return refuse(why, "needs f16 activations");
  if (d.weight != WeightFormat::e4m3) return refuse(why, std::string("needs e4m3 weights, got ") + name_of(d.weight));
  if (d.group != 0) return refuse(why, "needs per-channel weight scales (e4m3 weights have no groups)");
  if (d.k % 64 != 0) return refuse(why, "needs k a multiple of 64, got k=" + std::to_string(d.k));
  return fits(why, "e4m3 -> f16 exactly in registers, then the W8A16 mma.sync kernel");
}
}  // namespace

#ifdef LOWBIT_WITH_CUDA
namespace {

void add_bias(const GemmArgs& a) {
  if (!a.bias.defined()) return;
  Tensor& y = a.y;
  cuda::add_bias(cuda::Rows{y.data_ptr(), y.dtype(), y.size(0), y.size(1), y.stride(0)},
                 cuda::Rows{const_cast<void*>(a.bias.data_ptr()), a.bias.dtype(), 1, a.bias.size(0), a.bias.size(0)},
                 cuda::current_stream());
}

template <cuda::F16GemmKernel K>
void launch_f16(const GemmArgs& a) {
  cuda::gemm_f16(a.x, a.w.data, a.bias, a.y, cuda::current_stream(), K);
}

// The activations as 8-bit codes and per-token scales: f16 rows are quantized here; codes the fused
// norm made pass through.
std::pair<Tensor, Tensor> codes_of(const GemmArgs& a, bool fp8, cudaStream_t stream) {
  if (a.x.dtype() != ScalarType::f16) return {a.x, a.x_scales};
  Tensor xq = Tensor::empty({a.x.size(0), a.x.size(1)}, fp8 ? ScalarType::e4m3 : ScalarType::s8, a.x.device());
  Tensor xs = Tensor::empty({a.x.size(0)}, ScalarType::f32, a.x.device());
  if (fp8)
    cuda::quantize_per_token_e4m3(a.x, xq, xs, stream);
  else
    cuda::quantize_per_token_s8(a.x, xq, xs, stream);
  return {xq, xs};
}

}  // namespace

// Runs an 8-bit GEMM on `kernel`, quantizing f16 rows per token first when x is not codes yet.
void launch_gemm8(const GemmArgs& a, cuda::Gemm8Kernel kernel, bool fp8) {
  cuda::Gemm8Options o;
  o.kernel = kernel;
  o.sm90_split = a.tuning.sm90_split;
  o.sm90_pairs = a.tuning.sm90_pairs;
  o.fp8_fast_accum = a.tuning.fp8_fast_accum;
  const cudaStream_t stream = cuda::current_stream();
  const auto [xq, xs] = codes_of(a, fp8, stream);
  if (fp8)
    cuda::gemm_fp8(xq, xs, a.w.data, a.w.scales, a.y, stream, o);
  else
    cuda::gemm_w8a8(xq, xs, a.w.data, a.w.scales, a.y, stream, o);
  add_bias(a);
}

// Runs the W4A16 GEMM on `kernel` (the mma.sync ones here, the wgmma one from gemm_sm90_entries.cpp).
void launch_w4a16_kernel(const GemmArgs& a, cuda::W4A16Kernel kernel) {
  cuda::W4A16Options o;
  o.kernel = kernel;
  o.large_tile = a.tuning.w4a16_large_tile;
  o.sm90_split = a.tuning.sm90_split;
  o.pdl = a.tuning.pdl;
  cuda::gemm_w4a16(a.x, a.w, a.y, 0, Tensor(), cuda::current_stream(), o);
  add_bias(a);
}

// Runs the W4A8 GEMM on `kernel`, quantizing f16 rows per token first when x is not codes yet.
void launch_w4a8(const GemmArgs& a, cuda::Gemm8Kernel kernel) {
  const cudaStream_t stream = cuda::current_stream();
  const auto [xq, xs] = codes_of(a, false, stream);
  cuda::W4A8Options o;
  o.kernel = kernel;
  o.pdl = a.tuning.pdl;
  o.sm90_split = a.tuning.sm90_split;
  cuda::gemm_w4a8(xq, xs, a.w, a.y, stream, o);
  add_bias(a);
}

// Runs the FMPQ GEMM on `kernel`: x holds the codes, x_scales their [m, blocks] scales (ops::linear_fmpq).
// The s4 kernel needs the block map; a call without one runs every block on the s8 kernel (same sums).
void launch_fmpq(const GemmArgs& a, cuda::FmpqKernel kernel) {
  if (kernel == cuda::FmpqKernel::sm80_s4 && a.block_bits == nullptr) kernel = cuda::FmpqKernel::sm80;
  cuda::gemm_fmpq(a.x, a.x_scales, a.w, a.y, cuda::current_stream(), 0, kernel,
                  a.block_bits != nullptr ? *a.block_bits : Tensor());
  add_bias(a);
}

namespace {
template <cuda::W4A16Kernel K>
void launch_w4a16(const GemmArgs& a) {
  launch_w4a16_kernel(a, K);
}
void launch_w8a8_sm80(const GemmArgs& a) { launch_gemm8(a, cuda::Gemm8Kernel::sm80, false); }
void launch_w8a16_sm80(const GemmArgs& a) {
  cuda::gemm_w8a16(a.x, a.w, a.y, 0, Tensor(), cuda::current_stream());
  add_bias(a);
}
void launch_wfp8a16_sm80(const GemmArgs& a) {
  cuda::gemm_wfp8a16(a.x, a.w, a.y, 0, Tensor(), cuda::current_stream());
  add_bias(a);
}
void launch_w4a8_sm80(const GemmArgs& a) { launch_w4a8(a, cuda::Gemm8Kernel::sm80); }
void launch_w4a8_gemv_sm80(const GemmArgs& a) { launch_w4a8(a, cuda::Gemm8Kernel::gemv); }
void launch_fp8_sm89(const GemmArgs& a) { launch_gemm8(a, cuda::Gemm8Kernel::sm80, true); }
void launch_fmpq_sm80(const GemmArgs& a) { launch_fmpq(a, cuda::FmpqKernel::sm80); }
void launch_fmpq_s4_sm80(const GemmArgs& a) { launch_fmpq(a, cuda::FmpqKernel::sm80_s4); }
void launch_fmpq_gemv_sm80(const GemmArgs& a) { launch_fmpq(a, cuda::FmpqKernel::gemv); }
}  // namespace
#define LOWBIT_GPU_LAUNCH(f) f
#else
#define LOWBIT_GPU_LAUNCH(f) nullptr
#endif

namespace {
Fit w8a8_sm80_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = gemm8_can_run(d, why, 80, false);
  if (f == Fit::yes && why) *why = "s8 mma.sync, int32 accumulators, per-token x per-channel scales";
  return f;
}
Fit fp8_sm89_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = gemm8_can_run(d, why, 89, true);
  if (f == Fit::yes && why) *why = "e4m3 mma.sync, f32 accumulators";
  return f;
}
int rank_one(const GemmDesc&) { return 1; }

}  // namespace

// W4A8 over two-level weights (both kernels read pack_sm80_w4a8's layout).
Fit w4a8_can_run(const GemmDesc& d, std::string* why, int min_sm) {
  if (!gpu_gemm_common(d, why, min_sm)) return Fit::no;
  if (d.act != ActivationMode::int8_per_token) return refuse(why, "int8_per_token activations only");
  if (d.weight != WeightFormat::qoq && d.weight != WeightFormat::liquid)
    return refuse(why, std::string("needs qoq or liquid weights, got ") + name_of(d.weight));
  if (d.x_type != ScalarType::f16 && d.x_type != ScalarType::s8) return refuse(why, "needs f16 rows or s8 codes");
  if (d.group % 64 != 0)
    return refuse(why, "group " + std::to_string(d.group) + " has no W4A8 GPU kernel (groups must be multiples of 64)");
  if (d.k % 64 != 0) return refuse(why, "needs k a multiple of 64, got k=" + std::to_string(d.k));
  return fits(why);
}

namespace {
Fit w4a8_sm80_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = w4a8_can_run(d, why, 80);
  if (f == Fit::yes && why) *why = "u4 -> s8 in registers ((q*s + a) ^ 0x80 per byte), s8 mma.sync, int32 accumulators, split-K";
  return f;
}
// The register-direct W4A8 GEMV (gemm_w4a8_gemv_sm80.cu): the 1 and 2-4 token buckets (the op takes 1-16 when
// named; from ~8 tokens the mma.sync kernel's shared x tile wins).
Fit w4a8_gemv_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = w4a8_can_run(d, why, 80);
  if (f != Fit::yes) return f;
  if (d.m != MBucket::m1 && d.m != MBucket::m4)
    return refuse(why, "a GEMV: its plans serve 1-4 tokens (the op takes 1-16 when named)");
  if (why) *why = "weights streamed straight into registers (no shared-memory staging), s8 mma.sync, int32 exact";
  return f;
}
// At 1-4 tokens on sm_90, above gemm_w4a8_sm80 (rank 1): measured 1.27-1.61x that kernel at one token and
// 0.96-1.36x at 2-4 (the wide plan on the larger layers; H200, docs/benchmarks_gpu.md); on other GPUs unmeasured,
// so forced only. gemm_w4a8 (gemm_w4a8_sm80.cu) is the op's copy of this rule.
int w4a8_gemv_rank(const GemmDesc& d) { return (d.m == MBucket::m1 || d.m == MBucket::m4) && d.sm == 90 ? 2 : 0; }
}  // namespace

// COMET W4Ax: FMPQ s8 codes (int4 blocks in [-7, 7]) with per-block scales x qoq/liquid weights (shared
// with the wgmma kernel, gemm_sm90_entries.cpp).
Fit fmpq_can_run(const GemmDesc& d, std::string* why, int min_sm) {
  if (!on_device(DeviceKind::cuda, d.device, why)) return Fit::no;
  if (d.sm < min_sm) return refuse(why, "needs sm_" + std::to_string(min_sm) + " or newer");
  if (d.packed != PackTarget::sm80) return refuse(why, "needs a weight packed for sm80");
  if (d.act != ActivationMode::fmpq_mixed) return refuse(why, "fmpq_mixed activations only");
  if (d.x_type != ScalarType::s8) return refuse(why, "takes s8 codes and block scales from quantize_fmpq");
  if (d.y_type != ScalarType::f16 && d.y_type != ScalarType::f32) return refuse(why, "writes f16 or f32 rows");
  if (d.weight != WeightFormat::qoq && d.weight != WeightFormat::liquid)
    return refuse(why, std::string("needs qoq or liquid weights, got ") + name_of(d.weight) +
                           (d.weight == WeightFormat::w8 ? " (w8 x FMPQ runs on the CPU only)" : ""));
  if (d.group % 64 != 0)
    return refuse(why, "group " + std::to_string(d.group) + " has no GPU kernel (groups must be multiples of 64)");
  if (d.k % 64 != 0) return refuse(why, "needs k a multiple of 64, got k=" + std::to_string(d.k));
  if (d.k > 256 * 128) return refuse(why, "takes at most 256 FMPQ blocks (k <= 32768)");
  return fits(why);
}

namespace {
Fit fmpq_sm80_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = fmpq_can_run(d, why, 80);
  if (f == Fit::yes && why)
    *why = "int4 and int8 blocks both on s8 mma.sync, exact int32 per 128-channel block flushed to f32 with the "
           "block scale, split-K over whole blocks";
  return f;
}

// Ampere/Ada have int4 tensor cores (twice the s8 rate); Hopper's s4 mma.sync is slow (no int4 tensor cores),
// so there this kernel runs only when forced by name.
bool int4_tensor_cores(int sm) { return sm == 80 || sm == 86 || sm == 87 || sm == 89; }
Fit fmpq_s4_sm80_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = fmpq_can_run(d, why, 80);
  if (f == Fit::yes && why)
    *why = int4_tensor_cores(d.sm)
               ? "int4 blocks on s4 mma.sync m16n8k64 (u4 weights as q - 8, the zero point folded in via the block's "
                 "activation sums), int8 blocks on s8 mma.sync, one int32 sum per block"
               : "int4 blocks on s4 mma.sync (slow on " + arch_name(d.device, d.sm) +
                     ": no int4 tensor cores; taken only when forced), int8 blocks on s8 mma.sync";
  return f;
}
// Above gemm_fmpq_sm80 (rank 1) where int4 tensor cores exist; below it elsewhere.
int fmpq_s4_sm80_rank(const GemmDesc& d) { return int4_tensor_cores(d.sm) ? 2 : 0; }
// The W4A8 register-direct GEMV's FMPQ form: 1-4 tokens (the op takes 1-16 when named).
Fit fmpq_gemv_can_run(const GemmDesc& d, std::string* why) {
  const Fit f = fmpq_can_run(d, why, 80);
  if (f != Fit::yes) return f;
  if (d.m != MBucket::m1 && d.m != MBucket::m4)
    return refuse(why, "a GEMV: its plans serve 1-4 tokens (the op takes 1-16 when named)");
  if (why) *why = "weights streamed straight into registers, s8 mma.sync, each 128-channel block's exact int32 sum "
                  "flushed to f32 with its block scale";
  return f;
}
// On sm_90 above gemm_fmpq_sm80 (rank 1) where it pays (gemv_rules.h: one token, and 2-4 tokens but on down-like
// layers; gemm_fmpq applies the same rule); elsewhere forced only (int4 tensor cores make gemm_fmpq_s4_sm80 the choice
// on Ampere/Ada).
int fmpq_gemv_rank(const GemmDesc& d) {
  if (d.sm != 90 || (d.m != MBucket::m1 && d.m != MBucket::m4)) return 0;
  return cuda::detail::fmpq_gemv_pays(d.m == MBucket::m1 ? 1 : 4, d.n, d.k) ? 2 : 0;
}
}  // namespace

void register_gemm_sm80(std::vector<GemmKernel>& out) {
  out.push_back({"gemm_f16_gemv_sm80", "f16 x f16 GEMV: one warp per output column (decode)", gemv_can_run, gemv_rank,
                 LOWBIT_GPU_LAUNCH((launch_f16<cuda::F16GemmKernel::gemv>))});
  out.push_back({"gemm_f16_mma_sm80", "f16 x f16 mma.sync with a cp.async pipeline and split-K", mma_can_run, mma_rank,
                 LOWBIT_GPU_LAUNCH((launch_f16<cuda::F16GemmKernel::mma>))});
  out.push_back({"gemm_f16_wmma_sm80", "f16 x f16 wmma, any alignment (slow path)", wmma_can_run, wmma_rank,
                 LOWBIT_GPU_LAUNCH((launch_f16<cuda::F16GemmKernel::wmma>))});
  out.push_back({"gemm_w4a16_sm80", "W4A16 (u4 groups, f16 activations), small-M tiles with split-K",
                 w4a16_small_can_run, w4a16_small_rank,
                 LOWBIT_GPU_LAUNCH((launch_w4a16<cuda::W4A16Kernel::small>))});
  out.push_back({"gemm_w4a16_large_sm80", "W4A16, large-M tiles (prefill)", w4a16_large_can_run, w4a16_large_rank,
                 LOWBIT_GPU_LAUNCH((launch_w4a16<cuda::W4A16Kernel::large>))});
  out.push_back({"gemm_w4a16_gemv_sm80", "W4A16 GEMV (1 token): u4 weights streamed into registers, mma.sync",
                 w4a16_gemv_can_run, w4a16_gemv_rank, LOWBIT_GPU_LAUNCH((launch_w4a16<cuda::W4A16Kernel::gemv>))});
  out.push_back({"gemm_w8a8_sm80", "W8A8 s8 x s8 mma.sync, per-token activations", w8a8_sm80_can_run, rank_one,
                 LOWBIT_GPU_LAUNCH(launch_w8a8_sm80)});
  out.push_back({"gemm_w8a16_sm80", "W8A16 (s8 per channel or per group of k, f16 activations), mma.sync",
                 w8a16_can_run, rank_one, LOWBIT_GPU_LAUNCH(launch_w8a16_sm80)});
  out.push_back({"gemm_wfp8a16_sm80", "weight-only FP8 (e4m3 per channel, f16 activations) on the W8A16 mma.sync kernel",
                 wfp8a16_can_run, rank_one, LOWBIT_GPU_LAUNCH(launch_wfp8a16_sm80)});
  out.push_back({"gemm_w4a8_sm80", "W4A8 QoQ / LiquidQuant u4 weights x s8 per-token activations, mma.sync",
                 w4a8_sm80_can_run, rank_one, LOWBIT_GPU_LAUNCH(launch_w4a8_sm80)});
  out.push_back({"gemm_w4a8_gemv_sm80", "W4A8 GEMV (1-4 tokens): QoQ / LiquidQuant u4 weights streamed into registers, "
                 "s8 mma.sync", w4a8_gemv_can_run, w4a8_gemv_rank, LOWBIT_GPU_LAUNCH(launch_w4a8_gemv_sm80)});
  out.push_back({"gemm_fmpq_sm80", "COMET W4Ax: FMPQ int4/int8 block activations x qoq/liquid u4 weights, mma.sync",
                 fmpq_sm80_can_run, rank_one, LOWBIT_GPU_LAUNCH(launch_fmpq_sm80)});
  out.push_back({"gemm_fmpq_s4_sm80", "COMET W4Ax with int4 tensor cores: int4 blocks on s4 mma.sync, int8 blocks on "
                 "s8, one accumulator (sm_80/86/89 default; sm_90 only when forced)", fmpq_s4_sm80_can_run,
                 fmpq_s4_sm80_rank, LOWBIT_GPU_LAUNCH(launch_fmpq_s4_sm80)});
  out.push_back({"gemm_fmpq_gemv_sm80", "COMET W4Ax GEMV (1-4 tokens): FMPQ block activations x qoq/liquid u4 weights "
                 "streamed into registers, s8 mma.sync", fmpq_gemv_can_run, fmpq_gemv_rank,
                 LOWBIT_GPU_LAUNCH(launch_fmpq_gemv_sm80)});
  out.push_back({"gemm_fp8_sm89", "FP8 e4m3 x e4m3 mma.sync (sm_89+), per-token activations", fp8_sm89_can_run,
                 rank_one, LOWBIT_GPU_LAUNCH(launch_fp8_sm89)});
}

}  // namespace lowbit::kernels
