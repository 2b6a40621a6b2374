// The CPU paged attention (cpp/kernels/cpu/attention_cpu.cpp) in the attention registry: every
// phase, head_dim, GQA group and K/V format the cache can hold (u2 and per-channel K included).
#include "kernels/cpu/attention_cpu.h"
#include "kernels/registry/registration.h"

namespace lowbit::kernels {
namespace {

Fit cpu_can_run(const AttnDesc& d, std::string* why) {
  if (!on_device(DeviceKind::cpu, d.device, why)) return Fit::no;
  if (d.head_dim <= 0) return refuse(why, "needs head_dim > 0");
  return fits(why, d.kv_granularity == KvGranularity::per_channel_k
                        ? "f32 online softmax, per-channel K blocks and their f16 residual window"
                        : "f32 online softmax, dequantizes K/V per token");
}
int rank_one(const AttnDesc&) { return 1; }
void launch_cpu(const AttnArgs& a) { cpu::paged_attention_cpu(a.q, a.cache, a.layer, a.meta, a.scale, a.out); }

}  // namespace

void register_attention_cpu(std::vector<AttnKernel>& out) {
  out.push_back({"paged_attention_cpu", "CPU, any phase, head_dim, GQA group and K/V type (f32 softmax)", cpu_can_run,
                 rank_one, launch_cpu});
}

}  // namespace lowbit::kernels
