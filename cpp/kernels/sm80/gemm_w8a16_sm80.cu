// W8A16 GEMM for the sm80 family: s8 weights (per channel or per group of k) x f16 activations. The kernel
// is shared with weight-only FP8 (gemm_w8_f16act_sm80.cuh).
#include "kernels/sm80/gemm_w8_f16act_sm80.cuh"

namespace lowbit::cuda {

void gemm_w8a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                cudaStream_t stream) {
  w8f16::gemm_w8_f16act<w8f16::S8Codes>(x, w, y, split_k, workspace, stream);
}

}  // namespace lowbit::cuda
