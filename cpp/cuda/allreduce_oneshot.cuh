// Device helpers of the peer-memory kernels (allreduce_oneshot.cu, allreduce_norm_push.cu): the flag stores and loads
// of the protocol (allreduce_oneshot.h) and 16-byte packs of f32/f16/bf16 summed in f32.
#pragma once
#include <cstdint>

#include "cuda/allreduce_oneshot.h"
#include "cuda/float_io.cuh"

namespace lowbit::cuda {

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// 16 bytes <-> 16 / sizeof(T) floats, word by word (no local-memory type punning).
__device__ __forceinline__ float2 unpack2(uint32_t w, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
__device__ __forceinline__ float2 unpack2(uint32_t w, __nv_bfloat16) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
__device__ __forceinline__ uint32_t pack2(float x, float y, __half) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack2(float x, float y, __nv_bfloat16) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <typename T>
struct Pack {
  static constexpr int kVec = 16 / int(sizeof(T));
  __device__ static void add(const uint4& bits, float* acc) {
    const uint32_t w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 4) {
        acc[i] += __uint_as_float(w[i]);
      } else {
        const float2 f = unpack2(w[i], T{});
        acc[2 * i] += f.x;
        acc[2 * i + 1] += f.y;
      }
    }
  }
  __device__ static uint4 round(const float* acc) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 4)
        w[i] = __float_as_uint(acc[i]);
      else
        w[i] = pack2(acc[2 * i], acc[2 * i + 1], T{});
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};

}  // namespace lowbit::cuda
