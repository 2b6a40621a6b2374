// Activation quantization formats (dynamic, computed per step). Input x: f32/f16/bf16 [m, k] on the CPU.
// Outputs are allocated when passed undefined, otherwise they must already have the right dtype and shape
// (and be contiguous) and are written in place. Rounding is half-to-even; x must be finite.
#pragma once
#include "lowbit/core/tensor.h"

namespace lowbit {

// Per-token symmetric int8: q[m, k] = clamp(round(x / s[m]), -127, 127), s[m] = max|x[m, :]| / 127
// (s = 1 when the row is 0).
void quantize_per_token_s8(const Tensor& x /*f32|f16|bf16 [m, k]*/, Tensor& q /*s8 [m, k]*/, Tensor& scales /*f32 [m]*/);

// COMET FMPQ (§3.2): channels in blocks of 128 (the last block may be short); each block is int4 or
// int8 by a fixed precision map (block_bits[b] in {4, 8}, u8 [ceil(k / 128)]); per-token per-block
// symmetric scale s = max|x| / qmax with qmax = 7 (int4) or 127 (int8), q = clamp(round(x / s), -qmax, qmax).
// Values are stored as s8 in q (int4 blocks hold values in [-7, 7]) so one int32-accumulating GEMM
// serves both.
constexpr int kFmpqBlock = 128;
struct FmpqActivation {
  Tensor q;          // s8 [m, k]
  Tensor scales;     // f32 [m, num_blocks]
  Tensor block_bits; // u8 [num_blocks]
};
void quantize_fmpq(const Tensor& x, const Tensor& block_bits, FmpqActivation& out);

}  // namespace lowbit
