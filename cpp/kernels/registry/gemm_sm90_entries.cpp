// The wgmma/TMA GEMM kernels (cpp/kernels/sm90/gemm_w8a8_sm90.cu, built for sm_90a only) in the
// GEMM registry: preferred over their mma.sync twins on sm_90.
#include "kernels/registry/registration.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/kernels.h"
#endif

namespace lowbit::kernels {

Fit gemm8_can_run(const GemmDesc& d, std::string* why, int min_sm, bool fp8);  // gemm_sm80_entries.cpp
#ifdef LOWBIT_WITH_CUDA
void launch_gemm8(const GemmArgs& a, cuda::Gemm8Kernel kernel, bool fp8);  // gemm_sm80_entries.cpp
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

#ifdef LOWBIT_WITH_CUDA
void launch_w8a8(const GemmArgs& a) { launch_gemm8(a, cuda::Gemm8Kernel::sm90, false); }
void launch_fp8(const GemmArgs& a) { launch_gemm8(a, cuda::Gemm8Kernel::sm90, true); }
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
}

}  // namespace lowbit::kernels
