// pack_weight / unpack_weight: route a QuantizedWeight to the packer of one kernel family.
#include "lowbit/quant/pack.h"

namespace lowbit {

const char* name_of(PackTarget t) {
  switch (t) {
    case PackTarget::cpu: return "cpu";
    case PackTarget::sm80: return "sm80";
    case PackTarget::sm90: return "sm90";
  }
  return "?";
}

PackTarget pack_target_from_name(const std::string& name) {
  for (PackTarget t : {PackTarget::cpu, PackTarget::sm80, PackTarget::sm90})
    if (name == name_of(t)) return t;
  LOWBIT_CHECK(false, "pack_target_from_name: unknown pack target '", name, "' (known: cpu, sm80, sm90)");
}

PackedWeight packed_header(const QuantizedWeight& w, PackTarget target) {
  PackedWeight p;
  p.format = w.format;
  p.target = target;
  p.n = w.n;
  p.k = w.k;
  p.group = w.group;
  p.symmetric = w.symmetric;
  return p;
}

QuantizedWeight unpacked_header(const PackedWeight& p) {
  QuantizedWeight w;
  w.format = p.format;
  w.n = p.n;
  w.k = p.k;
  w.group = p.group;
  w.symmetric = p.symmetric;
  return w;
}

PackedWeight pack_weight(const QuantizedWeight& w, PackTarget target, const Device& device) {
  validate_quantized_weight(w, "pack_weight");
  if (w.format == WeightFormat::w8 && target != PackTarget::cpu)
    LOWBIT_NOT_SUPPORTED("pack_weight: w8 weights", w.group > 0 ? " (grouped w8, GGUF Q8_0 as stored)" : "",
                         " have no packed ", name_of(target), " layout: the GPU kernels read them as stored (row-major "
                         "s8 and f32 scales, uploaded by the model)");
  switch (target) {
    case PackTarget::cpu:
      LOWBIT_CHECK(device.is_cpu(), "pack_weight: target cpu packs into host memory, but device ", device.str(),
                   " was requested");
      return pack_cpu(w);
    case PackTarget::sm80:
      LOWBIT_CHECK(device.is_cuda(), "pack_weight: target sm80 packs into GPU memory, so 'device' must be a CUDA "
                   "device, got ", device.str());
      return pack_sm80(w, device);
    case PackTarget::sm90:
      break;
  }
  LOWBIT_NOT_SUPPORTED("pack_weight: no sm90 layout for weight format ", name_of(w.format),
                       " yet (pack for sm80, which also runs on sm_90, or for cpu)");
}

QuantizedWeight unpack_weight(const PackedWeight& p) {
  switch (p.target) {
    case PackTarget::cpu: return unpack_cpu(p);
    case PackTarget::sm80: return unpack_sm80(p);
    case PackTarget::sm90: break;
  }
  LOWBIT_NOT_SUPPORTED("unpack_weight: no sm90 layout for weight format ", name_of(p.format), " yet");
}

}  // namespace lowbit
