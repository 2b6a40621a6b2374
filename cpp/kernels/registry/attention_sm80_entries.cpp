// The sm80-family attention kernels (cpp/kernels/sm80/*attention*.cu) in the attention registry:
// the split-KV tensor-core decode kernel, the tensor-core prefill kernel, and the warp-per-query
// kernel that serves whatever the other two cannot (a slow fallback: strict plans refuse it).
#include <cstddef>
#include <string>

#include "kernels/registry/registration.h"
#include "kernels/sm80/instances/attention_instance_list.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::kernels {
namespace {

// KV formats the GPU kernels read: per-channel K at 4 or 2 bits (the u4c / u2c instances); 2-bit K or V only
// where an instance has them (head_dim 64 and 128, tc_common says so by name). Nothing falls back.
bool gpu_kv_format_ok(const AttnDesc& d, std::string* why) {
  if (d.kv_granularity == KvGranularity::per_channel_k && d.k_type != ScalarType::u4 && d.k_type != ScalarType::u2)
    return refuse(why, std::string("has no GPU kernel for per-channel K of ") + name_of(d.k_type) +
                           " (4 and 2 bits only); it runs on the CPU"),
           false;
  return true;
}

// What both tensor-core kernels need: f16 q/out and an instance for (head_dim, K, V). The instances
// are generated (tools/generate_attention_instances.py); one the build left out is refused with the
// CMake option that adds it, and warp_can_run does not stand in for it.
template <size_t N>
bool tc_common(const AttnDesc& d, std::string* why, const cuda::AttnInstance (&instances)[N]) {
  if (!on_device(DeviceKind::cuda, d.device, why)) return false;
  if (d.sm < 80) return refuse(why, "needs sm_80 or newer"), false;
  if (!gpu_kv_format_ok(d, why)) return false;
  if (d.q_type != ScalarType::f16 || d.out_type != ScalarType::f16) return refuse(why, "needs f16 q and out"), false;
  const bool per_channel = d.kv_granularity == KvGranularity::per_channel_k;
  const std::string kv =
      std::string("k=") + name_of(d.k_type) + (per_channel ? " per channel" : "") + " v=" + name_of(d.v_type);
  switch (cuda::instance_state(instances, d.head_dim, d.k_type, d.v_type, per_channel)) {
    case cuda::InstanceState::built: return true;
    case cuda::InstanceState::not_built:
      return refuse(why, "the instance for head_dim " + std::to_string(d.head_dim) + " " + kv + " is not built (" +
                             cuda::kAttnAllInstancesHint + ")"),
             false;
    case cuda::InstanceState::none: break;
  }
  if (cuda::instance_state(instances, d.head_dim, ScalarType::f16, ScalarType::f16) == cuda::InstanceState::none)
    return refuse(why, "has instances for head_dim " + cuda::head_dims_of(instances) + ", not " +
                           std::to_string(d.head_dim)),
           false;
  if (d.k_type == ScalarType::u2 || d.v_type == ScalarType::u2)
    return refuse(why, "has 2-bit K/V instances (" + kv + ") for head_dim 64 and 128 only, not " +
                           std::to_string(d.head_dim)),
           false;
  return refuse(why, "has instances for K/V f16, u8, u4, u2 and per-channel u4/u2 K, not " + kv), false;
}

// The phase's tensor-core kernel has an instance for this descriptor that the build left out.
bool instance_left_out(const AttnDesc& d) {
  const bool pc = d.kv_granularity == KvGranularity::per_channel_k;
  const cuda::InstanceState s =
      d.phase == AttnPhase::decode
          ? cuda::instance_state(cuda::kDecodeAttnInstances, d.head_dim, d.k_type, d.v_type, pc)
          : cuda::instance_state(cuda::kPrefillTcInstances, d.head_dim, d.k_type, d.v_type, pc);
  return s == cuda::InstanceState::not_built;
}

Fit decode_can_run(const AttnDesc& d, std::string* why) {
  if (d.device == DeviceKind::cuda && d.phase != AttnPhase::decode) return refuse(why, "decode steps only");
  if (!tc_common(d, why, cuda::kDecodeAttnInstances)) return Fit::no;
  if (d.gqa_group > 16)
    return refuse(why, "GQA groups up to 16 (slices of 8 on the mma's n8 side), got " + std::to_string(d.gqa_group));
  if (d.gqa_group > 8) return fits(why, "split-KV, the GQA group in two slices of 8 heads, K/V read once per slice");
  return fits(why, "split-KV, the GQA group on the mma's n8 side, K/V read once per group");
}
int decode_rank(const AttnDesc&) { return 3; }

Fit prefill_tc_can_run(const AttnDesc& d, std::string* why) {
  if (!tc_common(d, why, cuda::kPrefillTcInstances)) return Fit::no;
  if (d.phase == AttnPhase::decode) return slow(why, "a prefill kernel serving decode (64-row query tiles, one row used)");
  return fits(why, "64-row query tiles, mma.sync, f32 softmax");
}
int prefill_tc_rank(const AttnDesc&) { return 2; }

Fit warp_can_run(const AttnDesc& d, std::string* why) {
  if (!on_device(DeviceKind::cuda, d.device, why)) return Fit::no;
  if (d.sm < 80) return refuse(why, "needs sm_80 or newer");
  if (d.head_dim <= 0 || d.head_dim > 256) return refuse(why, "head_dim 1..256");
  if (!gpu_kv_format_ok(d, why)) return Fit::no;
  if (d.kv_granularity == KvGranularity::per_channel_k)
    return refuse(why, "per-channel K runs on the tensor-core kernels only (its f16 window and block rule)");
  if (instance_left_out(d))
    return refuse(why, std::string("does not stand in for a tensor-core instance left out of the build (") +
                           cuda::kAttnAllInstancesHint + ")");
  return slow(why, "one warp per (query, head) in f32, no tensor cores");
}
int warp_rank(const AttnDesc&) { return 1; }

#ifdef LOWBIT_WITH_CUDA

void launch_decode(const AttnArgs& a) {
  const int64_t n = int64_t(a.meta.q_len.size());
  Tensor o = a.out.slice(0, 0, n);
  const KVCache& c = a.cache;
  cuda::decode_attention(a.q.slice(0, 0, n), c.k_data(a.layer), c.v_data(a.layer), c.k_params(a.layer),
                         c.v_params(a.layer), a.meta.block_tables, a.seq_info.select(0, 2), a.max_kv_len, a.scale, o,
                         0, cuda::current_stream(), cuda::k_window_of(c, a.layer));
}
template <cuda::PrefillKernel K>
void launch_prefill(const AttnArgs& a) {
  const KVCache& c = a.cache;
  cuda::prefill_attention(a.q, c.k_data(a.layer), c.v_data(a.layer), c.k_params(a.layer), c.v_params(a.layer),
                          a.meta.block_tables, a.seq_info, a.max_q_len, a.scale, a.out, cuda::current_stream(), K,
                          cuda::k_window_of(c, a.layer));
}
#define LOWBIT_GPU_LAUNCH(f) f
#else
#define LOWBIT_GPU_LAUNCH(f) nullptr
#endif

}  // namespace

void register_attention_sm80(std::vector<AttnKernel>& out) {
  out.push_back({"decode_attention_sm80", "decode: split-KV tensor cores, f16 q, K/V f16/u8/u4 (K also u4 per channel) at head_dim 64/80/96/128/256, 2-bit K/V (K also u2 per channel) at 64/128, GQA <= 16",
                 decode_can_run, decode_rank, LOWBIT_GPU_LAUNCH(launch_decode)});
  out.push_back({"prefill_attention_tc_sm80", "prefill: tensor cores, f16 q, K/V f16/u8/u4/u2 (K also u4/u2 per channel), head_dim 64/128",
                 prefill_tc_can_run, prefill_tc_rank,
                 LOWBIT_GPU_LAUNCH((launch_prefill<cuda::PrefillKernel::tensor_core>))});
  out.push_back({"prefill_attention_sm80", "any phase: one warp per (query, head), f32 (slow path)", warp_can_run,
                 warp_rank, LOWBIT_GPU_LAUNCH((launch_prefill<cuda::PrefillKernel::warp>))});
}

}  // namespace lowbit::kernels
