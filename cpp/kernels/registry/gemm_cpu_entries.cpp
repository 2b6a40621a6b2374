// The CPU GEMM kernels (cpp/kernels/cpu/gemm_*_cpu.cpp) in the GEMM registry: one entry per way the
// activations enter the GEMM. Every weight format has a float-activation kernel; the integer and fp8
// ones need a weight of matching values.
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/registry/registration.h"

namespace lowbit::kernels {
namespace {

bool s8_weight(WeightFormat f) { return f == WeightFormat::w8 || f == WeightFormat::qoq || f == WeightFormat::liquid; }
bool float_rows(ScalarType t) { return t == ScalarType::f32 || t == ScalarType::f16 || t == ScalarType::bf16; }

// Shared checks of every CPU entry: device, packing, float input and output rows.
bool cpu_common(const GemmDesc& d, std::string* why, bool float_input) {
  if (!on_device(DeviceKind::cpu, d.device, why)) return false;
  if (d.packed != PackTarget::cpu) return refuse(why, "needs a weight packed for cpu"), false;
  if (float_input && !float_rows(d.x_type)) return refuse(why, "needs f32/f16/bf16 activation rows"), false;
  if (!float_rows(d.y_type)) return refuse(why, "writes f32/f16/bf16 rows"), false;
  return true;
}

Fit f32act_can_run(const GemmDesc& d, std::string* why) {
  if (!cpu_common(d, why, true)) return Fit::no;
  if (d.act != ActivationMode::float16) return refuse(why, "float activations only");
  return fits(why, "every weight format, f32 accumulation");
}
Fit s8act_can_run(const GemmDesc& d, std::string* why) {
  if (!cpu_common(d, why, true)) return Fit::no;
  if (d.act != ActivationMode::int8_per_token) return refuse(why, "int8_per_token activations only");
  if (!s8_weight(d.weight)) return refuse(why, std::string("needs w8/qoq/liquid weights, got ") + name_of(d.weight));
  if (d.weight == WeightFormat::w8 && d.group > 0) return refuse(why, "needs per-channel w8 (grouped w8 has float activations)");
  return fits(why, "int8 x int8 in int32, bit-exact");
}
Fit fp8act_can_run(const GemmDesc& d, std::string* why) {
  if (!cpu_common(d, why, true)) return Fit::no;
  if (d.act != ActivationMode::fp8_per_token) return refuse(why, "fp8_per_token activations only");
  if (d.weight != WeightFormat::e4m3) return refuse(why, std::string("needs e4m3 weights, got ") + name_of(d.weight));
  return fits(why, "e4m3 products exact, f32 sums");
}
Fit fmpq_can_run(const GemmDesc& d, std::string* why) {
  if (!cpu_common(d, why, false)) return Fit::no;
  if (d.act != ActivationMode::fmpq_mixed) return refuse(why, "fmpq_mixed activations only");
  if (d.x_type != ScalarType::s8) return refuse(why, "takes s8 codes from quantize_fmpq");
  if (!s8_weight(d.weight)) return refuse(why, std::string("needs w8/qoq/liquid weights, got ") + name_of(d.weight));
  if (d.weight == WeightFormat::w8 && d.group > 0) return refuse(why, "needs per-channel w8");
  return fits(why, "int4/int8 blocks of 128 channels, int32 per block");
}

int rank_one(const GemmDesc&) { return 1; }

void launch_linear(const GemmArgs& a) { cpu::linear_cpu(a.x, a.w, a.bias, a.y, a.act); }
void launch_fmpq(const GemmArgs& a) {
  FmpqActivation x;
  x.q = a.x;
  x.scales = a.x_scales;
  cpu::linear_fmpq_cpu(x, a.w, a.bias, a.y);
}

}  // namespace

void register_gemm_cpu(std::vector<GemmKernel>& out) {
  out.push_back({"gemm_f32act_cpu", "CPU, float activations, every weight format (AVX2, dequantize on the fly)",
                 f32act_can_run, rank_one, launch_linear});
  out.push_back({"gemm_s8act_cpu", "CPU, per-token int8 activations, w8/qoq/liquid weights", s8act_can_run, rank_one,
                 launch_linear});
  out.push_back({"gemm_fp8act_cpu", "CPU, per-token e4m3 activations, e4m3 weights", fp8act_can_run, rank_one,
                 launch_linear});
  out.push_back({"gemm_fmpq_cpu", "CPU, COMET FMPQ int4/int8 block activations, w8/qoq/liquid weights", fmpq_can_run,
                 rank_one, launch_fmpq});
}

}  // namespace lowbit::kernels
