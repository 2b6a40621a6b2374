// One code of lowbit's per-token activation quantizers, shared by the stand-alone quantizer and the
// RMSNorm that quantizes its output, so both produce the same bytes: int8 rint(v) clamped to +-127,
// e4m3 nearest even, saturated; qmax (127 or 448) sets the per-row scale max|x| / qmax.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

namespace lowbit::cuda {

template <bool kFp8>
constexpr float quantize_qmax() { return kFp8 ? 448.f : 127.f; }

template <bool kFp8>
__device__ inline uint32_t quantize_code(float v) {
  if constexpr (kFp8) return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  else return static_cast<uint32_t>(max(-127, min(127, __float2int_rn(v)))) & 0xFF;
}

// The scale of a row whose largest |value| is amax: amax / qmax rounded once, 1 for an all-zero row.
template <bool kFp8>
__device__ __forceinline__ float row_scale(float amax) {
  return amax > 0.f ? __fdiv_rn(amax, quantize_qmax<kFp8>()) : 1.f;
}

}  // namespace lowbit::cuda
