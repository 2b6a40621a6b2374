// The sm80-family attention kernels (cpp/kernels/sm80/*attention*.cu) in the attention registry:
// the split-KV tensor-core decode kernel, the tensor-core prefill kernel, and the warp-per-query
// kernel that serves whatever the other two cannot (a slow fallback: strict plans refuse it).
#include <algorithm>
#include <initializer_list>

#include "kernels/registry/registration.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit::kernels {
namespace {

// K/V element types of the tensor-core kernels' instances.
bool tc_kv_type(ScalarType t) { return t == ScalarType::f16 || t == ScalarType::u8 || t == ScalarType::u4; }

// What both tensor-core kernels need: f16 q/out, a head_dim they have instances of, f16/u8/u4 K and V.
// Head dims whose per-lane K/V runs are not whole 16-, 8- or 4-byte loads (80, 96) have none yet.
bool tc_common(const AttnDesc& d, std::string* why, std::initializer_list<int> head_dims, const char* listed) {
  if (!on_device(DeviceKind::cuda, d.device, why)) return false;
  if (d.sm < 80) return refuse(why, "needs sm_80 or newer"), false;
  if (d.q_type != ScalarType::f16 || d.out_type != ScalarType::f16) return refuse(why, "needs f16 q and out"), false;
  if (std::find(head_dims.begin(), head_dims.end(), d.head_dim) == head_dims.end())
    return refuse(why, std::string("has instances for head_dim ") + listed + ", not " + std::to_string(d.head_dim)),
           false;
  if (!tc_kv_type(d.k_type) || !tc_kv_type(d.v_type))
    return refuse(why, std::string("has instances for K/V f16, u8, u4, not k=") + name_of(d.k_type) +
                           " v=" + name_of(d.v_type)),
           false;
  return true;
}

Fit decode_can_run(const AttnDesc& d, std::string* why) {
  if (d.device == DeviceKind::cuda && d.phase != AttnPhase::decode) return refuse(why, "decode steps only");
  if (!tc_common(d, why, {64, 128, 256}, "64, 128, 256")) return Fit::no;
  if (d.gqa_group > 16)
    return refuse(why, "GQA groups up to 16 (slices of 8 on the mma's n8 side), got " + std::to_string(d.gqa_group));
  if (d.gqa_group > 8) return fits(why, "split-KV, the GQA group in two slices of 8 heads, K/V read once per slice");
  return fits(why, "split-KV, the GQA group on the mma's n8 side, K/V read once per group");
}
int decode_rank(const AttnDesc&) { return 3; }

Fit prefill_tc_can_run(const AttnDesc& d, std::string* why) {
  if (!tc_common(d, why, {64, 128}, "64, 128")) return Fit::no;
  if (d.phase == AttnPhase::decode) return slow(why, "a prefill kernel serving decode (64-row query tiles, one row used)");
  return fits(why, "64-row query tiles, mma.sync, f32 softmax");
}
int prefill_tc_rank(const AttnDesc&) { return 2; }

Fit warp_can_run(const AttnDesc& d, std::string* why) {
  if (!on_device(DeviceKind::cuda, d.device, why)) return Fit::no;
  if (d.sm < 80) return refuse(why, "needs sm_80 or newer");
  if (d.head_dim <= 0 || d.head_dim > 256) return refuse(why, "head_dim 1..256");
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
                         0, cuda::current_stream());
}
template <cuda::PrefillKernel K>
void launch_prefill(const AttnArgs& a) {
  const KVCache& c = a.cache;
  cuda::prefill_attention(a.q, c.k_data(a.layer), c.v_data(a.layer), c.k_params(a.layer), c.v_params(a.layer),
                          a.meta.block_tables, a.seq_info, a.max_q_len, a.scale, a.out, cuda::current_stream(), K);
}
#define LOWBIT_GPU_LAUNCH(f) f
#else
#define LOWBIT_GPU_LAUNCH(f) nullptr
#endif

}  // namespace

void register_attention_sm80(std::vector<AttnKernel>& out) {
  out.push_back({"decode_attention_sm80", "decode: split-KV tensor cores, f16 q, K/V f16/u8/u4, head_dim 64/128/256, GQA <= 16",
                 decode_can_run, decode_rank, LOWBIT_GPU_LAUNCH(launch_decode)});
  out.push_back({"prefill_attention_tc_sm80", "prefill: tensor cores, f16 q, K/V f16/u8/u4, head_dim 64/128",
                 prefill_tc_can_run, prefill_tc_rank,
                 LOWBIT_GPU_LAUNCH((launch_prefill<cuda::PrefillKernel::tensor_core>))});
  out.push_back({"prefill_attention_sm80", "any phase: one warp per (query, head), f32 (slow path)", warp_can_run,
                 warp_rank, LOWBIT_GPU_LAUNCH((launch_prefill<cuda::PrefillKernel::warp>))});
}

}  // namespace lowbit::kernels
