// Arch-neutral weight formats: what a checkpoint stores and what the packer consumes.
// A weight is the matrix W[n, k] of a linear layer Y = X · Wᵀ (n = out features, k = in features).
// Group-wise formats group along k; k need not be a multiple of the group (the last group is short).
// docs/formats.md gives each format's storage, dequant formula and paper section.
#pragma once
#include <string>

#include "lowbit/core/tensor.h"

namespace lowbit {

enum class WeightFormat : uint8_t {
  f32, f16, bf16,  // plain floating weights
  w8,              // symmetric s8, f32 scale per output channel, or per group of k when group > 0
                   // (GGUF Q8_0 as stored: groups of 32)
  w4,              // group-wise u4, f16 scale + f16 zero per group: w = (q - zero) * scale (AWQ/GPTQ semantics)
  qoq,             // QServe progressive: s8 per-channel in [-119, 119] (f32 scale), then group u4 with
                   // u8 scale and u4 zero: s8 = q*s2 - z*s2 (subtraction after multiplication)
  liquid,          // LiquidGEMM: s8 per-channel (f32 scale), then group u4 with integer step s <= 16 and
                   // u8 offset a = 128 + min: s8 = (q*s + a) XOR 0x80 computed in u8
  e4m3,            // fp8 e4m3 per-channel, f32 scale
};
const char* name_of(WeightFormat f);
WeightFormat weight_format_from_name(const std::string& name);  // case-insensitive; throws listing the known names
int weight_bits(WeightFormat f);                  // bits per stored weight element: 32 16 16 8 4 4 4 8
bool is_group_wise(WeightFormat f);               // w4, qoq, liquid
int default_group(WeightFormat f);                // 128 (w4, qoq), 64 (liquid, LiquidGEMM §4), 0 otherwise
ScalarType element_type_of(WeightFormat f);       // dtype of QuantizedWeight::q

struct QuantizedWeight {
  WeightFormat format = WeightFormat::f32;
  int64_t n = 0, k = 0;
  int group = 0;           // group size along k for w4/qoq/liquid (32, 64 or 128); w8: 0 (per channel) or
                           // 32/64/128 (one scale per group); 0 otherwise
  bool symmetric = false;  // w4 only: zero fixed at 8, `zeros` left undefined
  Tensor q;               // [n, k] in the format's element type (f32/f16/bf16/s8/u4/e4m3)
  Tensor scales;          // w8/e4m3: f32 [n] (grouped w8: f32 [n, G]); w4: f16 [n, G]; qoq: u8 [n, G]; liquid: u8 step [n, G]
  Tensor zeros;           // w4: f16 [n, G]; qoq: u8 [n, G] (u4 zero value); liquid: u8 offset a [n, G]
  Tensor channel_scales;  // qoq/liquid level-1 per-channel f32 [n]
  // w4 only, optional: f16 [n, G] per-group minimum m, w = q*s + m (GGUF Q4_1's "scale + min"), used
  // instead of `zeros` (symmetric false, zeros undefined). CPU kernels only; the GPU packers refuse it.
  Tensor mins;
  int64_t num_groups() const { return group > 0 ? (k + group - 1) / group : 0; }
};

// Round-to-nearest quantization of a float weight (f32/f16/bf16 [n, k], CPU); better algorithms live in
// Python and produce the same QuantizedWeight fields. `group` (32, 64, 128; 0 = default_group) is used by
// the group-wise formats, optional for w8 (0: per channel; else one scale per group) and ignored by the
// others; `symmetric` only matters for w4. Rounding is half-to-even.
QuantizedWeight quantize_weight(const Tensor& w, WeightFormat format, int group = 0, bool symmetric = false);

// Caller-chosen parameters (AWQ/GPTQ scale search, QoQ/LiquidQuant clipping): each tensor that is
// defined is used as given, each undefined one is computed by the round-to-nearest rule above, and the
// values are then rounded exactly as quantize_weight rounds them. Layouts as in QuantizedWeight:
//   w8/e4m3: scales f32 [n] ([n, G] for grouped w8)            w4: scales f16 [n, G], zeros f16 [n, G] (integers in [0, 15])
//   qoq:     channel_scales f32 [n], scales u8 [n, G] (>= 1), zeros u8 [n, G] (<= 15)
//   liquid:  channel_scales f32 [n], scales u8 [n, G] (1..16), zeros u8 [n, G] (offset a = 128 + group min)
// qoq/liquid throw if the chosen parameters make the s8 reconstruction overflow.
struct WeightQuantParams {
  Tensor scales, zeros, channel_scales;
};
QuantizedWeight quantize_weight_with_params(const Tensor& w, WeightFormat format, int group, bool symmetric,
                                            const WeightQuantParams& params);

// Exact float reconstruction (f32 [n, k]) of what the kernels compute with: w8 q*s, w4 (q - z)*s,
// qoq/liquid (their s8 value) * channel scale, e4m3 value * s. Throws if a qoq/liquid weight breaks
// the s8 no-overflow invariant.
Tensor dequantize_weight(const QuantizedWeight& w);

// Throws (naming `op` and the field) unless every field has the dtype/shape/device its format needs and
// the parameter values are legal; for qoq/liquid it also checks the s8 no-overflow invariant per element.
void validate_quantized_weight(const QuantizedWeight& w, const char* op);

// u4 helpers: one value per byte (u8 [n, k], values <= 15) <-> packed u4 [n, k] (2 per byte, low nibble first).
Tensor pack_u4_values(const Tensor& values, const char* op, const char* arg);
Tensor unpack_u4_values(const Tensor& packed);

}  // namespace lowbit
