// The COMET FMPQ codes of one (token, 128-channel block), for the producers that write them in place of a separate
// quantize_fmpq pass (the RMSNorm and the SiLU·mul of an FMPQ model): the same arithmetic as quantize_fmpq_kernel,
// so they give its bytes. s = max|x| / qmax (qmax 7 for an int4 block, 127 for an int8 one; 1 for an all-zero block),
// q = rint(x / s) clamped to +-qmax, IEEE division. The maximum does not depend on the order it is taken in, so any
// split of a block's channels over lanes gives the same scale and codes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/cuda/kernels.h"  // FmpqBits
#include "lowbit/quant/activation.h"  // kFmpqBlock

namespace lowbit::cuda {

__device__ __forceinline__ bool fmpq_int8_block(const FmpqBits& bits, int b) {
  return (bits.int8_mask[b >> 5] >> (b & 31)) & 1u;
}

// Block b of a row is held by 16 lanes (the lower or upper half of a warp; every lane of the warp calls), lane l
// of the half holding columns 128 b + 8 l .. + 7 in v (0 for columns at or past k). Writes the codes of the columns
// below k into qrow (one 8-byte store per lane where `q8`: qrow 8-byte aligned) and the scale; `active` false: the
// half holds no block (it joins the warp's shuffles only).
__device__ __forceinline__ void fmpq_codes_half_warp(const float (&v)[8], int b, int k, bool int8, bool active,
                                                     int8_t* qrow, float* scale, bool q8) {
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (!active) return;
  const float qmax = int8 ? 127.f : 7.f;
  const float s = amax > 0.f ? __fdiv_rn(amax, qmax) : 1.f;
  const int lim = int8 ? 127 : 7, l = static_cast<int>(threadIdx.x % 16), c = b * kFmpqBlock + 8 * l;
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int code = max(-lim, min(lim, __float2int_rn(__fdiv_rn(v[e], s))));
    packed[e / 4] |= (static_cast<uint32_t>(code) & 0xFFu) << (8 * (e % 4));
  }
  if (q8 && c + 8 <= k) {
    *reinterpret_cast<uint2*>(qrow + c) = make_uint2(packed[0], packed[1]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (c + e < k) qrow[c + e] = static_cast<int8_t>((packed[e / 4] >> (8 * (e % 4))) & 0xFFu);
  }
  if (l == 0) *scale = s;
}

}  // namespace lowbit::cuda
