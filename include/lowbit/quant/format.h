// Arch-neutral weight formats: what a checkpoint stores and what the packer consumes.
// A weight is the matrix W[n, k] of a linear layer Y = X · Wᵀ (n = out features, k = in features).
// Group-wise formats group along k; k need not be a multiple of the group (the last group is short).
#pragma once
#include <string>

#include "lowbit/core/tensor.h"

namespace lowbit {

enum class WeightFormat : uint8_t {
  f32, f16, bf16,  // plain floating weights
  w8,              // per-channel symmetric s8, f32 scale per output channel
  w4,              // group-wise u4, f16 scale + f16 zero per group: w = (q - zero) * scale (AWQ/GPTQ semantics)
  qoq,             // QServe progressive: s8 per-channel in [-119, 119] (f32 scale), then group u4 with
                   // u8 scale and u4 zero: s8 = q*s2 - z*s2 (subtraction after multiplication)
  liquid,          // LiquidGEMM: s8 per-channel (f32 scale), then group u4 with integer step s <= 16 and
                   // u8 offset a = 128 + min: s8 = (q*s + a) XOR 0x80 computed in u8
  e4m3,            // fp8 e4m3 per-channel, f32 scale
};
const char* name_of(WeightFormat f);
WeightFormat weight_format_from_name(const std::string& name);  // throws listing the known names
int weight_bits(WeightFormat f);

struct QuantizedWeight {
  WeightFormat format = WeightFormat::f32;
  int64_t n = 0, k = 0;
  int group = 0;           // group size along k for w4/qoq/liquid; 0 otherwise
  bool symmetric = false;  // w4 only: zero fixed at 8
  Tensor q;               // [n, k] in the format's element type (f32/f16/bf16/s8/u4/e4m3)
  Tensor scales;          // w8/e4m3: f32 [n]; w4: f16 [n, G]; qoq: u8 [n, G]; liquid: u8 step [n, G]
  Tensor zeros;           // w4: f16 [n, G]; qoq: u8 [n, G] (u4 zero value); liquid: u8 offset a [n, G]
  Tensor channel_scales;  // qoq/liquid level-1 per-channel f32 [n]
  int64_t num_groups() const { return group > 0 ? (k + group - 1) / group : 0; }
};

// Round-to-nearest quantization of a float weight (f32 [n, k]); better algorithms live in Python
// (python/lowbit/quantize) and produce the same QuantizedWeight fields.
QuantizedWeight quantize_weight(const Tensor& w, WeightFormat format, int group = 128, bool symmetric = false);
// Exact float reconstruction (f32 [n, k]) of what the kernels compute with.
Tensor dequantize_weight(const QuantizedWeight& w);

}  // namespace lowbit
