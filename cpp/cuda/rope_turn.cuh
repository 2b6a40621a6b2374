// The RoPE turn of one pair, shared by the rope kernel and the fused rope + KV-write kernel so that
// both produce the same bits (same expression, same contraction, same rounding to the row's dtype).
#pragma once
#include "cuda/float_io.cuh"

namespace lowbit::cuda {

constexpr int kMaxRopeHalf = 128;  // rotary_dim <= 256

// Turns pair i of `row` (dtype t) by pos * inv_freq_i: neox pairs (i, i + half), GPT-J (2i, 2i+1).
// The angle and its sine/cosine are in double (pos * inv_freq reaches 1e5+ rad).
__device__ __forceinline__ void rope_turn_pair(void* row, ScalarType t, double pos, double inv_freq_i, int i, int half,
                                               bool neox) {
  double s, c;
  sincos(pos * inv_freq_i, &s, &c);
  const float cf = static_cast<float>(c), sf = static_cast<float>(s);
  const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
  const float x0 = load_any(row, t, ia), x1 = load_any(row, t, ib);
  store_any(row, t, ia, x0 * cf - x1 * sf);
  store_any(row, t, ib, x1 * cf + x0 * sf);
}

}  // namespace lowbit::cuda
