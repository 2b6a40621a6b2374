// The Hopper attention kernel (cpp/kernels/sm90/prefill_attention_sm90.cuh, built for sm_90a only) in the
// attention registry: prefill on wgmma, preferred over the mma.sync prefill kernel on sm_90 where it covers the
// descriptor (per-token K and V, or per-channel u4/u2 K with its f16 window and per-token V).
#include <string>

#include "kernels/registry/registration.h"
#include "kernels/sm90/prefill_split_plan.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::kernels {
namespace {

bool sm90_kv_type(ScalarType t) {
  return t == ScalarType::f16 || t == ScalarType::u8 || t == ScalarType::u4 || t == ScalarType::u2;
}

Fit prefill_sm90_can_run(const AttnDesc& d, std::string* why) {
  if (!on_device(DeviceKind::cuda, d.device, why)) return Fit::no;
  if (d.sm != 90) return refuse(why, "wgmma needs sm_90 exactly (built as sm_90a), got " + arch_name(d.device, d.sm));
  if (d.q_type != ScalarType::f16 || d.out_type != ScalarType::f16) return refuse(why, "needs f16 q and out");
  const bool per_channel = d.kv_granularity == KvGranularity::per_channel_k;
  if (per_channel && d.k_type != ScalarType::u4 && d.k_type != ScalarType::u2)
    return refuse(why, std::string("reads per-channel K of u4 or u2, not ") + name_of(d.k_type));
  // The GPU cache keeps per-channel K blocks (the K group) a multiple of 16 tokens; the kernel needs no more.
  if (per_channel && (d.block_size <= 0 || d.block_size % 16 != 0))
    return refuse(why, "per-channel K in blocks of a multiple of 16 tokens, not " + std::to_string(d.block_size));
  if (!sm90_kv_type(d.k_type) || !sm90_kv_type(d.v_type))
    return refuse(why, std::string("reads f16, u8, u4 or u2 K and V, not k=") + name_of(d.k_type) +
                           " v=" + name_of(d.v_type));
  if (d.head_dim != 64 && d.head_dim != 128)
    return refuse(why, "has head_dim 64 and 128, not " + std::to_string(d.head_dim));
  if (!d.q_rows_aligned16) return refuse(why, "needs q rows 16-byte aligned (copied in 16-byte pieces)");
  if (d.phase == AttnPhase::decode) return slow(why, "a prefill kernel serving decode (128-row query tiles, one row used)");
  if (per_channel)
    return fits(why, "wgmma, 128-row query tiles, per-channel K dequantized per block by the producer warpgroup, "
                     "diagonal tiles read twice (codes, then f16 window rows), f32 softmax");
  return fits(why, "wgmma, 128-row query tiles, producer warpgroup gathering pages, f32 softmax");
}
// Above the mma.sync prefill kernel (rank 2) for prefill; as a stand-in for decode, below it.
int prefill_sm90_rank(const AttnDesc& d) { return d.phase == AttnPhase::decode ? 0 : 3; }

static_assert(kMaxPrefillKeySplits == cuda::prefill_split::kMaxSplits,
              "kernel option prefill_key_split accepts what the split merge can combine");

#ifdef LOWBIT_WITH_CUDA
void launch_prefill_sm90(const AttnArgs& a) {
  const KVCache& c = a.cache;
  const cuda::PrefillSm90Options options{a.tuning.prefill_key_split, a.tuning.prefill_pack_heads,
                                         a.tuning.prefill_ref_dequant, a.tuning.prefill_dequant_copy,
                                         a.tuning.prefill_side_stream};
  cuda::prefill_attention(a.q, c.k_data(a.layer), c.v_data(a.layer), c.k_params(a.layer), c.v_params(a.layer),
                          a.meta.block_tables, a.seq_info, a.max_q_len, a.scale, a.out, cuda::current_stream(),
                          cuda::PrefillKernel::hopper, cuda::k_window_of(c, a.layer), options);
}
#define LOWBIT_GPU_LAUNCH(f) f
#else
#define LOWBIT_GPU_LAUNCH(f) nullptr
#endif

}  // namespace

void register_attention_sm90(std::vector<AttnKernel>& out) {
  out.push_back({"prefill_attention_sm90",
                 "prefill on Hopper: wgmma, f16 q, K/V f16/u8/u4/u2 (K also u4/u2 per channel), head_dim 64/128",
                 prefill_sm90_can_run, prefill_sm90_rank, LOWBIT_GPU_LAUNCH(launch_prefill_sm90)});
}

}  // namespace lowbit::kernels
