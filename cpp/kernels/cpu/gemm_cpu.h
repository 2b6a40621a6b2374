// CPU GEMM for every weight format over the packed layout of quant/pack_cpu_layout.h (AVX2 + FMA).
// y[m, n] = x[m, k] · Wᵀ. Rows of x are padded to an even length (2 * num_k_pairs(k)) with zeros.
#pragma once
#include <cstdint>

#include "lowbit/quant/recipe.h"
#include "lowbit/quant/activation.h"
#include "lowbit/quant/pack.h"

namespace lowbit::cpu {

// Float activations (dequant-on-the-fly, f32 accumulation): x f32 [m, ldx] (ldx >= 2*pairs, zero past
// k), y f32 [m, ldy]. Per-channel scales (w8, e4m3, qoq, liquid) are applied; bias is not.
void gemm_f32act_cpu(const float* x, int64_t ldx, int64_t m, const PackedWeight& w, float* y, int64_t ldy);

// The w4 part of gemm_f32act_cpu (its own layout and kernel).
void gemm_w4_f32act_cpu(const float* x, int64_t ldx, int64_t m, const PackedWeight& w, float* y, int64_t ldy);

// The qoq/liquid decode (m <= 4) part of gemm_f32act_cpu.
void gemm_u4s8_f32act_decode_cpu(const float* x, int64_t ldx, int64_t m, const PackedWeight& w, float* y, int64_t ldy);

// int8 activations for w8/qoq/liquid: xq holds s8 values widened to int16 [m, ldx] (zero past k);
// acc[m, n] = sum_k xq * w_s8 in int32, bit-exact (w_s8 = the per-group s8 weight of qoq/liquid).
void gemm_s8act_cpu(const int16_t* xq, int64_t ldx, int64_t m, const PackedWeight& w, int32_t* acc);

// The same with one activation scale per block of `block` k (even): acc[m, blocks, n] holds each
// block's int32 sum separately (COMET FMPQ, §3.2: scales per token and 128-channel block).
void gemm_s8act_blocked_cpu(const int16_t* xq, int64_t ldx, int64_t m, const PackedWeight& w, int64_t block,
                            int32_t* acc);

// Per-token symmetric int8: s = max|x| / 127 (1 for an all-zero row), q = round_half_even(x / s).
void quantize_rows_s8(const float* x, int64_t ldx, int64_t m, int64_t k, int16_t* xq, int64_t ldq, float* scales);

// The whole CPU linear (arguments already validated by ops::linear): converts x, runs the kernel,
// applies activation/channel scales and bias, writes y in its dtype.
void linear_cpu(const Tensor& x, const PackedWeight& w, const Tensor& bias, Tensor& y, ActivationMode act);

// COMET W4Ax on FMPQ activations (validated by ops::linear_fmpq): y = cs[n] * sum_b s_x[m, b] * acc_b.
constexpr int64_t kFmpqBlockK = 128;  // COMET §3.2: channel blocks of 128
void linear_fmpq_cpu(const FmpqActivation& x, const PackedWeight& w, const Tensor& bias, Tensor& y);

}  // namespace lowbit::cpu
