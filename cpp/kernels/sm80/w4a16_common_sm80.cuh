// Device helpers shared by the W4A16 GEMM kernels (gemm_w4a16_sm80.cu, gemm_w4a16_large_sm80.cu): the
// packed-layout constants of pack_sm80, cp.async, the u4 -> f16 dequant, ldmatrix and mma.sync
// m16n8k16. One copy so that every kernel dequantizes bit-identically (w = q*s - z*s, or q*s + m, in f16). The f16
// GEMM (gemm_f16_mma_sm80.cu) uses the cp.async / ldmatrix / mma pieces.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda::w4a16 {

constexpr int kChunkK = 64;  // k per packed chunk
constexpr int kTileN = 16;   // weight rows per packed tile
constexpr int kChunkBytes = 512;

__device__ inline void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

// 16-byte copy that reads only src_bytes (0..16) and zero-fills the rest: k tails and rows past the
// matrix edge (src_bytes = 0 reads nothing; gmem must still be a valid address).
__device__ inline void cp_async16_zfill(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ inline void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ inline void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <int kLut>
__device__ inline uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm volatile("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(r) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return r;
}

__device__ inline uint32_t as_u32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ inline __half2 as_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// 8 nibbles -> 4 f16x2 A-fragment registers (order documented in pack_sm80.cpp), then
// w = q*s + (-z*s) with the scale of row g for a0/a2 and of row g+8 for a1/a3.
__device__ inline void dequant_word(uint32_t word, __half2 s_lo, __half2 nzs_lo, __half2 s_hi, __half2 nzs_hi,
                                    uint32_t (&a)[4]) {
  constexpr uint32_t kLowMask = 0x000f000f, kHighMask = 0x00f000f0, kExp = 0x64006400;  // 0x6400 = 1024.0
  constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;                                         // (a & b) | c
  const __half2 k1024 = as_h2(0x64006400), k1_16 = as_h2(0x2c002c00), km64 = as_h2(0xd400d400);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint32_t lo = lop3<kAndOr>(word, kLowMask, kExp);   // (1024 + n_i, 1024 + n_{i+4})
    const uint32_t hi = lop3<kAndOr>(word, kHighMask, kExp);  // (1024 + 16 n_{i+1}, ...)
    const __half2 q_row_g = __hsub2(as_h2(lo), k1024);
    const __half2 q_row_g8 = __hfma2(as_h2(hi), k1_16, km64);
    a[2 * half] = as_u32(__hfma2(q_row_g, s_lo, nzs_lo));
    a[2 * half + 1] = as_u32(__hfma2(q_row_g8, s_hi, nzs_hi));
    word >>= 8;
  }
}

// -(z*s) rounded as the kernels use it: the product rounds to f16 once, then w = fma(q, s, -(z*s)).
__device__ inline __half2 neg_zero_scale(__half z, __half s) { return __half2half2(__hneg(__hmul(z, s))); }

// The addend of w = fma(q, s, addend) from a weight's second parameter: -(z*s) for a zero point, or the
// stored min itself for weights kept as w = q*s + m (GGUF Q4_1: no rounding beyond the file's own).
__device__ inline __half2 addend_of(__half zero_or_min, __half s, bool mins) {
  return mins ? __half2half2(zero_or_min) : neg_zero_scale(zero_or_min, s);
}

// Groups are multiples of 32 (g32, g64, g128, ...), so a 64-k chunk holds one or two groups: its k16
// steps 0-1 read the parameters of half 0 (k 0-31), steps 2-3 those of half 1. Row of the [G, npad]
// parameters for half `half` of chunk kc; both halves share a row unless the group is an odd multiple of 32.
__device__ inline int param_row(int kc, int half, int group) { return (kc * kChunkK + 32 * half) / group; }
__device__ inline bool halves_differ(int group) { return group % kChunkK != 0; }

// Split-K: y[m, n] (row stride ldy) = the sum over the splits of the f32 partials [split, m, n], in a fixed order
// (deterministic), rounded to f16 once. A template only so that each kernel file including this header has its own.
template <class Out>
__global__ void sum_split_partials_kernel(const float* __restrict__ partial, int split, int m, int n, Out* y,
                                          int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t mn = static_cast<int64_t>(m) * n;
  if (i >= mn) return;
  float s = 0.f;
  for (int z = 0; z < split; ++z) s += partial[z * mn + i];
  y[(i / n) * ldy + i % n] = __float2half_rn(s);
}
inline void sum_split_partials(const float* partial, int split, int m, int n, __half* y, int64_t ldy,
                               cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(m) * n;
  sum_split_partials_kernel<__half><<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(partial, split, m,
                                                                                                    n, y, ldy);
}

__device__ inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace lowbit::cuda::w4a16
