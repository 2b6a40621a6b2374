// The packer: arch-neutral QuantizedWeight -> the layout one kernel family reads, at load time.
// Each target's layout is documented in its own source file (pack_cpu.cpp, pack_sm80.cpp, ...).
#pragma once
#include <string>

#include "lowbit/quant/format.h"

namespace lowbit {

enum class PackTarget : uint8_t { cpu, sm80, sm90 };
const char* name_of(PackTarget t);
PackTarget pack_target_from_name(const std::string& name);  // "cpu", "sm80", "sm90"; throws listing them

struct PackedWeight {
  WeightFormat format = WeightFormat::f32;
  PackTarget target = PackTarget::cpu;
  int64_t n = 0, k = 0;
  int group = 0;
  bool symmetric = false;
  Tensor data;            // packed quantized values (layout per target)
  Tensor scales, zeros;   // per-target layout of the group/channel parameters
  Tensor channel_scales;  // qoq/liquid level-1 scales
  Tensor mins;            // w4 with per-group mins (QuantizedWeight::mins), in place of zeros
  Tensor aux;             // target-specific extra (e.g. precomputed scaled zeros)
};

// The format and shape fields every layout carries over unchanged; the tensors are left for the target to fill.
PackedWeight packed_header(const QuantizedWeight& w, PackTarget target);
QuantizedWeight unpacked_header(const PackedWeight& p);

// Validates `w` (validate_quantized_weight), then dispatches: cpu -> pack_cpu (device must be the CPU),
// sm80 -> pack_sm80 (device must be CUDA; the result lives there), sm90 -> NotSupported naming the format.
PackedWeight pack_weight(const QuantizedWeight& w, PackTarget target, const Device& device);
QuantizedWeight unpack_weight(const PackedWeight& p);  // for verification: must round-trip bit-exactly

// Per-target implementations (one file each). Targets without support throw NotSupported.
PackedWeight pack_cpu(const QuantizedWeight& w);
QuantizedWeight unpack_cpu(const PackedWeight& p);
PackedWeight pack_sm80(const QuantizedWeight& w, const Device& device);
QuantizedWeight unpack_sm80(const PackedWeight& p);
PackedWeight pack_sm80_w4a8(const QuantizedWeight& w, const Device& device);  // qoq / liquid (pack_sm80 routes here)
QuantizedWeight unpack_sm80_w4a8(const PackedWeight& p);

}  // namespace lowbit
