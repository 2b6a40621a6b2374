// Kernel options of a model, fixed at load: user overrides (forced kernels, tuning knobs) and the
// strict switch. The one place that turns user strings into kernel choices; nothing here is read
// per step, and no kernel reads the environment.
#pragma once
#include <map>
#include <string>

namespace lowbit::kernels {

// What a user passes (Python: lowbit.LLM(..., kernel_overrides={...}, strict=True)).
// Keys (docs/architecture.md lists them with their values):
//   forced kernels  "linear", "linear.qkv", "linear.o", "linear.gate_up", "linear.down",
//                   "linear.lm_head", "attention", "attention.prefill", "attention.decode"
//                   -> a registered kernel name; one that cannot run is an error, never ignored.
//                   A linear key may name one token bucket: "linear@m2-4", "linear.qkv@m5-16" (buckets m1, m2-4,
//                   m5-16, m17-127, m128+; desc.h); a bucket's key wins over its role's.
//   tuning          "fused_norm_quant" on|off, "fused_silu_quant" on|off, "pdl" on|off,
//                   "w4a16_large_tile" auto|64x128|128x128|128x256, "sm90_split" 0|1|2|4|8, "sm90_pairs" on|off,
//                   "fp8_fast_accum" on|off, "split_mixed_attention" on|off, "prefill_key_split" auto|off|2..16,
//                   "prefill_pack_heads" auto|on|off, "prefill_ref_dequant" on|off,
//                   "prefill_dequant_copy" auto|on|off, "prefill_side_stream" auto|on|off
// strict: a plan that would take a slow fallback kernel (a faster one cannot run) is an error.
struct KernelOptions {
  std::map<std::string, std::string> overrides;
  bool strict = false;
};

// The most key splits prefill_key_split accepts (the sm_90 prefill merge's own bound, checked there).
constexpr int kMaxPrefillKeySplits = 16;

// Knobs inside a kernel (not which kernel runs): parsed once from the overrides, passed by value
// into the launches, so a captured CUDA graph holds exactly what the plan says.
struct KernelTuning {
  bool fused_norm_quant = true;  // W8A8 / FP8 on the GPU: the pre-norm emits the next GEMM's codes
  bool fused_silu_quant = true;  // W8A8 / W4A8 / FP8 on the GPU: SiLU·mul emits the down GEMM's codes
  bool pdl = true;               // sm_90+: programmatic dependent launch of the W4A16 kernel
  int w4a16_large_tile = 0;      // 0 automatic, else 64128, 128128 or 128256 (m x n)
  int sm90_split = 0;            // wgmma GEMMs: 0 automatic, else the split-K cluster size 1/2/4/8
  bool sm90_pairs = false;       // wgmma 8-bit GEMMs: multicast weight tiles to pairs of A tiles
  bool fp8_fast_accum = false;   // wgmma fp8: no per-stage promotion of the sums to f32
  bool split_mixed_attention = true;  // a mixed step's decode rows on the decode attention kernel
  // sm_90 prefill attention (prefill_attention_sm90.cu): key splits per query tile, 0 = the launch's plan
  // (prefill_split_plan.h), 1 = none, N = N forced; query heads of a kv head sharing a CTA, 0 = its rule, 1 = never,
  // 2 = wherever the cache allows.
  int prefill_key_split = 0;
  int prefill_pack_heads = 0;
  // sm_90 prefill attention, tests and measurements only: u4 / u2 dequantized the previous way (shift and mask per
  // code; K and V both u4 or both u2), for the A/B against the placed-field dequantization.
  bool prefill_ref_dequant = false;
  // sm_90 prefill attention over a per-token integer cache: 0 = its rule (dequantize the sequences' keys once into
  // an f16 copy where the fused launch would dequantize each prefix tile 4 or more times), 1 = never, 2 = wherever
  // the cache allows.
  int prefill_dequant_copy = 0;
  // The per-channel K copy's launches (above): 0 = its rule (the per-channel split on a second stream beside the
  // copy and the f16 split), 1 = off (one stream, A/Bs), 2 = on.
  int prefill_side_stream = 0;
};

// The forced kernel names by role and the tuning, validated (unknown keys and bad values throw a
// ValueError listing what is accepted).
struct ParsedKernelOptions {
  std::map<std::string, std::string> forced;  // role ("linear.qkv", "attention.decode", ...) -> kernel
  KernelTuning tuning;
  bool strict = false;
  // The forced kernel for a role ("linear.qkv" falls back to "linear"), or "" when none; with a bucket name,
  // "linear.qkv@m2-4" and "linear@m2-4" come first.
  std::string forced_for(const std::string& role, const std::string& bucket = "") const;
};
ParsedKernelOptions parse_kernel_options(const KernelOptions& options);

}  // namespace lowbit::kernels
