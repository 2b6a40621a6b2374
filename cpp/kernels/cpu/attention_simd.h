// Inner loops of the CPU attention, each over a whole cache block so that a call amortises:
// scores of one query row against n keys, the softmax exponentials, and the P·V accumulation.
// Compiled once in attention_simd.cpp (AVX2+FMA when the build targets x86-64-v3, plain loops
// otherwise), so the tests exercise exactly the code the kernel runs.
#pragma once
#include <cstdint>

namespace lowbit::cpu::simd {

// out[j] = q · k[j] for the n rows k[j] = k + j * d.
void dot_rows(const float* q, const float* k, int64_t n, int64_t d, float* out);

// e^x for x <= 0: x = i ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative
// error < 2e-7 there, about one f32 ulp), 2^i put in the exponent bits; x is clamped at -87
// (e^-87 ~ 1.6e-38, the bottom of the normal range).
float exp_nonpositive(float x);

// x[j] = e^(x[j] - m) for x[j] <= m; returns the sum of the new x[j].
float exp_shifted_sum(float* x, int64_t n, float m);

// acc[0, d) += sum_j p[j] * v[j] for the n rows v[j] = v + j * d.
void accumulate_rows(const float* p, const float* v, int64_t n, int64_t d, float* acc);

}  // namespace lowbit::cpu::simd
