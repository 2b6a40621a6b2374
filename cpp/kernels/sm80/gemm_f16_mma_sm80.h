// Internal: the mma.sync f16 GEMM (gemm_f16_mma_sm80.cu), dispatched by gemm_f16 (gemm_f16_sm80.cu).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda {

struct F16MmaArgs {
  const __half* x;  // [m, k], row stride ldx: multiple of 8, 16-byte aligned start
  int64_t ldx;
  const __half* w;  // [n, k], row stride ldw: the same alignment
  int64_t ldw;
  const __half* bias;  // [n] or null
  __half* y;           // [m, n], row stride ldy
  int64_t ldy;
  float* partial;  // [split, m, n] f32 when split > 1
  int m, n, k;
  int chunks_per_split;  // 64-k chunks per blockIdx.z
};

enum class F16MmaTile { m32n128, m64n128, m128n128 };

struct F16MmaPlan {
  bool ok;  // false: the tile does not fit this device's shared memory (take another kernel)
  F16MmaTile tile;
  int split, chunks_per_split;
};

// Tile by m (32 / 64 tokens while the weight streams once, 128 x 128 when that fills the SMs) and
// split-K where the blocks leave SMs idle.
F16MmaPlan gemm_f16_mma_plan(int64_t m, int64_t n, int64_t k, int device);
// y = x · wᵀ (+ bias); p.partial must hold split * m * n floats when plan.split > 1.
void gemm_f16_mma(const F16MmaArgs& p, const F16MmaPlan& plan, cudaStream_t stream);

}  // namespace lowbit::cuda
