// Weight-only FP8 GEMM for the sm80 family (recipe wfp8a16): e4m3 weights with f32 per-channel scales x f16
// activations. The e4m3 codes become their exact f16 values in registers and run on the W8A16 kernel
// (gemm_w8_f16act_sm80.cuh), so no fp8 tensor cores are needed: sm_80 and newer.
#include "kernels/sm80/gemm_w8_f16act_sm80.cuh"

namespace lowbit::cuda {

void gemm_wfp8a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                  cudaStream_t stream) {
  w8f16::gemm_w8_f16act<w8f16::E4m3Codes>(x, w, y, split_k, workspace, stream);
}

}  // namespace lowbit::cuda
