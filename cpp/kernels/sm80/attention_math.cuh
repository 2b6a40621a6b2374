// Small device helpers the tensor-core prefill kernels share (prefill_attention_tc_sm80.cuh, mma.sync, and
// kernels/sm90/prefill_attention_sm90.cuh, wgmma): f16 pair packing, exact f32 of a KV code, and the row sums
// over the 4 lanes of an accumulator quad.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace lowbit::cuda::attn_math {

__device__ inline uint32_t pack_half2(float lo, float hi) {  // lo in the low 16 bits (the lower index)
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Exact f32 of a code c < 2^23: the float 2^23 + c has c in its mantissa.
__device__ inline float code_f32(uint32_t c) { return __uint_as_float(0x4B000000u | c) - 8388608.f; }

// Sum over the 4 lanes of a quad (lanes 4g..4g+3 hold one accumulator row between them).
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace lowbit::cuda::attn_math
