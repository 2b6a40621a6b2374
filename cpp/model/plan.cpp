// Model planning: at finalize, one LinearPlan per linear role (every layer has the same shapes and
// formats, so the plan of layer 0 is every layer's) and one AttentionPlan, resolved from the
// registries with the model's kernel options. The forward pass only runs them.
#include <algorithm>

#include "lowbit/kernels/registry.h"
#include "lowbit/model/model.h"

namespace lowbit {
namespace {

// A row count inside each bucket, for the descriptors (the kernels' rules depend on the bucket only).
int64_t representative_m(kernels::MBucket b) {
  switch (b) {
    case kernels::MBucket::m1: return 1;
    case kernels::MBucket::m4: return 4;
    case kernels::MBucket::m16: return 16;
    case kernels::MBucket::m127: return 64;
    case kernels::MBucket::m_large: return 256;
  }
  return 1;
}

}  // namespace

void Model::set_kernel_options(const kernels::KernelOptions& options) {
  check_not_finalized("Model.set_kernel_options");
  kernel_options_ = kernels::parse_kernel_options(options);  // validates now: a bad key fails early
}

kernels::LinearPlan Model::plan_linear(const std::string& role, const PackedWeight& w, ActivationMode act,
                                       bool codes_input) {
  const kernels::ParsedKernelOptions& o = kernel_options_;
  kernels::LinearPlan plan;
  plan.act = act;
  plan.tuning = o.tuning;
  plan.fused_norm_quant = codes_input;
  const ScalarType x_type = codes_input ? (act == ActivationMode::fp8_per_token ? ScalarType::e4m3 : ScalarType::s8)
                            : act == ActivationMode::fmpq_mixed ? ScalarType::s8
                                                                : dtype_;
  // Activation rows live in the workspace: [tokens, k] slices of allocations, 16-byte aligned when
  // k elements are a multiple of 16 bytes.
  const bool aligned = bytes_for(x_type, w.k) % 16 == 0;
  const std::string what = "Model: linear." + role;
  for (int b = 0; b < kernels::kNumMBuckets; ++b) {
    const kernels::MBucket bucket = kernels::MBucket(b);
    const kernels::GemmDesc desc =
        kernels::describe_gemm(device_, act, x_type, dtype_, w, representative_m(bucket), aligned);
    const std::string forced = o.forced_for("linear." + role, kernels::name_of(bucket));
    const kernels::GemmSelection s = kernels::select_gemm(desc, forced, o.strict, what.c_str());
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, s.kernel->launch != nullptr, what, ": kernel ", s.kernel->name,
                      " is not built into this library (a build without CUDA?)");
    plan.by_m[size_t(b)] = s.kernel;
    plan_lines_.push_back({"linear." + role + " " + kernels::name_of(bucket), desc.to_string(), s.kernel->name,
                           s.why_chosen(), s.fallback});
  }
  return plan;
}

kernels::AttentionPlan Model::plan_attention() {
  const kernels::ParsedKernelOptions& o = kernel_options_;
  kernels::AttentionPlan plan;
  plan.tuning = o.tuning;
  for (const kernels::AttnPhase phase : {kernels::AttnPhase::prefill, kernels::AttnPhase::decode}) {
    kernels::AttnDesc d;
    d.device = device_.kind;
    d.sm = kernels::compute_capability(device_);
    d.phase = phase;
    d.head_dim = cfg_.head_dim;
    d.q_type = d.out_type = dtype_;
    d.k_type = k_cache_type();
    d.v_type = v_cache_type();
    d.gqa_group = local_.num_heads / std::max(1, local_.num_kv_heads);  // this rank's heads
    d.kv_granularity =
        recipe_.k_per_channel ? kernels::KvGranularity::per_channel_k : kernels::KvGranularity::per_token_head;
    // The engine's block size changes no kernel's answer, except per-channel K's, whose blocks are its groups.
    d.block_size = recipe_.k_per_channel ? recipe_.k_group : 16;
    const std::string role = std::string("attention.") + kernels::name_of(phase);
    const std::string what = "Model: " + role;
    const kernels::AttnSelection s = kernels::select_attention(d, o.forced_for(role), o.strict, what.c_str());
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, s.kernel->launch != nullptr, what, ": kernel ", s.kernel->name,
                      " is not built into this library (a build without CUDA?)");
    (phase == kernels::AttnPhase::decode ? plan.decode : plan.prefill) = s.kernel;
    plan_lines_.push_back({role, d.to_string(), s.kernel->name, s.why_chosen(), s.fallback});
  }
  return plan;
}

void Model::resolve_plans() {
  plan_lines_.clear();
  const ActivationMode act = recipe_.activation;
  const Layer& L = layers_.front();
  // W8A8 / FP8 on the GPU: the pre-norms of qkv and gate_up emit the linear's codes themselves (one
  // kernel instead of a norm and a quantizer, the same bytes) unless an input permutation sits between.
  const bool quant_act = act == ActivationMode::int8_per_token || act == ActivationMode::fp8_per_token;
  const bool fuse = device_.is_cuda() && quant_act && kernel_options_.tuning.fused_norm_quant;
  plans_.qkv = plan_linear("qkv", L.qkv, act, fuse && !L.qkv_in.perm.defined());
  plans_.o = plan_linear("o", L.o, act, false);
  plans_.gate_up = plan_linear("gate_up", L.gate_up, act, fuse && !L.gate_up_in.perm.defined());
  // SiLU·mul likewise emits the down linear's codes (one kernel instead of two).
  const bool fuse_act = device_.is_cuda() && quant_act && kernel_options_.tuning.fused_silu_quant;
  plans_.down = plan_linear("down", L.down, act, fuse_act && !L.down_in.perm.defined());
  // FMPQ on the GPU: the same two fusions write the block codes and scales (the input permutation read in place), on
  // f16 rows the fused norm holds in registers (hidden <= 8192); the o linear's input comes from attention. A down
  // linear with an input permutation (`lowbit quantize` folds down's into gate/up and writes none) stays unfused:
  // gathering gate and up element by element made the fused SiLU·mul 2.5x slower than without (H200, 512 tokens).
  if (device_.is_cuda() && act == ActivationMode::fmpq_mixed && dtype_ == ScalarType::f16) {
    const int64_t blocks = (local_.hidden_size + kFmpqBlock - 1) / kFmpqBlock;
    const bool norm_ok = local_.hidden_size <= 8192 && blocks <= 256;  // norm_quantize_fmpq's rows
    plans_.qkv.fused_fmpq_quant = plans_.gate_up.fused_fmpq_quant = norm_ok && kernel_options_.tuning.fused_norm_quant;
    plans_.down.fused_fmpq_quant = kernel_options_.tuning.fused_silu_quant && !L.down_in.perm.defined();
  }
  plans_.lm_head = plan_linear("lm_head", lm_head_, ActivationMode::float16, false);  // float activations always
  plans_.attention = plan_attention();
}

}  // namespace lowbit
