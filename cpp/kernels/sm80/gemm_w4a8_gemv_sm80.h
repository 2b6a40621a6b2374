// The register-direct W4A8 GEMV (gemm_w4a8_gemv_sm80.cu, sm_80 and newer): 1-16 tokens, the qoq / liquid weights
// (pack_sm80_w4a8's layout) streamed into registers without shared-memory staging. Called by cuda::gemm_w4a8
// (gemm_w4a8_sm80.cu), which checks the arguments.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm80/gemv_rules.h"  // gemv8_wide_pays, fmpq_gemv_pays
#include "kernels/sm90/gemm_fmpq_sm90.h"  // FmpqProblem
#include "kernels/sm90/gemm_w4a8_sm90.h"  // W4A8Problem

namespace lowbit::cuda::detail {

constexpr int kGemv8MaxTokens = 16;

// Compiled configurations, named "rDbB" in 'gemv:rDbB' (bindings), as the W4A16 GEMV's (gemm_w4a16_gemv_sm80.h):
// D = chunks in flight per warp (the register ring), B = CTAs per SM the registers are budgeted for
// (__launch_bounds__ min blocks) and x's shared-memory budget per CTA follows. The automatic one is r4b4 (32 warps
// per SM, the W4A16 GEMV's measured best), or r6b3 where r4b4's x budget would split k over CTAs.
struct Gemv8Config {
  int depth, blocks;
};
constexpr Gemv8Config kGemv8Configs[] = {{4, 4}, {6, 3}, {8, 2}, {6, 4}, {3, 5}};
constexpr int kGemv8ConfigCount = static_cast<int>(sizeof(kGemv8Configs) / sizeof(kGemv8Configs[0]));

struct Gemv8Plan {
  int split;             // CTAs along k (> 1 only when x for the whole k would not fit in shared memory)
  int chunks_per_split;  // 64-k chunks per CTA along k
  int config;            // index into kGemv8Configs
  int tiles = 1;         // 16-row weight tiles per CTA (4 in the wide plan: one copy of x for 64 weight rows)
};

// The launch shape for this problem; `ring`, `blocks` = 0 take the automatic configuration, else name one of
// kGemv8Configs.
// `wide` (kernel name 'gemvw'): 4 tiles per CTA and k split over CTAs until the grid has ~3 CTAs per SM (sms).
// `fmpq`: FMPQ activations (their block scales share x's budget; each CTA's k range is whole 128-channel blocks).
Gemv8Plan gemm_w4a8_gemv_plan(int m, int n, int k, int ring = 0, int blocks = 0, bool wide = false, int sms = 132,
                              bool fmpq = false);
// y = x · Wᵀ (scaled f16 or raw int32 as p.raw says); when plan.split > 1, `partial` holds split * m * n int32 that
// the kernel's own sum adds (exact in any order) before the scales. `pdl`: launched as a programmatic dependent of
// the kernel before it on the stream.
void gemm_w4a8_gemv(const W4A8Problem& p, int32_t* partial, const Gemv8Plan& plan, bool pdl, cudaStream_t stream);
// The same GEMV over FMPQ activations (COMET W4Ax; gemm_fmpq's "gemv"): y = channel scale x sum over blocks of the
// block's exact int32 sum x its token's block scale, f16 or f32 out (p.f32_out); when plan.split > 1, `partial` holds
// split * m * n f32 that a second kernel sums in split order.
void gemm_fmpq_gemv(const FmpqProblem& p, float* partial, const Gemv8Plan& plan, bool pdl, cudaStream_t stream);

}  // namespace lowbit::cuda::detail
