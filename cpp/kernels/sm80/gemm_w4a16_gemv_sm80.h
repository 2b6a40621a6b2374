// The register-direct W4A16 GEMV (gemm_w4a16_gemv_sm80.cu, sm_80 and newer): 1-8 tokens, weights streamed into
// registers without shared-memory staging. Called by cuda::gemm_w4a16 (gemm_w4a16_sm80.cu), which checks the
// arguments.
#pragma once
#include <cuda_runtime.h>

#include "kernels/sm90/gemm_w4a16_sm90.h"  // W4A16Problem

namespace lowbit::cuda::detail {

constexpr int kGemvMaxTokens = 8;
// The kernel takes k up to this (the group row of a chunk is found in f32).
constexpr int kGemvMaxK = 32768;
// The op's and the registry's automatic choice on sm_90 at one token: every layer (k <= kGemvMaxK), at the automatic
// configuration (r4b4, or r6b3 where r4b4's x would need a k split): measured 1.09-1.14x decode90 on gate_up and
// 1.12-1.49x the small kernel on the other Llama-3-8B and 70B/TP2 layers (H200, docs/benchmarks_gpu.md, round 4).

// Compiled configurations, named "rDbB" in 'gemv:T:rDbB' (bindings): D = chunks in flight per warp (the register ring;
// with two groups per chunk 8 becomes 6, 12 becomes 10), B = CTAs per SM the registers are budgeted for
// (__launch_bounds__ min blocks: 1 -> 255 registers per thread, 2 -> 128, 3 -> 80, 4 -> 64, 5 -> 48, 6 -> 40); x's
// shared-memory budget per CTA follows B. They cross warps per SM with bytes in flight per SM (docs/gpu_notes.md, "gemv
// occupancy"; resident, as ptxas allocated them): r8b2 16 warps / 64 KB (the first version), r4b2 24 / 48 KB (its
// ~72 registers leave room for a third CTA), r12b1 8 / 48 KB, r6b3 24 / 72 KB, r4b4 32 / 64 KB, r3b5 40 / 60 KB,
// r2b6 48 / 48 KB. Warps per SM set the pace first (round 4): the plan takes r4b4, or r6b3 where r4b4's x budget
// would split k over CTAs; the others stay, forced only, for the record (cheap to build: ~5 s of ptxas per arch).
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
// take the automatic configuration (r4b4, or r6b3 where r4b4 would split k), else name one of kGemvConfigs.
GemvPlan gemm_w4a16_gemv_plan(int m, int n, int k, int tiles, int ring = 0, int blocks = 0);
// y = x · Wᵀ; when plan.split > 1, `partial` holds split * m * n f32 that the caller sums (sum_split_partials).
// `pdl`: launched as a programmatic dependent of the kernel before it on the stream.
void gemm_w4a16_gemv(const W4A16Problem& p, float* partial, const GemvPlan& plan, bool pdl, cudaStream_t stream);

}  // namespace lowbit::cuda::detail
