// Activation quantization formats (dynamic, computed per step).
#pragma once
#include "lowbit/core/tensor.h"

namespace lowbit {

// Per-token symmetric int8: q[m, k] = round(x / s[m]), s[m] = max|x[m, :]| / 127 (s = 1 when the row is 0).
void quantize_per_token_s8(const Tensor& x /*f32|f16|bf16 [m, k]*/, Tensor& q /*s8 [m, k]*/, Tensor& scales /*f32 [m]*/);

// COMET FMPQ: channels in blocks of 128; each block is int4 or int8 by a fixed precision map
// (block_bits[b] in {4, 8}); per-token per-block symmetric scale. Values are stored as s8 in q
// (int4 blocks hold values in [-8, 7]) so one int32-accumulating GEMM serves both.
struct FmpqActivation {
  Tensor q;          // s8 [m, k]
  Tensor scales;     // f32 [m, num_blocks]
  Tensor block_bits; // u8 [num_blocks]
};
void quantize_fmpq(const Tensor& x, const Tensor& block_bits, FmpqActivation& out);

}  // namespace lowbit
