// Row-wise elementwise kernels on the CPU (f32/f16/bf16 in and out, f32 math, OpenMP over rows).
#pragma once
#include <cstdint>

#include "lowbit/core/tensor.h"

namespace lowbit::cpu {

// A 2-D view: `rows` rows of `cols` contiguous elements, `stride` elements apart.
struct RowView {
  char* base = nullptr;
  ScalarType dtype = ScalarType::f32;
  int64_t rows = 0, cols = 0, stride = 0;
};

// out = x / sqrt(mean(x^2) + eps) * weight, in f32, rounded once to out's dtype.
void rms_norm_cpu(const RowView& x, const RowView& weight, float eps, const RowView& out);
// residual += x (rounded to residual's dtype), then out = rms_norm(residual) * weight.
void add_rms_norm_cpu(const RowView& residual, const RowView& x, const RowView& weight, float eps, const RowView& out);
// out[t, i] = silu(gu[t, i]) * gu[t, I + i], silu(g) = g / (1 + exp(-g)).
void silu_mul_cpu(const RowView& gate_up, const RowView& out);
// out[t] = table[ids[t]] (ids already range-checked).
void embedding_cpu(const int32_t* ids, const RowView& table, const RowView& out);
// Softmax over each row, max-subtracted, f32.
void softmax_cpu(const RowView& x, const RowView& out);

}  // namespace lowbit::cpu
