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

// Compiled configurations, named "rDbB" in 'gemv:T:rDbB' (bindings): D = chunks in flight per warp (the register ring;
// with two groups per chunk 8 becomes 6, 12 becomes 10), B = CTAs per SM the registers are budgeted for
// (__launch_bounds__ min blocks: 1 -> 255 registers per thread, 2 -> 128, 3 -> 80, 4 -> 64, 5 -> 48, 6 -> 40); x's
// shared-memory budget per CTA follows B. The first is the automatic one (r8b2: 16 warps x 8 x 512 B = 64 KB of
// weights in flight per SM). The others cross warps per SM with bytes in flight per SM (docs/gpu_notes.md, "gemv
// occupancy"): r4b2 16 warps / 32 KB, r12b1 8 / 96 KB, r6b3 24 / 72 KB, r4b4 32 / 64 KB, r3b5 40 / 60 KB, r2b6 48 / 48 KB.
struct GemvConfig {
  int depth, blocks;
};
constexpr GemvConfig kGemvConfigs[] = {{8, 2}, {4, 2}, {12, 1}, {6, 3}, {4, 4}, {3, 5}, {2, 6}};
constexpr int kGemvConfigCount = static_cast<int>(sizeof(kGemvConfigs) / sizeof(kGemvConfigs[0]));

struct GemvPlan {
  int tiles;             // 16-row tiles per CTA (1, 2, 4, 8); its 8 warps split k 8 / tiles ways
  int split;             // CTAs along k (> 1 only when x for the whole k would not fit in shared memory)
  int chunks_per_split;  // 64-k chunks per CTA along k
  int config;            // index into kGemvConfigs
};

// The launch shape for this problem; `tiles` = 0 picks it (on the current device), else pins it; `ring`, `blocks` = 0
// take the automatic configuration, else name one of kGemvConfigs.
GemvPlan gemm_w4a16_gemv_plan(int m, int n, int k, int tiles, int ring = 0, int blocks = 0);
// y = x · Wᵀ; when plan.split > 1, `partial` holds split * m * n f32 that the caller sums (sum_split_partials).
// `pdl`: launched as a programmatic dependent of the kernel before it on the stream.
void gemm_w4a16_gemv(const W4A16Problem& p, float* partial, const GemvPlan& plan, bool pdl, cudaStream_t stream);

}  // namespace lowbit::cuda::detail
