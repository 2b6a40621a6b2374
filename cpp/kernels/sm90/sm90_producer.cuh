// The producer side of the weight-stationary wgmma GEMMs' TMA pipeline (gemm_w4a8_sm90.cu, gemm_w4a16_sm90.cu): the
// stage barriers' setup and one stage's copies. A stage holds, at st, the activation tile (C::kXBytes, a 2-D TMA box),
// then the packed weight tiles (C::kWBytes, one 3-D TMA box over pack_sm80's [tile][chunk] layout), then the group
// parameters (1-D bulk copies).
//
// The copies are split over three producer threads (lane 0 of the producer warpgroup's warps 0-2), one copy kind
// each. Why: one thread issuing them all spent ~190 instructions per stage (address math, the group division, 64-bit
// offsets, each copy's uniform-register loop) at ~6 cycles each, ~1,200 cycles, more than a W4A8 stage's int8 tensor
// work (ncu, docs/gpu_notes.md); the W4A16 profile showed the same starvation. Each part arrives on the stage's full
// barrier (initialized for kProducerParts arrivals) with its own byte count, so the phase completes only when all
// three parts' bytes have landed. The one-thread producer ('sm90o' names, kept for A/B timing) issues the same copies
// after one byte count of their sum.
#pragma once
#include <cstdint>

#include "kernels/sm90/sm90_common.cuh"

namespace lowbit::cuda::sm90 {

constexpr int kProducerParts = 3;

#ifdef LOWBIT_SM90_DEVICE
// Thread 0 prefetches the two tensor maps and initializes the stage barriers (full: `producers` arrivals plus the
// bytes; empty: `consumers` arrivals), visible to the cluster; then the block syncs.
template <int kStages>
__device__ __forceinline__ void init_pipeline(const CUtensorMap* map_x, const CUtensorMap* map_w, uint64_t* full,
                                              uint64_t* empty, unsigned producers, unsigned consumers) {
  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map_w)) : "memory");
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], producers);
      mbar_init(&empty[s], consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// Part `part` of a stage's copies into st, each with its byte count on `bar`: 0 the activation tile at (x_k, m0), 1 the
// packed weight box at chunk w_chunk of 16-row tile n0 / 16 (boxes count in full: tiles past n and chunks past k
// arrive as zeros), 2 the group parameters at st + C::kXBytes + C::kWBytes, which each format copies and counts its
// own way: params().
template <class C, class Params>
__device__ __forceinline__ void produce_stage_part(int part, uint8_t* st, uint64_t* bar, const CUtensorMap* map_x,
                                                   const CUtensorMap* map_w, int x_k, int m0, int w_chunk, int n0,
                                                   const Params& params) {
  if (part == 0) {
    mbar_expect_tx(bar, C::kXBytes);
    tma_load_2d(st, map_x, x_k, m0, bar);
  } else if (part == 1) {
    mbar_expect_tx(bar, C::kWBytes);
    tma_load_3d(st + C::kXBytes, map_w, 0, w_chunk, n0 / 16, bar);
  } else {
    params();
  }
}
#endif  // LOWBIT_SM90_DEVICE

}  // namespace lowbit::cuda::sm90
