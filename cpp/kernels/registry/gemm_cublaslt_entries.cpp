// cuBLASLt in the GEMM registry (cpp/kernels/cublaslt/): the f16 GEMM at every token count, which is the w16a16
// linears and every recipe's f16 lm_head. Measured on an H200 (bench/results/h200-2026-11-28-f16-gemm-cublaslt.json)
// it beat lowbit's f16 kernels at every shape and token count timed: 1.2-1.8x the GEMV at one token, 1.1-1.4x the
// split-K mma.sync kernel at 16, 2.5-3.5x it at 256-1024 (cuBLAS's wgmma kernels against mma.sync).
// Whether the build has cuBLASLt is part of the descriptor (GemmDesc::cublaslt), so the choice reads as data and
// docs/support.md does not depend on the build that writes it.
#include "kernels/registry/registration.h"
#ifdef LOWBIT_WITH_CUBLASLT
#include "kernels/cublaslt/gemm_f16_cublaslt.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::kernels {

bool gpu_gemm_common(const GemmDesc& d, std::string* why, int min_sm);  // gemm_sm80_entries.cpp

namespace {

Fit cublaslt_can_run(const GemmDesc& d, std::string* why) {
  if (!gpu_gemm_common(d, why, 80)) return Fit::no;
  if (d.act != ActivationMode::float16 || d.x_type != ScalarType::f16) return refuse(why, "needs f16 activations");
  if (d.weight != WeightFormat::f16) return refuse(why, std::string("needs f16 weights, got ") + name_of(d.weight));
  if (!d.cublaslt)
    return refuse(why, "this lowbit build has no cuBLASLt (build with the nvidia-cublas wheel installed, or set "
                       "LOWBIT_CUBLAS_ROOT: docs/build.md)");
  if (d.k < 1) return refuse(why, "k = 0");
  return fits(why, "cuBLASLt's heuristic algorithm: f16 in, f32 accumulation, the bias in its epilogue");
}
// Above the GEMV (rank 3 at one token) and the mma.sync kernel (2).
int cublaslt_rank(const GemmDesc&) { return 4; }

#ifdef LOWBIT_WITH_CUBLASLT
void launch_cublaslt(const GemmArgs& a) {
  cuda::gemm_f16_cublaslt(a.x, a.w.data, a.bias, a.y, cuda::current_stream());
}
#define LOWBIT_CUBLASLT_LAUNCH launch_cublaslt
#else
#define LOWBIT_CUBLASLT_LAUNCH nullptr
#endif

}  // namespace

void register_gemm_cublaslt(std::vector<GemmKernel>& out) {
  out.push_back({"gemm_f16_cublaslt", "f16 x f16 on cuBLASLt (wgmma on Hopper), f32 accumulation, any token count",
                 cublaslt_can_run, cublaslt_rank, LOWBIT_CUBLASLT_LAUNCH});
}

}  // namespace lowbit::kernels
