// The RoPE turn of one pair, shared by the rope kernel and the fused rope + KV-write kernel so that
// both produce the same bits (same expression, same contraction, same rounding to the row's dtype).
#pragma once
#include "cuda/float_io.cuh"

namespace lowbit::cuda {

constexpr int kMaxRopeHalf = 128;  // rotary_dim <= 256

// The cosine and sine of the angle pos * inv_freq_i, computed in double (the angle reaches 1e5+ rad), as f32.
__device__ __forceinline__ void rope_angle(double pos, double inv_freq_i, float& cf, float& sf) {
  double s, c;
  sincos(pos * inv_freq_i, &s, &c);
  cf = static_cast<float>(c);
  sf = static_cast<float>(s);
}

// The turned pair (x0, x1) by the angle whose cosine and sine are cf, sf. Written with explicit roundings so that no
// kernel's compiler contracts it differently: every kernel that turns a pair gets the same bits.
__device__ __forceinline__ void rope_turn_values(float x0, float x1, float cf, float sf, float& y0, float& y1) {
  y0 = __fsub_rn(__fmul_rn(x0, cf), __fmul_rn(x1, sf));
  y1 = __fadd_rn(__fmul_rn(x1, cf), __fmul_rn(x0, sf));
}

// Turns pair i of `row` (dtype t) by the angle whose cosine and sine are cf, sf: neox pairs (i, i + half), GPT-J
// (2i, 2i+1).
__device__ __forceinline__ void rope_turn_pair(void* row, ScalarType t, float cf, float sf, int i, int half, bool neox) {
  const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
  const float x0 = load_any(row, t, ia), x1 = load_any(row, t, ib);
  float y0, y1;
  rope_turn_values(x0, x1, cf, sf, y0, y1);
  store_any(row, t, ia, y0);
  store_any(row, t, ib, y1);
}

// Turns pair i of `row` by pos * inv_freq_i.
__device__ __forceinline__ void rope_turn_pair(void* row, ScalarType t, double pos, double inv_freq_i, int i, int half,
                                               bool neox) {
  float cf, sf;
  rope_angle(pos, inv_freq_i, cf, sf);
  rope_turn_pair(row, t, cf, sf, i, half, neox);
}

}  // namespace lowbit::cuda
