// The register-direct W4A16 GEMV (gemm_w4a16_gemv_sm80.cu, sm_80 and newer): 1-8 tokens, weights streamed into
// registers without shared-memory staging. Called by cuda::gemm_w4a16 (gemm_w4a16_sm80.cu), which checks the
// arguments.
#pragma once
#include <cuda_runtime.h>

#include "kernels/sm90/gemm_w4a16_sm90.h"  // W4A16Problem

namespace lowbit::cuda::detail {

constexpr int kGemvMaxTokens = 8;
// The op's and the registry's automatic choice on sm_90 at one token: layers of at most this many weights and fewer
// than 16384 rows (decode90's; Llama-3-8B qkv 6144 x 4096 and o), where it was measured 1.07-1.20x the small kernel (H200, docs/benchmarks_gpu.md, round 3);
// on larger layers its streaming rate (~1.5-1.65 TB/s) is below the small and decode90 kernels'.
constexpr int64_t kGemvAutoMaxWeights = 6144LL * 4096;

struct GemvPlan {
  int tiles;             // 16-row tiles per CTA (1, 2, 4, 8); its 8 warps split k 8 / tiles ways
  int split;             // CTAs along k (> 1 only when x for the whole k would not fit in shared memory)
  int chunks_per_split;  // 64-k chunks per CTA along k
};

// The launch shape for this problem; `tiles` = 0 picks it (on the current device), else pins it.
GemvPlan gemm_w4a16_gemv_plan(int m, int n, int k, int tiles);
// y = x · Wᵀ; when plan.split > 1, `partial` holds split * m * n f32 that the caller sums (sum_split_partials).
// `pdl`: launched as a programmatic dependent of the kernel before it on the stream.
void gemm_w4a16_gemv(const W4A16Problem& p, float* partial, const GemvPlan& plan, bool pdl, cudaStream_t stream);

}  // namespace lowbit::cuda::detail
