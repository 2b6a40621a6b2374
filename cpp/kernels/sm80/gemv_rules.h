// Where the register-direct GEMVs (gemm_w4a8_gemv_sm80.cu) pay, by shape: plain C++ (no CUDA headers), so the
// kernel registry (gemm_sm80_entries.cpp, also in CPU builds) ranks with the same rules the ops (gemm_w4a8_sm80.cu,
// gemm_fmpq_sm80.cu) apply.
#pragma once
#include <cstdint>

namespace lowbit::cuda::detail {

// The W4A8 / FMPQ GEMV's automatic width (H200, bench/results/h200-2026-11-28-w4a8-gemv-m1to4-a2d3da2.json, 8B and
// 70B/TP2 layers): the wide plan pays where one copy of x per 4 tiles outweighs the split's partial sums: the widest
// layers (gate_up) at one token, layers of >= 8192 rows and >= 64M weights at 2-3 tokens, from 5120 rows at 4 (one
// tile was 0.85-0.95x of it on 4096-row layers at every count, and 1.15x faster on 8B qkv at 3 tokens).
inline bool gemv8_wide_pays(int64_t m, int64_t n, int64_t k) {
  if (m <= 1) return n >= 16384;
  if (m <= 3) return n >= 8192 && n * k >= (int64_t{64} << 20);
  return n >= 5120;
}

// FMPQ at 2-4 tokens (H200, bench/results/h200-2026-11-28-fmpq-gemv-6004df8.json): on layers whose k is long against
// n (down: k >= 1.75 n) the GEMV measured 0.82-0.97x the mma.sync FMPQ kernel, which keeps them; at one token it
// is faster on every layer.
inline bool fmpq_gemv_pays(int64_t m, int64_t n, int64_t k) { return m <= 1 || (m <= 4 && 4 * k < 7 * n); }

}  // namespace lowbit::cuda::detail
