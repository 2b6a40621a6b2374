// The Hopper W4A16 decode GEMM (gemm_w4a16_decode_sm90.cu, built for sm_90a only): 1-16 tokens, TMA-fed, split-K
// in clusters. Called by cuda::gemm_w4a16 (cpp/kernels/sm80/gemm_w4a16_sm80.cu), which checks the arguments.
#pragma once
#include <cuda_runtime.h>

#include "kernels/sm90/gemm_w4a16_sm90.h"  // W4A16Problem

namespace lowbit::cuda::detail {

// True when `device` is sm_90 and this library holds the sm_90a image of the kernel.
bool gemm_w4a16_decode_sm90_usable(int device);
// The split-K cluster size (1, 2, 4, 8) the kernel takes for this shape on the current device: `split` itself when
// it is not 0 (automatic).
int gemm_w4a16_decode_sm90_split(int m, int n, int k, int split);
// y = x · Wᵀ; `pdl`: launched as a programmatic dependent of the kernel before it on the stream.
void gemm_w4a16_decode_sm90(const W4A16Problem& p, int split, bool pdl, cudaStream_t stream);

}  // namespace lowbit::cuda::detail
