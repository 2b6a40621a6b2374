// Checks shared by quantize_weight_with_params, dequantize_weight and validate_quantized_weight.
#pragma once
#include "lowbit/quant/format.h"

namespace lowbit::quant_detail {

void check_group_size(WeightFormat f, int group, const char* op);  // 32, 64 or 128 for group-wise formats
// Dtype/shape/device/value checks of each *defined* parameter tensor; `require` demands the ones the
// format needs (true for a finished QuantizedWeight, false for caller-supplied partial parameters).
void check_weight_params(WeightFormat f, int64_t n, int64_t groups, bool symmetric, const WeightQuantParams& p,
                         bool require, const char* op);
// qoq: q*s <= 255, z*s <= 255 (u8 lanes) and q*s - z*s in [-128, 127]; liquid: q*s + a <= 255, so that
// (q*s + a) XOR 0x80 is the s8 value min + q*s. Throws naming row, column and the offending values.
void check_s8_reconstruction(const QuantizedWeight& w, const char* op);

}  // namespace lowbit::quant_detail
