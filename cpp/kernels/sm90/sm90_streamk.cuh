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

#include "kernels/sm90/sm90_common.cuh"

namespace lowbit::cuda::sm90 {

// The partition: CTA c of `ctas` covers flattened k blocks [begin(c), begin(c + 1)) of tiles x k_blocks.
struct StreamKSpace {
  int work;  // tiles * k_blocks (the host checks it fits an int)
  int ctas, k_blocks;
  __host__ __device__ int begin(int c) const { return static_cast<int>(static_cast<int64_t>(work) * c / ctas); }
};

// Device pointers of one device's stream-K scratch: 4-byte partials (f32 or s32) [ctas][slot] and flags [ctas] (0 = empty;
// every owner clears the flags it consumed, so they are 0 between launches).
struct StreamKWorkspace {
  float* partials;
  int* flags;
};

// The workspace of (`device`, `stream`), allocated once (max_ctas slots of slot_floats) and kept; nullptr partials
// when it does not exist yet and the stream is capturing a graph (the caller then takes another plan). Launches on
// one stream are ordered, so they never share flags in flight; a graph replays on the scratch of the stream it was
// captured on, so replaying one graph on two streams at once is not supported.
StreamKWorkspace streamk_workspace(const char* op, int device, int max_ctas, int64_t slot_floats,
                                   cudaStream_t stream);

#ifdef LOWBIT_SM90_DEVICE
__device__ inline int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The segment of a CTA's range [beg, pe) that ends at pe: the tile and its first flattened k block ps.
__device__ inline void streamk_segment(const StreamKSpace& sp, int beg, int pe, int& tile, int& ps) {
  tile = (pe - 1) / sp.k_blocks;
  ps = max(beg, tile * sp.k_blocks);
}

// After a segment [ps, pe) of `tile`, in the consumer threads (t = 0..255; kR accumulators each, 4-byte values, Quad
// their 16-byte vector): a segment short of the tile's end leaves its partial in this CTA's slot and raises its flag
// (false: nothing to store); one that ends the tile adds the earlier CTAs' partials, nearest first, if it did not
// start it (true: store the tile). Slots hold [v/4][t] quads (coalesced).
template <class Quad, int kR, class Acc>
__device__ inline bool streamk_fixup(const StreamKSpace& sp, const StreamKWorkspace& ws, int cta, int t, int tile,
                                     int ps, int pe, Acc (&acc)[kR]) {
  constexpr int kSlot = kR / 4 * 256;
  Quad* slots = reinterpret_cast<Quad*>(ws.partials);
  const int tile0 = tile * sp.k_blocks;
  if (pe < tile0 + sp.k_blocks) {
    Quad* dst = slots + static_cast<int64_t>(cta) * kSlot + t;
#pragma unroll
    for (int v = 0; v < kR; v += 4) dst[(v / 4) * 256] = Quad{acc[v], acc[v + 1], acc[v + 2], acc[v + 3]};
    consumer_sync();
    if (t == 0) {
      __threadfence();
      st_release(&ws.flags[cta], 1);
    }
    return false;
  }
  if (ps == tile0) return true;  // the whole tile is this segment's
  int first = cta;
  for (int c = cta - 1; c >= 0 && sp.begin(c + 1) > tile0; --c) first = c;
  if (t == 0)
    for (int c = cta - 1; c >= first; --c)
      if (sp.begin(c) < sp.begin(c + 1))
        while (ld_acquire(&ws.flags[c]) == 0) {
        }
  consumer_sync();
  for (int c = cta - 1; c >= first; --c) {
    if (sp.begin(c) == sp.begin(c + 1)) continue;  // an empty range holds nothing
    const Quad* src = slots + static_cast<int64_t>(c) * kSlot + t;
#pragma unroll
    for (int v = 0; v < kR; v += 4) {
      const Quad q = __ldcg(src + (v / 4) * 256);
      acc[v] += q.x, acc[v + 1] += q.y, acc[v + 2] += q.z, acc[v + 3] += q.w;
    }
  }
  consumer_sync();  // every consumer read them: clear the flags for the next launch
  if (t == 0)
    for (int c = cta - 1; c >= first; --c) ws.flags[c] = 0;
  return true;
}
#endif

}  // namespace lowbit::cuda::sm90
