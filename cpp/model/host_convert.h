// Host-side conversions the model uses at load time (not in the hot path): float tensors of any
// dtype/device/strides to f32, f32 to the compute dtype, and row-wise concatenation (q|k|v fusion).
#pragma once
#include <vector>

#include "lowbit/core/tensor.h"

namespace lowbit::model_detail {

// f32/f16/bf16 tensor anywhere -> contiguous f32 copy on the host. `what` names it in errors.
Tensor to_f32_host(const Tensor& t, const std::string& what);
// Contiguous host f32 -> new contiguous host tensor of `dtype` (f32/f16/bf16), round to nearest even.
Tensor f32_to_dtype_host(const Tensor& t, ScalarType dtype);
// Contiguous host tensor of f32/f16/bf16 -> f32 values written to `out` (numel floats).
void dtype_to_f32_host(const Tensor& t, float* out);
// Concatenates tensors along dim 0 (same dtype and trailing shape); all undefined -> undefined.
Tensor concat_rows(const std::vector<Tensor>& parts, const char* what);

}  // namespace lowbit::model_detail
