// Loads and stores of f32/f16/bf16 elements as f32 inside kernels (stores round to nearest even),
// and a dispatch from ScalarType to the element type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "lowbit/core/error.h"
#include "lowbit/core/dtype.h"

namespace lowbit::cuda {

__device__ __forceinline__ float load_f32(const float* p) { return *p; }
__device__ __forceinline__ float load_f32(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f32(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Element i of a buffer whose dtype is known only at run time (a warp-uniform branch): lets one
// kernel serve every mix of f32/f16/bf16 operands without instantiating each combination.
__device__ __forceinline__ float load_any(const void* base, ScalarType t, int64_t i) {
  if (t == ScalarType::f16) return __half2float(static_cast<const __half*>(base)[i]);
  if (t == ScalarType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  return static_cast<const float*>(base)[i];
}
__device__ __forceinline__ void store_any(void* base, ScalarType t, int64_t i, float v) {
  if (t == ScalarType::f16)
    static_cast<__half*>(base)[i] = __float2half_rn(v);
  else if (t == ScalarType::bf16)
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(base)[i] = v;
}

__host__ __device__ __forceinline__ int float_bytes(ScalarType t) { return t == ScalarType::f32 ? 4 : 2; }

// Calls fn(T{}) with T the element type of `t` (f32, f16 or bf16); other types throw naming `op`.
template <typename Fn>
void dispatch_float(ScalarType t, const char* op, Fn&& fn) {
  switch (t) {
    case ScalarType::f32: fn(float{}); return;
    case ScalarType::f16: fn(__half{}); return;
    case ScalarType::bf16: fn(__nv_bfloat16{}); return;
    default: LOWBIT_FAIL(ErrorKind::kType, op, ": dtype ", name_of(t), " is not f32, f16 or bf16");
  }
}

// Sum over a warp (all lanes get the result).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (kMax false) or max (kMax true) over a block of kThreads threads; every thread gets the result. Safe to call
// again right away: the first barrier waits until the previous call's partials have been read.
template <int kThreads, bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[kThreads / 32];
  v = kMax ? warp_max(v) : warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const float s = lane < kThreads / 32 ? partial[lane] : 0.f;
  return kMax ? warp_max(s) : warp_sum(s);
}

// What storing v as T keeps (T = float, __half or __nv_bfloat16).
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  T r;
  store_f32(&r, v);
  return load_f32(&r);
}

}  // namespace lowbit::cuda
