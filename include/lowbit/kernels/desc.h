// Kernel descriptors: what a GEMM or an attention call asks of a kernel, as plain data (trivially
// copyable). The registries (registry.h) match a descriptor against every kernel's can_run;
// to_string() is the key used in logs, errors, `lowbit info --plan`, docs/support.md and tests.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "lowbit/core/device.h"
#include "lowbit/core/dtype.h"
#include "lowbit/quant/format.h"
#include "lowbit/quant/pack.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::kernels {

// Token-count buckets. A plan holds one kernel per bucket, so a step picks its kernel with a few
// compares: 1 (decode of one sequence) | 2..4 | 5..16 | 17..127 | >= 128 (prefill-sized). 2..4 is its own
// bucket because the weight-streaming GEMVs still beat the mma tiles there and lose from ~8 tokens.
enum class MBucket : uint8_t { m1, m4, m16, m127, m_large };
constexpr int kNumMBuckets = 5;
inline MBucket m_bucket_of(int64_t m) {
  return m <= 1    ? MBucket::m1
         : m <= 4  ? MBucket::m4
         : m <= 16 ? MBucket::m16
         : m < 128 ? MBucket::m127
                   : MBucket::m_large;
}
// Up to 16 tokens: the decode-sized buckets (m1, m2-4, m5-16).
inline bool decode_sized(MBucket b) { return b == MBucket::m1 || b == MBucket::m4 || b == MBucket::m16; }
const char* name_of(MBucket b);  // "m1", "m2-4", "m5-16", "m17-127", "m128+"
// W4A8 on sm_90: whether the wgmma kernel (gemm_w4a8_sm90) is the choice for a bucket and a layer of n rows: from 17
// tokens, and at 5-16 tokens on layers of 16384+ rows, where its 16-token tile's unsplit CTAs cover the SMs (measured:
// docs/benchmarks_gpu.md, "W4A8 on wgmma at 5-127 tokens"). The registry's rank and the op's automatic choice
// (cpp/kernels/sm80/gemm_w4a8_sm80.cu) both ask this.
inline bool w4a8_wgmma_preferred(MBucket b, int64_t n) {
  return b == MBucket::m_large || b == MBucket::m127 || (b == MBucket::m16 && n >= 16384);
}

// W4A16 on sm_90: whether the wgmma kernel (gemm_w4a16_sm90) is the choice for a bucket: from 17 tokens (its 16 / 32 /
// 64-token tiles to 64 tokens, stream-K over 128-token tiles at 65-127, the 128 / 256-token plans from 128), where the
// mma.sync kernels ran below 128 before (measured: docs/benchmarks_gpu.md, "W4A16 on wgmma at 5-127 tokens"). The
// registry's rank and the op's automatic choice (cpp/kernels/sm80/gemm_w4a16_sm80.cu) both ask this.
inline bool w4a16_wgmma_preferred(MBucket b) { return b == MBucket::m_large || b == MBucket::m127; }

struct GemmDesc {
  DeviceKind device = DeviceKind::cpu;
  int sm = 0;  // compute capability 10 * major + minor; 0 on the CPU
  ActivationMode act = ActivationMode::float16;  // how the activations enter the GEMM
  ScalarType x_type = ScalarType::f32;  // f32/f16/bf16 rows, or s8/e4m3 codes the caller quantized
  ScalarType y_type = ScalarType::f32;
  WeightFormat weight = WeightFormat::f16;
  PackTarget packed = PackTarget::cpu;
  int group = 0;  // weight group size (0: per channel / none)
  int64_t n = 0, k = 0;
  MBucket m = MBucket::m1;
  bool aligned_rows = true;  // x rows start 16-byte aligned with a row stride that keeps them so
  bool cublaslt = false;     // CUDA: this build has cuBLASLt (gemm_f16_cublaslt can run)
  std::string to_string() const;  // "gemm cuda sm_90 w4 g128 act=float16 x=f16 y=f16 n=4096 k=4096 m1"
};

enum class AttnPhase : uint8_t { prefill, decode };
const char* name_of(AttnPhase p);  // "prefill", "decode"

// K/V are quantized per token per head (kv_cache.h); the granularity is a field so that a second
// scheme (per-channel K) can be described without changing the registry.
// How K is quantized: per token and head (every format today), or per channel over a block of tokens
// (KIVI-style, the CPU only so far). V is always per token and head.
enum class KvGranularity : uint8_t { per_token_head, per_channel_k };
const char* name_of(KvGranularity g);

struct AttnDesc {
  DeviceKind device = DeviceKind::cpu;
  int sm = 0;
  AttnPhase phase = AttnPhase::prefill;
  int head_dim = 0;
  ScalarType q_type = ScalarType::f32, out_type = ScalarType::f32;
  ScalarType k_type = ScalarType::f32, v_type = ScalarType::f32;
  KvGranularity kv_granularity = KvGranularity::per_token_head;
  int gqa_group = 1;   // query heads per KV head
  int block_size = 16; // tokens per paged KV block
  bool q_rows_aligned16 = true;  // q rows start on 16 bytes (token and head strides too), as the model's q always does
  std::string to_string() const;  // "attention decode cuda sm_90 d128 q=f16 k=u8 v=u4 gqa4 block16"
};

static_assert(std::is_trivially_copyable_v<GemmDesc> && std::is_trivially_copyable_v<AttnDesc>);

// The descriptor of y[m, n] = x[m, k] · Wᵀ for a packed weight on `device` (weights of 16-bit floats
// count as f16 on the GPU, where they are packed so).
GemmDesc describe_gemm(const Device& device, ActivationMode act, ScalarType x_type, ScalarType y_type,
                       const PackedWeight& w, int64_t m, bool aligned_rows);

// "sm_90" / "cpu": the device part of the keys.
std::string arch_name(DeviceKind device, int sm);
// 10 * major + minor of a CUDA device (cached per device), 0 for the CPU or a build without CUDA.
int compute_capability(const Device& device);

}  // namespace lowbit::kernels
