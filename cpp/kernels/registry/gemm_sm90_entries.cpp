// The wgmma/TMA GEMM kernels (cpp/kernels/sm90/, built for sm_90a only) in the GEMM registry:
// preferred over their mma.sync twins on sm_90 (W4A8 and W4A16 from 128 tokens on, W4A16 up to 16 tokens).
#include "kernels/registry/registration.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/kernels.h"
#endif

namespace lowbit::kernels {

// gemm_sm80_entries.cpp: the checks and launches these kernels share with their mma.sync twins.
Fit gemm8_can_run(const GemmDesc& d, std::string* why, int min_sm, bool fp8);
Fit w4a8_can_run(const GemmDesc& d, std::string* why, int min_sm);
Fit w4a16_can_run(const GemmDesc& d, std::string* why);
Fit fmpq_can_run(const GemmDesc& d, std::string* why, int min_sm);
#ifdef LOWBIT_WITH_CUDA
void launch_gemm8(const GemmArgs& a, cuda::Gemm8Kernel kernel, bool fp8);
void launch_w4a8(const GemmArgs& a, cuda::Gemm8Kernel kernel);
void launch_w4a16_kernel(const GemmArgs& a, cuda::W4A16Kernel kernel);
void launch_fmpq(const GemmArgs& a, cuda::FmpqKernel kernel);
#endif

namespace {

Fit sm90_can_run(const GemmDesc& d, std::string* why, bool fp8) {
  if (d.device == DeviceKind::cuda && d.sm != 90 && d.sm != 0)
    return refuse(why, "wgmma/TMA need sm_90 exactly (built as sm_90a), got " + arch_name(d.device, d.sm));
  const Fit f = gemm8_can_run(d, why, 90, fp8);
  if (f == Fit::yes && why)
    *why = fp8 ? "e4m3 wgmma, TMA loads, f32 promotion per 128-k stage" : "s8 wgmma, TMA loads, split-K clusters";
  return f;
}
Fit w8a8_can_run(const GemmDesc& d, std::string* why) { return sm90_can_run(d, why, false); }
Fit fp8_can_run(const GemmDesc& d, std::string* why) { return sm90_can_run(d, why, true); }
int rank_two(const GemmDesc&) { return 2; }

Fit w4a8_sm90_can_run(const GemmDesc& d, std::string* why) {
  if (d.device == DeviceKind::cuda && d.sm != 90 && d.sm != 0)
    return refuse(why, "wgmma/TMA need sm_90 exactly (built as sm_90a), got " + arch_name(d.device, d.sm));
  const Fit f = w4a8_can_run(d, why, 90);
  if (f == Fit::yes && why)
    *why = "u4 -> s8 in registers as the wgmma A operand, s8 activations by TMA, split-K clusters";
  return f;
}
// Above the mma.sync kernel where w4a8_wgmma_preferred says (desc.h): from 17 tokens on (the 32 / 64-token tiles to
// 64 tokens, stream-K over 128-token tiles at 65-127, the 128 / 256-token plans from 128), and at 5-16 tokens on
// layers of 16384 rows or more (its 16-token tile streams each CTA's weights at ~15-20 GB/s, so it wins where many
// unsplit CTAs cover the SMs; measured on an H200 at 5-16 tokens: gate_up 1.2-1.5x the mma.sync kernel, narrower
// layers 0.78-1.14x before its launch became a programmatic dependent). 1-4 tokens run the register-direct GEMV.
int w4a8_sm90_rank(const GemmDesc& d) { return w4a8_wgmma_preferred(d.m, d.n) ? 2 : 0; }

Fit w4a16_sm90_can_run(const GemmDesc& d, std::string* why) {
  if (d.device == DeviceKind::cuda && d.sm != 90 && d.sm != 0)
    return refuse(why, "wgmma/TMA need sm_90 exactly (built as sm_90a), got " + arch_name(d.device, d.sm));
  const Fit f = w4a16_can_run(d, why);
  if (f == Fit::yes && why) *why = "u4 -> f16 in registers as the wgmma A operand, f16 activations by TMA, split-K clusters";
  return f;
}
// Where w4a16_wgmma_preferred says (desc.h): from 17 tokens, above the small and large mma.sync kernels (ranks 2 / 2
// there). Measured on an H200 (8B and 70B/TP2 layers): at 32 / 64 tokens the small tiles are 1.04-1.34x / 1.02-1.69x
// the mma.sync kernel (8B down at 32 tokens 0.83x), at 96 tokens stream-K over 128-token tiles 1.75-2.43x. 1-16 tokens
// keep the GEMV, the decode kernel and the small mma.sync kernel.
int w4a16_sm90_rank(const GemmDesc& d) { return w4a16_wgmma_preferred(d.m) ? 3 : 0; }

Fit w4a16_decode_sm90_can_run(const GemmDesc& d, std::string* why) {
  if (d.device == DeviceKind::cuda && d.sm != 90 && d.sm != 0)
    return refuse(why, "TMA and clusters need sm_90 exactly (built as sm_90a), got " + arch_name(d.device, d.sm));
  const Fit f = w4a16_can_run(d, why);
  if (f == Fit::yes && why)
    *why = "decode: one producer thread feeds the weights, scales and x by TMA, mma.sync consumers, split-K clusters";
  return f;
}
// Up to 16 tokens on layers of 16384 rows or more (gate_up: its unsplit CTAs cover the SMs), above the small
// mma.sync kernel (rank 2 there); it was measured slower than that kernel on narrower layers (H200,
// docs/benchmarks_gpu.md), which keep it.
int w4a16_decode_sm90_rank(const GemmDesc& d) {
  return decode_sized(d.m) && d.n >= 16384 ? 3 : 0;
}

Fit fmpq_sm90_can_run(const GemmDesc& d, std::string* why) {
  if (d.device == DeviceKind::cuda && d.sm != 90 && d.sm != 0)
    return refuse(why, "wgmma/TMA need sm_90 exactly (built as sm_90a), got " + arch_name(d.device, d.sm));
  const Fit f = fmpq_can_run(d, why, 90);
  if (f == Fit::yes && why)
    *why = "int4 and int8 blocks both on s8 wgmma (u4 weights dequantized as the A operand), exact int32 per "
           "128-k stage flushed to f32 with the block scale, TMA, split-K clusters";
  return f;
}
// From 128 tokens on (its 128-token tile); below, the mma.sync kernel.
int fmpq_sm90_rank(const GemmDesc& d) { return d.m == MBucket::m_large ? 2 : 0; }

#ifdef LOWBIT_WITH_CUDA
void launch_fmpq_sm90(const GemmArgs& a) { launch_fmpq(a, cuda::FmpqKernel::sm90); }
void launch_w8a8(const GemmArgs& a) { launch_gemm8(a, cuda::Gemm8Kernel::sm90, false); }
void launch_fp8(const GemmArgs& a) { launch_gemm8(a, cuda::Gemm8Kernel::sm90, true); }
void launch_w4a8_sm90(const GemmArgs& a) { launch_w4a8(a, cuda::Gemm8Kernel::sm90); }
void launch_w4a16_sm90(const GemmArgs& a) { launch_w4a16_kernel(a, cuda::W4A16Kernel::sm90); }
void launch_w4a16_decode_sm90(const GemmArgs& a) { launch_w4a16_kernel(a, cuda::W4A16Kernel::decode_sm90); }
#define LOWBIT_GPU_LAUNCH(f) f
#else
#define LOWBIT_GPU_LAUNCH(f) nullptr
#endif

}  // namespace

void register_gemm_sm90(std::vector<GemmKernel>& out) {
  out.push_back({"gemm_w8a8_sm90", "W8A8 s8 wgmma + TMA (sm_90a), per-token activations", w8a8_can_run, rank_two,
                 LOWBIT_GPU_LAUNCH(launch_w8a8)});
  out.push_back({"gemm_fp8_sm90", "FP8 e4m3 wgmma + TMA (sm_90a), per-token activations", fp8_can_run, rank_two,
                 LOWBIT_GPU_LAUNCH(launch_fp8)});
  out.push_back({"gemm_w4a8_sm90", "W4A8 QoQ / LiquidQuant: register-dequantized u4 weights x s8 activations, wgmma + "
                 "TMA (sm_90a)", w4a8_sm90_can_run, w4a8_sm90_rank, LOWBIT_GPU_LAUNCH(launch_w4a8_sm90)});
  out.push_back({"gemm_fmpq_sm90", "COMET W4Ax: FMPQ int4/int8 block activations x qoq/liquid u4 weights, wgmma + TMA "
                 "(sm_90a)", fmpq_sm90_can_run, fmpq_sm90_rank, LOWBIT_GPU_LAUNCH(launch_fmpq_sm90)});
  out.push_back({"gemm_w4a16_sm90", "W4A16: register-dequantized u4 weights x f16 activations, f16 wgmma + TMA (sm_90a)",
                 w4a16_sm90_can_run, w4a16_sm90_rank, LOWBIT_GPU_LAUNCH(launch_w4a16_sm90)});
  out.push_back({"gemm_w4a16_decode_sm90", "W4A16 decode (1-16 tokens): TMA-fed u4 weights x f16 activations, "
                 "mma.sync, split-K clusters (sm_90a)", w4a16_decode_sm90_can_run, w4a16_decode_sm90_rank,
                 LOWBIT_GPU_LAUNCH(launch_w4a16_decode_sm90)});
}

}  // namespace lowbit::kernels
