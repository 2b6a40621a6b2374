// The kernel registries (include/lowbit/kernels/registry.h) and the model's plans: every registered
// CPU GEMM against a float64 reference on odd shapes, which kernel a descriptor gets (CPU and GPU
// descriptors: the choice is plain C++, so it is checked here without a GPU), and the loud errors:
// a miss lists every candidate, a forced kernel that cannot run says why, strict refuses fallbacks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>

#include "kernels/sm80/instances/attention_instance_list.h"
#include "lowbit/kernels/registry.h"
#include "lowbit/model/model.h"
#include "lowbit/ops/ops.h"
#include "lowbit/quant/format.h"
#include "test_model_reference.h"

using namespace lowbit;
using namespace lowbit::kernels;
using namespace lowbit::testing_ref;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

GemmDesc gpu_gemm(int sm, ActivationMode act, WeightFormat w, int group, int64_t m) {
  GemmDesc d;
  d.device = DeviceKind::cuda;
  d.sm = sm;
  d.act = act;
  d.x_type = d.y_type = ScalarType::f16;
  d.weight = w;
  d.packed = PackTarget::sm80;
  d.group = group;
  d.n = d.k = 4096;
  d.m = m_bucket_of(m);
  return d;
}

AttnDesc gpu_attention(AttnPhase phase, int head_dim, ScalarType k, ScalarType v, int group) {
  AttnDesc d;
  d.device = DeviceKind::cuda;
  d.sm = 90;
  d.phase = phase;
  d.head_dim = head_dim;
  d.q_type = d.out_type = ScalarType::f16;
  d.k_type = k;
  d.v_type = v;
  d.gqa_group = group;
  return d;
}

}  // namespace

TEST(Registry, EveryKernelHasAUniqueNameASummaryAndAnAnswer) {
  std::set<std::string> names;
  for (const GemmKernel& k : gemm_kernels()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name;
    EXPECT_GT(std::string(k.summary).size(), 10u) << k.name;
  }
  for (const AttnKernel& k : attention_kernels()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name;
    EXPECT_GT(std::string(k.summary).size(), 10u) << k.name;
  }
  for (const char* n : {"gemm_f32act_cpu", "gemm_s8act_cpu", "gemm_f16_gemv_sm80", "gemm_f16_mma_sm80", "gemm_f16_cublaslt",
                        "gemm_w4a16_sm80", "gemm_w4a16_large_sm80", "gemm_w4a16_gemv_sm80", "gemm_w8a8_sm80", "gemm_w8a8_sm90", "gemm_fp8_sm90",
                        "gemm_w4a8_sm80", "gemm_w4a8_gemv_sm80", "gemm_w4a8_sm90", "gemm_w4a16_sm90", "gemm_w4a16_decode_sm90",
                        "paged_attention_cpu", "decode_attention_sm80", "prefill_attention_tc_sm80",
                        "prefill_attention_sm90"})
    EXPECT_TRUE(names.count(n)) << n;
}

// ops::linear on the CPU (the registry's kernel for the call) against float64 on odd shapes and tails.
TEST(Registry, CpuGemmSweepAgainstFloat64) {
  std::mt19937 rng(7);
  struct Case {
    WeightFormat format;
    int group;
    ActivationMode act;
    const char* kernel;
  };
  const Case cases[] = {{WeightFormat::f32, 0, ActivationMode::float16, "gemm_f32act_cpu"},
                        {WeightFormat::f16, 0, ActivationMode::float16, "gemm_f32act_cpu"},
                        {WeightFormat::w8, 0, ActivationMode::float16, "gemm_f32act_cpu"},
                        {WeightFormat::w8, 32, ActivationMode::float16, "gemm_f32act_cpu"},  // GGUF Q8_0
                        {WeightFormat::e4m3, 0, ActivationMode::float16, "gemm_f32act_cpu"},
                        {WeightFormat::w4, 32, ActivationMode::float16, "gemm_f32act_cpu"},
                        {WeightFormat::w8, 0, ActivationMode::int8_per_token, "gemm_s8act_cpu"}};
  for (const Case& c : cases) {
    for (int64_t m : {1, 3, 17, 130}) {
      for (int64_t n : {1, 7, 33}) {
        for (int64_t k : {32, 96}) {
          const Tensor wf = random_tensor({n, k}, rng, -1.f, 1.f);
          const QuantizedWeight qw = quantize_weight(wf, c.format, c.group);
          const PackedWeight pw = pack_weight(qw, PackTarget::cpu, Device::cpu());
          const Tensor wd = dequantize_weight(qw).contiguous();
          const Tensor x = random_tensor({m, k}, rng, -1.f, 1.f);
          Tensor y = Tensor::empty({m, n}, ScalarType::f32);
          const GemmDesc desc = describe_gemm(Device::cpu(), c.act, ScalarType::f32, ScalarType::f32, pw, m, true);
          ASSERT_STREQ(select_gemm(desc).kernel->name, c.kernel) << desc.to_string();
          ops::linear(x, pw, Tensor(), y, c.act);
          const float* xp = x.data<float>();
          const float* wp = wd.data<float>();
          for (int64_t i = 0; i < m; ++i) {
            // int8 activations: the reference quantizes x per token as the kernel does, in double.
            double s = 1.0;
            if (c.act == ActivationMode::int8_per_token) {
              double mx = 0;
              for (int64_t j = 0; j < k; ++j) mx = std::max(mx, std::fabs(double(xp[i * k + j])));
              s = mx > 0 ? float(mx) / 127.f : 1.0;
            }
            for (int64_t o = 0; o < n; ++o) {
              double ref = 0, mag = 0;
              for (int64_t j = 0; j < k; ++j) {
                double xv = xp[i * k + j];
                if (c.act == ActivationMode::int8_per_token) xv = std::nearbyint(xv / s) * s;
                ref += xv * wp[o * k + j];
                mag += std::fabs(xv * wp[o * k + j]);
              }
              EXPECT_NEAR(y.data<float>()[i * n + o], ref, 1e-5 * mag + 1e-6)
                  << c.kernel << " " << name_of(c.format) << " m=" << m << " n=" << n << " k=" << k;
            }
          }
        }
      }
    }
  }
}

// Grouped w8 (GGUF Q8_0 as stored) has float-activation kernels only: the int8 ones read one scale per channel.
TEST(Registry, GroupedW8IsRefusedByTheInt8Kernels) {
  std::mt19937 rng(3);
  const PackedWeight pw =
      pack_weight(quantize_weight(random_tensor({8, 64}, rng, -1.f, 1.f), WeightFormat::w8, 32), PackTarget::cpu,
                  Device::cpu());
  const GemmDesc d = describe_gemm(Device::cpu(), ActivationMode::int8_per_token, ScalarType::f32, ScalarType::f32,
                                   pw, 4, true);
  const GemmSelection s = try_select_gemm(d);
  EXPECT_EQ(s.kernel, nullptr);
  EXPECT_NE(s.reasons().find("per-channel w8"), std::string::npos) << s.reasons();
}

TEST(Registry, GpuGemmChoicesByDescriptor) {
  // W4A16 up to 16 tokens: the TMA-fed decode kernel on sm_90 for layers of 16384 rows or more (but the GEMV below
  // at one token), the small mma.sync kernel for narrower layers and other GPUs; from 17 tokens the wgmma kernel.
  GemmDesc wide = gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 128, 1);
  wide.n = 28672;
  EXPECT_STREQ(select_gemm(wide).kernel->name, "gemm_w4a16_gemv_sm80");
  wide.m = m_bucket_of(2);
  EXPECT_STREQ(select_gemm(wide).kernel->name, "gemm_w4a16_decode_sm90");
  wide.m = m_bucket_of(16);
  EXPECT_STREQ(select_gemm(wide).kernel->name, "gemm_w4a16_decode_sm90");
  wide.m = m_bucket_of(17);
  EXPECT_STREQ(select_gemm(wide).kernel->name, "gemm_w4a16_sm90");
  wide.m = m_bucket_of(1);
  wide.sm = 80;
  EXPECT_STREQ(select_gemm(wide).kernel->name, "gemm_w4a16_sm80");
  // One token on sm_90 on every layer of k <= 32768: the register-direct GEMV; past that k: the small kernel.
  EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 128, 1)).kernel->name,
               "gemm_w4a16_gemv_sm80");
  GemmDesc mid = gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 128, 1);
  mid.n = 8192;
  EXPECT_STREQ(select_gemm(mid).kernel->name, "gemm_w4a16_gemv_sm80");
  mid.k = 32832;
  EXPECT_STREQ(select_gemm(mid).kernel->name, "gemm_w4a16_sm80");
  mid.k = 4096;
  mid.n = 4096;
  mid.m = m_bucket_of(2);
  EXPECT_STREQ(select_gemm(mid).kernel->name, "gemm_w4a16_sm80");
  mid.m = m_bucket_of(1);
  mid.sm = 80;
  EXPECT_STREQ(select_gemm(mid).kernel->name, "gemm_w4a16_sm80");
  // W4A16 from 17 tokens: the wgmma kernel on sm_90 (small tiles to 64, stream-K to 127); from 128 tokens the large
  // mma.sync kernel elsewhere, the small one below.
  EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 128, 127)).kernel->name,
               "gemm_w4a16_sm90");
  EXPECT_STREQ(select_gemm(gpu_gemm(80, ActivationMode::float16, WeightFormat::w4, 128, 127)).kernel->name,
               "gemm_w4a16_sm80");
  EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 128, 300)).kernel->name,
               "gemm_w4a16_sm90");
  EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 64, 128)).kernel->name,
               "gemm_w4a16_sm90");
  EXPECT_STREQ(select_gemm(gpu_gemm(80, ActivationMode::float16, WeightFormat::w4, 128, 300)).kernel->name,
               "gemm_w4a16_large_sm80");
  EXPECT_STREQ(select_gemm(gpu_gemm(89, ActivationMode::float16, WeightFormat::w4, 128, 4096)).kernel->name,
               "gemm_w4a16_large_sm80");
  EXPECT_STREQ(select_gemm(gpu_gemm(80, ActivationMode::int8_per_token, WeightFormat::w8, 0, 8)).kernel->name,
               "gemm_w8a8_sm80");
  EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, WeightFormat::w8, 0, 8)).kernel->name,
               "gemm_w8a8_sm90");
  EXPECT_STREQ(select_gemm(gpu_gemm(89, ActivationMode::fp8_per_token, WeightFormat::e4m3, 0, 8)).kernel->name,
               "gemm_fp8_sm89");
  // Weight-only FP8 (e4m3 x f16) from sm_80, every token count; grouped e4m3 is refused by name.
  for (const int sm : {80, 90})
    for (const int m : {1, 16, 300})
      EXPECT_STREQ(select_gemm(gpu_gemm(sm, ActivationMode::float16, WeightFormat::e4m3, 0, m)).kernel->name,
                   "gemm_wfp8a16_sm80");
  const std::string fp8_g32 =
      error_of([&] { select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::e4m3, 32, 1)); });
  EXPECT_NE(fp8_g32.find("gemm_wfp8a16_sm80: needs per-channel weight scales"), std::string::npos) << fp8_g32;
  // W4A8: on sm_90 the register-direct GEMV at 1-4 tokens, the wgmma kernel from 17 tokens and at 5-16 tokens on
  // layers of 16384 rows or more; the mma.sync kernel at 5-16 tokens on narrower layers and on sm_80/89.
  for (const WeightFormat f : {WeightFormat::qoq, WeightFormat::liquid}) {
    EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, f, 128, 1)).kernel->name,
                 "gemm_w4a8_gemv_sm80");
    EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, f, 64, 1)).kernel->name,
                 "gemm_w4a8_gemv_sm80");
    EXPECT_STREQ(select_gemm(gpu_gemm(80, ActivationMode::int8_per_token, f, 128, 1)).kernel->name, "gemm_w4a8_sm80");
    for (const int m : {2, 4})
      EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, f, 128, m)).kernel->name,
                   "gemm_w4a8_gemv_sm80");
    EXPECT_STREQ(select_gemm(gpu_gemm(80, ActivationMode::int8_per_token, f, 128, 4)).kernel->name, "gemm_w4a8_sm80");
    for (const int m : {5, 16})
      EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, f, 128, m)).kernel->name,
                   "gemm_w4a8_sm80");
    for (const int m : {17, 127})
      EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, f, 128, m)).kernel->name,
                   "gemm_w4a8_sm90");
    GemmDesc wide = gpu_gemm(90, ActivationMode::int8_per_token, f, 128, 16);
    wide.n = 16384;
    EXPECT_STREQ(select_gemm(wide).kernel->name, "gemm_w4a8_sm90");
    EXPECT_STREQ(select_gemm(gpu_gemm(80, ActivationMode::int8_per_token, f, 128, 16)).kernel->name, "gemm_w4a8_sm80");
    EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, f, 128, 128)).kernel->name,
                 "gemm_w4a8_sm90");
    EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, f, 64, 1024)).kernel->name,
                 "gemm_w4a8_sm90");
    EXPECT_STREQ(select_gemm(gpu_gemm(80, ActivationMode::int8_per_token, f, 128, 1024)).kernel->name,
                 "gemm_w4a8_sm80");
  }
  const std::string w4a8_g32 = error_of(
      [&] { select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, WeightFormat::qoq, 32, 512)); });
  EXPECT_NE(w4a8_g32.find("gemm_w4a8_sm90: group 32 has no W4A8 GPU kernel"), std::string::npos) << w4a8_g32;
  EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::f16, 0, 1)).kernel->name,
               "gemm_f16_gemv_sm80");
  EXPECT_STREQ(select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::f16, 0, 512)).kernel->name,
               "gemm_f16_mma_sm80");
  // Unaligned rows past 16 tokens: wmma, named as the slow fallback it is.
  GemmDesc unaligned = gpu_gemm(90, ActivationMode::float16, WeightFormat::f16, 0, 512);
  unaligned.aligned_rows = false;
  const GemmSelection s = select_gemm(unaligned);
  EXPECT_STREQ(s.kernel->name, "gemm_f16_wmma_sm80");
  EXPECT_TRUE(s.fallback);
  EXPECT_NE(s.why_chosen().find("cp.async needs 16-byte aligned rows"), std::string::npos) << s.why_chosen();
  // sm_86 (99 KB of shared memory): the 110 KB mma tiles do not fit.
  EXPECT_STREQ(select_gemm(gpu_gemm(86, ActivationMode::float16, WeightFormat::f16, 0, 512)).kernel->name,
               "gemm_f16_wmma_sm80");
  // A build without cuBLASLt (the descriptors above) says so in the reasons.
  EXPECT_NE(select_gemm(gpu_gemm(90, ActivationMode::float16, WeightFormat::f16, 0, 512)).reasons().find(
                "gemm_f16_cublaslt: this lowbit build has no cuBLASLt"),
            std::string::npos);
  // With cuBLASLt: it takes every f16 GEMM, at every token count, on every arch and any row alignment; weights
  // other than f16 never reach it.
  const auto with_cublaslt = [](GemmDesc d) {
    d.cublaslt = true;
    return d;
  };
  for (const int sm : {80, 86, 89, 90}) {
    for (const int m : {1, 2, 16, 17, 127, 128, 4096})
      EXPECT_STREQ(select_gemm(with_cublaslt(gpu_gemm(sm, ActivationMode::float16, WeightFormat::f16, 0, m)))
                       .kernel->name,
                   "gemm_f16_cublaslt")
          << sm << " " << m;
  }
  GemmDesc unaligned_lt = with_cublaslt(unaligned);
  const GemmSelection u = select_gemm(unaligned_lt);
  EXPECT_STREQ(u.kernel->name, "gemm_f16_cublaslt");
  EXPECT_FALSE(u.fallback);
  EXPECT_STREQ(select_gemm(with_cublaslt(gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 128, 512)))
                   .kernel->name,
               "gemm_w4a16_sm90");
  const std::string forced_w4 = error_of([&] {
    select_gemm(with_cublaslt(gpu_gemm(90, ActivationMode::float16, WeightFormat::w4, 128, 512)), "gemm_f16_cublaslt");
  });
  EXPECT_NE(forced_w4.find("gemm_f16_cublaslt cannot run"), std::string::npos) << forced_w4;
  EXPECT_NE(forced_w4.find("needs f16 weights, got w4"), std::string::npos) << forced_w4;
}

TEST(Registry, AttentionChoicesByDescriptor) {
  const AttnSelection d = select_attention(gpu_attention(AttnPhase::decode, 64, ScalarType::u8, ScalarType::u4, 3));
  EXPECT_STREQ(d.kernel->name, "decode_attention_sm80");
  EXPECT_FALSE(d.fallback);
  // Prefill: the wgmma kernel on sm_90 (per-channel K too), the mma.sync kernel before it.
  AttnDesc pre = gpu_attention(AttnPhase::prefill, 128, ScalarType::f16, ScalarType::f16, 4);
  EXPECT_STREQ(select_attention(pre).kernel->name, "prefill_attention_sm90");
  pre.sm = 89;
  EXPECT_STREQ(select_attention(pre).kernel->name, "prefill_attention_tc_sm80");
  AttnDesc pre_pc = gpu_attention(AttnPhase::prefill, 64, ScalarType::u4, ScalarType::u4, 4);
  pre_pc.kv_granularity = KvGranularity::per_channel_k;
  pre_pc.block_size = 64;
  const AttnSelection pc = select_attention(pre_pc);
  EXPECT_STREQ(pc.kernel->name, "prefill_attention_sm90");
  EXPECT_FALSE(pc.fallback);
  EXPECT_NE(pc.why_chosen().find("per-channel K dequantized per block"), std::string::npos) << pc.why_chosen();
  pre_pc.sm = 89;
  EXPECT_STREQ(select_attention(pre_pc).kernel->name, "prefill_attention_tc_sm80");
  pre_pc.sm = 90;
  pre_pc.k_type = ScalarType::u8;  // per-channel K is u4 or u2 only: no GPU kernel, each one says why
  try {
    select_attention(pre_pc);
    ADD_FAILURE() << "per-channel u8 K found a GPU kernel";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("prefill_attention_sm90: reads per-channel K of u4 or u2, not u8"),
              std::string::npos) << e.what();
  }
  // GQA 16 decodes on tensor cores (two slices of 8 heads); head_dim 256 too.
  const AttnSelection g16 =
      select_attention(gpu_attention(AttnPhase::decode, 128, ScalarType::f16, ScalarType::f16, 16));
  EXPECT_STREQ(g16.kernel->name, "decode_attention_sm80");
  EXPECT_FALSE(g16.fallback);
  EXPECT_NE(g16.why_chosen().find("two slices of 8 heads"), std::string::npos) << g16.why_chosen();
  EXPECT_STREQ(select_attention(gpu_attention(AttnPhase::decode, 256, ScalarType::u4, ScalarType::u4, 4)).kernel->name,
               "decode_attention_sm80");
  // Today's gaps are named fallbacks, never silent: head_dim 72 (no instance), GQA 17.
  const AttnSelection d72 = select_attention(gpu_attention(AttnPhase::decode, 72, ScalarType::f16, ScalarType::f16, 1));
  EXPECT_STREQ(d72.kernel->name, "prefill_attention_sm80");
  EXPECT_TRUE(d72.fallback);
  EXPECT_NE(d72.why_chosen().find("head_dim 64, 80, 96, 128, 256, not 72"), std::string::npos) << d72.why_chosen();
  const AttnSelection g17 =
      select_attention(gpu_attention(AttnPhase::decode, 128, ScalarType::f16, ScalarType::f16, 17));
  EXPECT_STREQ(g17.kernel->name, "prefill_attention_tc_sm80");
  EXPECT_TRUE(g17.fallback);
  EXPECT_NE(g17.why_chosen().find("GQA groups up to 16"), std::string::npos) << g17.why_chosen();
  AttnDesc cpu;
  cpu.head_dim = 80;
  cpu.gqa_group = 16;
  EXPECT_STREQ(select_attention(cpu).kernel->name, "paged_attention_cpu");
}

TEST(Registry, MissListsEveryCandidatesReason) {
  const std::string msg = error_of([] {
    select_gemm(gpu_gemm(90, ActivationMode::int8_per_token, WeightFormat::w4, 128, 1), "", false, "Model");
  });
  EXPECT_NE(msg.find("no kernel for gemm sm_90 w4 g128 act=int8_per_token"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gemm_w4a16_sm80: float activations only"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gemm_w8a8_sm90: needs w8 weights, got w4"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("gemm_f32act_cpu"), std::string::npos) << "CPU kernels were never candidates: " << msg;
}

TEST(Registry, ForcedKernelThatCannotRunRaisesWithItsReason) {
  const GemmDesc d = gpu_gemm(80, ActivationMode::int8_per_token, WeightFormat::w8, 0, 8);
  const std::string msg = error_of([&] { select_gemm(d, "gemm_w8a8_sm90", false, "Model: linear.qkv"); });
  EXPECT_NE(msg.find("forced kernel gemm_w8a8_sm90 cannot run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("need sm_90"), std::string::npos) << msg;
  const std::string unknown = error_of([&] { select_gemm(d, "gemm_nope", false, "x"); });
  EXPECT_NE(unknown.find("'gemm_nope' is not registered"), std::string::npos) << unknown;
  const GemmSelection forced = select_gemm(d, "gemm_w8a8_sm80");
  EXPECT_TRUE(forced.forced);
  EXPECT_STREQ(forced.kernel->name, "gemm_w8a8_sm80");
}

TEST(Registry, StrictRefusesFallbacks) {
  const AttnDesc d = gpu_attention(AttnPhase::decode, 72, ScalarType::f16, ScalarType::f16, 1);
  const std::string msg = error_of([&] { select_attention(d, "", true, "Model: attention.decode"); });
  EXPECT_NE(msg.find("strict"), std::string::npos) << msg;
  EXPECT_NE(msg.find("prefill_attention_sm80"), std::string::npos) << msg;
  EXPECT_NE(msg.find("head_dim 64, 80, 96, 128, 256, not 72"), std::string::npos) << msg;
}

static bool decode_built(int head_dim, ScalarType k, ScalarType v) {
  return cuda::instance_state(cuda::kDecodeAttnInstances, head_dim, k, v) == cuda::InstanceState::built;
}

// Every head dim of the decode kernel, with GQA groups up to 16, decodes on tensor cores on sm_80 and
// sm_90 where its instance is built; one the build left out is an error naming the CMake option.
TEST(Registry, DecodeKernelServesEveryHeadDimAndGqaUpTo16) {
  const ScalarType types[] = {ScalarType::f16, ScalarType::u8, ScalarType::u4};
  for (int sm : {80, 90})
    for (int head_dim : {64, 80, 96, 128, 256})
      for (int group : {1, 8, 12, 16})
        for (ScalarType k : types)
          for (ScalarType v : types) {
            AttnDesc desc = gpu_attention(AttnPhase::decode, head_dim, k, v, group);
            desc.sm = sm;
            if (decode_built(head_dim, k, v)) {
              const AttnSelection s = select_attention(desc);
              EXPECT_STREQ(s.kernel->name, "decode_attention_sm80") << desc.to_string();
              EXPECT_FALSE(s.fallback) << desc.to_string();
            } else {
              const std::string msg = error_of([&] { select_attention(desc); });
              EXPECT_NE(msg.find("is not built (configure with -DLOWBIT_ATTN_ALL_INSTANCES=ON)"), std::string::npos)
                  << msg;
            }
          }
  // The common head dims are in every build; the rare ones exactly when the option is on.
  for (int head_dim : {64, 128, 256}) EXPECT_TRUE(decode_built(head_dim, ScalarType::u4, ScalarType::f16));
  for (int head_dim : {80, 96})
    EXPECT_EQ(decode_built(head_dim, ScalarType::u4, ScalarType::f16), cuda::kAttnAllInstances);
}

TEST(Registry, InstanceLeftOutOfTheBuildIsANamedErrorNotAFallback) {
  if (cuda::kAttnAllInstances) GTEST_SKIP() << "built with LOWBIT_ATTN_ALL_INSTANCES=ON: no instance is left out";
  const AttnDesc d = gpu_attention(AttnPhase::decode, 80, ScalarType::u8, ScalarType::u4, 16);
  for (bool strict : {false, true}) {
    const std::string msg = error_of([&] { select_attention(d, "", strict, "Model: attention.decode"); });
    EXPECT_NE(msg.find("no kernel for attention decode sm_90 d80"), std::string::npos) << msg;
    EXPECT_NE(msg.find("decode_attention_sm80: the instance for head_dim 80 k=u8 v=u4 is not built (configure with "
                       "-DLOWBIT_ATTN_ALL_INSTANCES=ON)"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("prefill_attention_sm80: does not stand in"), std::string::npos) << msg;
  }
  // Forcing the slow kernel does not get round it either.
  const std::string forced = error_of([&] { select_attention(d, "prefill_attention_sm80", false, "x"); });
  EXPECT_NE(forced.find("LOWBIT_ATTN_ALL_INSTANCES"), std::string::npos) << forced;
}

TEST(Registry, KernelOptionsAreValidated) {
  EXPECT_NE(error_of([] { parse_kernel_options({{{"lienar", "x"}}, false}); }).find("unknown key 'lienar'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_kernel_options({{{"pdl", "maybe"}}, false}); }).find("on or off"), std::string::npos);
  const ParsedKernelOptions p =
      parse_kernel_options({{{"linear", "gemm_f32act_cpu"}, {"linear.o", "gemm_s8act_cpu"}, {"pdl", "off"}}, true});
  EXPECT_EQ(p.forced_for("linear.qkv"), "gemm_f32act_cpu");
  EXPECT_EQ(p.forced_for("linear.o"), "gemm_s8act_cpu");
  EXPECT_EQ(p.forced_for("attention.decode"), "");
  EXPECT_FALSE(p.tuning.pdl);
  EXPECT_TRUE(p.strict);
  // A token bucket narrows a linear key; the bucket's key wins over its role's, the role's over the family's.
  const ParsedKernelOptions b = parse_kernel_options(
      {{{"linear", "gemm_f32act_cpu"}, {"linear@m2-4", "gemm_s8act_cpu"}, {"linear.qkv@m2-4", "gemm_fp8act_cpu"}}, false});
  EXPECT_EQ(b.forced_for("linear.qkv", "m2-4"), "gemm_fp8act_cpu");
  EXPECT_EQ(b.forced_for("linear.o", "m2-4"), "gemm_s8act_cpu");
  EXPECT_EQ(b.forced_for("linear.o", "m5-16"), "gemm_f32act_cpu");
  EXPECT_EQ(b.forced_for("linear.qkv"), "gemm_f32act_cpu");
  EXPECT_NE(error_of([] { parse_kernel_options({{{"linear@m2-8", "x"}}, false}); }).find("unknown token bucket 'm2-8'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_kernel_options({{{"attention@m1", "x"}}, false}); })
                .find("only linear roles take a token bucket, got 'attention'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_kernel_options({{{"linear.qkv@m1", ""}}, false}); }).find("must name a kernel"),
            std::string::npos);
}

TEST(Registry, PrefillKernelOptions) {
  const KernelTuning defaults = parse_kernel_options({}).tuning;
  EXPECT_EQ(defaults.prefill_key_split, 0);  // the launch's plan
  EXPECT_EQ(defaults.prefill_pack_heads, 0);
  const auto split = [](const std::string& v) {
    return parse_kernel_options({{{"prefill_key_split", v}}, false}).tuning.prefill_key_split;
  };
  EXPECT_EQ(split("auto"), 0);
  EXPECT_EQ(split("off"), 1);
  EXPECT_EQ(split("2"), 2);
  EXPECT_EQ(split("16"), 16);
  for (const char* bad : {"1", "17", "0", "-3", "4x", "", "1000"})
    EXPECT_NE(error_of([&] { split(bad); }).find("auto, off or a split count from 2 to 16"), std::string::npos) << bad;
  const auto pack = [](const std::string& v) {
    return parse_kernel_options({{{"prefill_pack_heads", v}}, false}).tuning.prefill_pack_heads;
  };
  EXPECT_EQ(pack("auto"), 0);
  EXPECT_EQ(pack("off"), 1);
  EXPECT_EQ(pack("on"), 2);
  EXPECT_NE(error_of([&] { pack("always"); }).find("on or off"), std::string::npos);
  EXPECT_FALSE(defaults.prefill_ref_dequant);  // the placed-field u4 / u2 dequantization
  EXPECT_TRUE(parse_kernel_options({{{"prefill_ref_dequant", "on"}}, false}).tuning.prefill_ref_dequant);
  EXPECT_FALSE(parse_kernel_options({{{"prefill_ref_dequant", "off"}}, false}).tuning.prefill_ref_dequant);
  EXPECT_EQ(defaults.prefill_dequant_copy, 0);  // the launch's rule
  EXPECT_EQ(parse_kernel_options({{{"prefill_dequant_copy", "auto"}}, false}).tuning.prefill_dequant_copy, 0);
  EXPECT_EQ(parse_kernel_options({{{"prefill_dequant_copy", "off"}}, false}).tuning.prefill_dequant_copy, 1);
  EXPECT_EQ(parse_kernel_options({{{"prefill_dequant_copy", "on"}}, false}).tuning.prefill_dequant_copy, 2);
  EXPECT_EQ(defaults.prefill_side_stream, 0);  // the per-channel split on a second stream
  EXPECT_EQ(parse_kernel_options({{{"prefill_side_stream", "auto"}}, false}).tuning.prefill_side_stream, 0);
  EXPECT_EQ(parse_kernel_options({{{"prefill_side_stream", "off"}}, false}).tuning.prefill_side_stream, 1);
  EXPECT_EQ(parse_kernel_options({{{"prefill_side_stream", "on"}}, false}).tuning.prefill_side_stream, 2);
  EXPECT_NE(error_of([] { parse_kernel_options({{{"prefill_side_stream", "2"}}, false}); }).find("on or off"),
            std::string::npos);
}

TEST(Registry, ModelPlanNamesTheKernelsAndHonoursOverrides) {
  const ModelConfig c = tiny_config();
  const Weights w = random_weights(c, 3);
  Model m(c, "w8a8", "cpu", "f32");
  load(m, w);
  ASSERT_FALSE(m.plan().empty());
  for (const PlanLine& l : m.plan()) {
    if (l.role.rfind("linear.lm_head", 0) == 0)
      EXPECT_EQ(l.kernel, "gemm_f32act_cpu") << l.role;
    else if (l.role.rfind("linear.", 0) == 0)
      EXPECT_EQ(l.kernel, "gemm_s8act_cpu") << l.role;
    else
      EXPECT_EQ(l.kernel, "paged_attention_cpu") << l.role;
    EXPECT_FALSE(l.fallback);
  }
  bool named = false;
  for (const std::string& k : m.info().kernels) named = named || k.find("gemm_s8act_cpu") != std::string::npos;
  EXPECT_TRUE(named);

  Model forced(c, "w16a16", "cpu", "f32");
  forced.set_kernel_options({{{"linear.o", "gemm_s8act_cpu"}}, false});
  const std::string msg = error_of([&] { load(forced, w); });
  EXPECT_NE(msg.find("Model: linear.o: forced kernel gemm_s8act_cpu cannot run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("int8_per_token activations only"), std::string::npos) << msg;

  Model strict(c, "w16a16", "cpu", "f32");
  strict.set_kernel_options({{}, true});
  load(strict, w);  // the CPU has no fallbacks
  EXPECT_FALSE(strict.plan().empty());
}
