// Op entry points: check arguments (naming op, argument, expected vs actual), pick a kernel for the
// tensors' device and formats, run it. Outputs are caller-allocated. Activations are [tokens, features].
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "lowbit/core/rope_config.h"
#include "lowbit/core/sampling_params.h"
#include "lowbit/core/tensor.h"
#include "lowbit/kernels/plan.h"
#include "lowbit/kv/attention_meta.h"
#include "lowbit/kv/kv_cache.h"
#include "lowbit/quant/activation.h"
#include "lowbit/quant/pack.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::ops {

// ---- linear layers (ops/linear.cpp) -----------------------------------------------------------
// y[m, n] = x[m, k] · Wᵀ (+ bias[n]). x and y are f32/f16/bf16 (same dtype). A8 paths quantize x per
// token to int8 internally and accumulate in int32 exactly as the GPU does.
// act=fp8_per_token (e4m3 weights only): x quantized per token to e4m3 (s = max|x| / 448), and
// y = s_x * s_w * sum(q_x * q_w) with the products exact and the sums in f32, as the GPU does.
// On CUDA (weights packed for sm80): x, y, bias f16; f16 weights (data = f16 [n, k]) and w4 weights
// (pack_sm80 layout) take act=float, w8 weights (data = s8 [n, k], scales f32 [n]) take
// act=int8_per_token, e4m3 weights (data = e4m3 [n, k], scales f32 [n]) take act=fp8_per_token
// (compute capability 8.9+); other combinations are NotSupported.
// One activation-mode enum for the whole library: the recipe's (quant/recipe.h).
using LinearActivation = ActivationMode;
// act = fmpq_mixed needs the layer's block precision map, so it is served by linear_fmpq instead.
// `kernel` forces a registered GEMM kernel by name ("" = the registry's choice); one that cannot run
// throws NotSupported with its reason (tests and benchmarks compare kernels this way).
void linear(const Tensor& x, const PackedWeight& w, const Tensor& bias, Tensor& y,
            LinearActivation act = LinearActivation::float16, const std::string& kernel = "");
// y = linear of activations already quantized per token (GPU only): q s8 with a w8 weight or e4m3
// with an e4m3 weight, [m, k], scales f32 [m] (rms_norm_quantize makes them); bias and y f16.
void linear_quantized(const Tensor& q, const Tensor& scales, const PackedWeight& w, const Tensor& bias, Tensor& y);
// The same ops run by a plan (Model resolves one per linear at load): the kernel of x's M bucket,
// no registry lookup. The unplanned forms above look the kernel up per call (kernels/registry.h).
void linear(const Tensor& x, const PackedWeight& w, const Tensor& bias, Tensor& y, const kernels::LinearPlan& plan);
void linear_quantized(const Tensor& q, const Tensor& scales, const PackedWeight& w, const Tensor& bias, Tensor& y,
                      const kernels::LinearPlan& plan);
void linear_fmpq(const FmpqActivation& x, const PackedWeight& w, const Tensor& bias, Tensor& y,
                 const kernels::LinearPlan& plan);
// COMET W4Ax: x quantized by quantize_fmpq (s8 [m, k] with int4 or int8 values per 128-channel block,
// scales f32 [m, ceil(k / 128)]); w a qoq/liquid/w8 weight (s8 per group). Each block's s8 x s8 sum is
// exact in int32; y[m, n] = channel_scale[n] * sum_b scale[m, b] * acc_b[m, n] (+ bias), y f32/f16/bf16.
// On the GPU (gemm_fmpq_sm80; gemm_fmpq_s4_sm80 on sm_80/86/87/89, which reads x.block_bits and without it runs
// the s8 kernel): qoq/liquid weights packed for sm80, y f16 or f32. `kernel` forces a registered kernel by name.
void linear_fmpq(const FmpqActivation& x, const PackedWeight& w, const Tensor& bias, Tensor& y,
                 const std::string& kernel = "");
// quantize_fmpq (activation.h) on x's device: the CPU reference, or on the GPU (x f16/f32, block_bits
// on the host) the same codes and scales bit for bit into out.q / out.scales, which must then be
// allocated on x's device (undefined ones are allocated here).
void quantize_fmpq(const Tensor& x, const Tensor& block_bits, FmpqActivation& out);
// The same of x[:, perm] (GPU only; perm s32 [k] on x's device, undefined = none): the gather runs inside
// the quantizer (COMET's channel permutation that makes int8 blocks contiguous).
void quantize_fmpq(const Tensor& x, const Tensor& block_bits, const Tensor& perm, FmpqActivation& out);

// ---- elementwise / normalisation (ops/elementwise.cpp) -----------------------------------------
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
// residual += x; out = rms_norm(residual) * weight   (the fused pre-norm of the next block)
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out);
// The pre-norm of a W8A8 / FP8 linear with the activation quantizer fused (GPU only): residual += x
// when x is defined, then q (s8 or e4m3 [T, H]) and scales (f32 [T]) are the per-token codes of
// rms_norm(residual) * weight as linear(act=int8/fp8_per_token) would make them from the f16 normed
// rows; residual, x and weight as for add_rms_norm, f16 rows.
void rms_norm_quantize(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& q,
                       Tensor& scales);
// out[t, i] = silu(gu[t, i]) * gu[t, I + i]  for gu = [gate | up] of shape [T, 2I]
void silu_mul(const Tensor& gate_up, Tensor& out);
// silu_mul with the next linear's per-token quantizer fused (GPU only): q (s8 or e4m3 [T, I]) and scales (f32 [T])
// are the codes linear(act=int8/fp8_per_token) would make of silu_mul's f16 output; gate_up f16 [T, 2I]. pdl: may
// launch as a programmatic dependent of the kernel before it (sm_90+).
void silu_mul_quantize(const Tensor& gate_up, Tensor& q, Tensor& scales, bool pdl = true);
// The COMET FMPQ forms (GPU only): out.q (s8 [T, k]) and out.scales (f32 [T, ceil(k / 128)]; undefined ones are
// allocated) are the bytes quantize_fmpq(y, block_bits, perm) makes of the f16 rows y the unfused op would write, the
// rows themselves not written. rms_norm_quantize_fmpq: residual += x when x is defined (as add_rms_norm), y =
// rms_norm(residual) * weight; silu_mul_quantize_fmpq: y = silu_mul(gate_up). perm: s32 [k] on the device or
// undefined (none). Rows the fused kernels do not take run the two ops they replace (the same bytes).
void rms_norm_quantize_fmpq(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                            const Tensor& block_bits, const Tensor& perm, FmpqActivation& out);
void silu_mul_quantize_fmpq(const Tensor& gate_up, const Tensor& block_bits, const Tensor& perm,
                            FmpqActivation& out);
void embedding(const Tensor& ids /*s32 [T]*/, const Tensor& table /*[V, H]*/, Tensor& out /*[T, H]*/);
// out[t, j] = x[t, perm[j]]: the input permutation of an act-order linear (GPTQ desc_act, FMPQ reorder).
// x and out: the same float dtype, [T, k] rows (x may be strided, out may not alias x); perm: s32 [k] on
// their device. On the CPU perm is checked; on a GPU it was checked when the model took it (an entry
// outside [0, k) gives NaN there, since reading device memory back would synchronize).
void gather_columns(const Tensor& x, const Tensor& perm, Tensor& out);
void softmax(const Tensor& x, Tensor& out);  // over the last dim, f32

using RopeConfig = lowbit::RopeConfig;  // lowbit/core/rope_config.h
// Rotates q [T, Hq, D] and k [T, Hkv, D] in place at positions (s32 [T]). f32/f16/bf16; rows may be
// strided views (last dim contiguous); either q or k may be undefined. Angles are computed in f64.
void rope(Tensor& q, Tensor& k, const Tensor& positions, const RopeConfig& cfg);

// ---- paged attention (ops/attention.cpp) -------------------------------------------------------
// One forward step's sequences (query rows, KV lengths, block tables, slots).
using AttentionMeta = lowbit::AttentionMeta;  // lowbit/kv/attention_meta.h
// Device placement: every tensor operand of an op (and the KV cache) must be on one device; CPU
// operands run the CPU kernels, CUDA operands the GPU kernels on the default stream (asynchronous:
// results are ready after the next synchronizing copy). On the GPU the host cannot read
// device-resident indices without a sync, so the block-table entries and slot numbers are not
// range-checked there (a slot past the cache is skipped); the host vectors of AttentionMeta are.
// Writes the new tokens' K/V (quantizing for integer KV types) into their slots; a negative slot
// skips its token (padding). k/v: f32/f16/bf16, rows may be strided views.
void kv_write(KVCache& cache, int layer, const Tensor& k /*[T, Hkv, D]*/, const Tensor& v, const AttentionMeta& meta);
// Per-channel K on a GPU: before a step writes tokens at `slot_mapping` (host s32 [T]), gives every block
// the step writes a window slot, takes back those of blocks the previous step sealed, and uploads the
// changed part of the block -> slot map (current stream). live(block): whether a sequence still holds
// the block (default: every block; the engine passes its allocator's view). A no-op for other caches.
// Call it once per step for all layers, before the step's kv_write / attention (and outside graph capture).
void prepare_k_window(KVCache& cache, const Tensor& slot_mapping,
                      const std::function<bool(int32_t)>& live = [](int32_t) { return true; });
// rope(q, k, positions, rope) then kv_write(cache, layer, k, v, meta) as one op (one kernel on the
// GPU: a launch less per layer), with the same results bit for bit: q and k rotated in place (q may
// be undefined), the rotated k and v in the cache. Checks both ops' arguments before any write.
void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const RopeConfig& rope,
                   KVCache& cache, int layer, const AttentionMeta& meta);
// out[T, Hq, D] = softmax(q kᵀ * scale, causal) v over the paged cache; GQA when Hq > Hkv (query
// head h reads KV head h / (Hq / Hkv)). q and out: f32/f16/bf16 (may differ), strided rows allowed;
// rows of out outside every sequence are left untouched. f32 accumulation.
// `kernel` forces a registered attention kernel by name ("" = the registry's choice); one that cannot
// run throws NotSupported with its reason. `tuning`: the kernels' knobs (kernel options, as a plan holds them).
void paged_attention(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                     Tensor& out, const std::string& kernel = "", const kernels::KernelTuning& tuning = {});
// The attention descriptor of a call (decode: every sequence one query, rows in sequence order).
kernels::AttnDesc describe_attention(const Tensor& q, const Tensor& out, const KVCache& cache, bool decode);
// The same with the plan's kernels: plan.decode for decode steps (every sequence one query, rows in
// sequence order), plan.prefill otherwise. The unplanned form looks them up per call.
void paged_attention(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                     Tensor& out, const kernels::AttentionPlan& plan);

// ---- sampling (ops/sampling.cpp) ---------------------------------------------------------------
using SamplingParams = lowbit::SamplingParams;  // lowbit/core/sampling_params.h
// Applies penalties to one row of f32 logits in place, given the tokens generated/seen so far.
void apply_penalties(float* logits, int64_t vocab, const std::vector<int32_t>& history, const SamplingParams& p);
// Picks a token from one row of f32 logits; `uniform` is a U[0,1) draw (ignored when greedy).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, double uniform);
// log-softmax of the row at `token` and the top-n (token, logprob) pairs.
float token_logprob(const float* logits, int64_t vocab, int32_t token);
std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int64_t vocab, int n);

}  // namespace lowbit::ops
