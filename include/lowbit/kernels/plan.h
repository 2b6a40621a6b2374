// Execution plans: the kernels a model's forward pass runs, resolved once at load (Model::finalize)
// from the registries. A plan is a few pointers and flags; running it costs a bucket index, never a
// lookup, a string compare or an allocation, so a captured CUDA graph replays exactly the plan.
#pragma once
#include <array>
#include <string>

#include "lowbit/kernels/registry.h"

namespace lowbit::kernels {

// One linear layer: its kernel per M bucket, the activation mode and the tuning knobs.
struct LinearPlan {
  std::array<const GemmKernel*, kNumMBuckets> by_m{};
  ActivationMode act = ActivationMode::float16;
  KernelTuning tuning;
  bool fused_norm_quant = false;  // GPU W8A8/FP8: the pre-norm (SiLU·mul for down) hands this linear s8/e4m3 codes
  // GPU FMPQ (w4a4): the pre-norm (SiLU·mul for down) hands this linear its FMPQ codes and block scales, its input
  // permutation applied (tuning fused_norm_quant / fused_silu_quant)
  bool fused_fmpq_quant = false;
  const GemmKernel* kernel_for(int64_t m) const { return by_m[size_t(m_bucket_of(m))]; }
};

// Attention, per phase: decode steps (one query per sequence, rows in sequence order) and the rest.
struct AttentionPlan {
  const AttnKernel* prefill = nullptr;
  const AttnKernel* decode = nullptr;
  // Passed into every launch. split_mixed_attention: a mixed step (decode rows first, then prefill chunks) runs its
  // decode rows on `decode` and the rest on `prefill`; off, `prefill` serves every row.
  KernelTuning tuning;
};

// One line of `lowbit info --plan`: where, which descriptor, which kernel, why.
struct PlanLine {
  std::string role;    // "layers.*.qkv m1", "attention decode", ...
  std::string desc;    // the descriptor key
  std::string kernel;  // the chosen kernel's name
  std::string why;     // forced / best ranked fit / slow fallback, with the reasons
  bool fallback = false;
};

}  // namespace lowbit::kernels
