// Stream-K scheduling for the weight-stationary wgmma GEMMs (gemm_w4a16_sm90.cu): a persistent grid of exactly the
// resident CTAs, each taking an equal contiguous range of the flattened (tile, k block) space, so a wave-quantized
// shape (qkv at M = 256: 96 tiles of 128 tokens on 132 SMs) keeps every SM busy for the same number of k blocks.
//
// A CTA's range is a run of segments, each one tile's k blocks [kb, ke); it walks them last to first. The CTA
// holding a tile's last k block owns the tile: it adds the f32 partials of the earlier CTAs that hold the rest of
// that tile (for them it was their range's last segment, so the first they computed) from the nearest CTA back,
// then runs the epilogue, at the end of its own run. A contributor writes its partial to its own workspace slot (one
// per CTA: only a range's last segment can stop short of a tile's end) and raises its flag; the owner waits on the
// flag, reads, and clears it for the next launch. An owner waits only on lower CTAs, which start no later, so the
// grid cannot deadlock even when CTAs run one after another. No atomics on outputs: the sums and their order are
// fixed by the partition, so results are bit-identical run to run.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda::sm90 {

// The partition: CTA c of `ctas` covers flattened k blocks [begin(c), begin(c + 1)) of tiles x k_blocks.
struct StreamKSpace {
  int work;  // tiles * k_blocks (the host checks it fits an int)
  int ctas, k_blocks;
  __host__ __device__ int begin(int c) const { return static_cast<int>(static_cast<int64_t>(work) * c / ctas); }
};

// Device pointers of one device's stream-K scratch: f32 partials [ctas][slot floats] and flags [ctas] (0 = empty;
// every owner clears the flags it consumed, so they are 0 between launches).
struct StreamKWorkspace {
  float* partials;
  int* flags;
};

// The workspace of `device`, allocated once (max_ctas slots of slot_floats) and kept; nullptr partials when it does
// not exist yet and the stream is capturing a graph (the caller then takes another plan). One stream-K launch at a
// time per device: concurrent launches on two streams of one device would share the flags.
StreamKWorkspace streamk_workspace(const char* op, int device, int max_ctas, int64_t slot_floats,
                                   cudaStream_t stream);

#if defined(__CUDA_ARCH__)
__device__ inline int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
#endif

}  // namespace lowbit::cuda::sm90
