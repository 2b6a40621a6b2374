// Hopper (sm_90a) building blocks shared by the wgmma GEMMs (gemm_w8a8_sm90.cu, gemm_w4a8_sm90.cu,
// gemm_w4a16_sm90.cu):
// mbarrier waits and arrivals, TMA tile loads and bulk copies, the wgmma fence/commit/wait and the
// K-major 128B-swizzle shared-memory descriptor (device side, compiled only for sm_90a); the TMA map
// encoder and the split-K cluster size pick (host side).
#pragma once
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda.h>  // CUtensorMap (the encode function is fetched through the runtime; no -lcuda)
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "lowbit/cuda/check.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOWBIT_SM90_DEVICE 1
#endif

namespace lowbit::cuda::sm90 {

#ifdef LOWBIT_SM90_DEVICE
__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ inline void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ inline void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ inline void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Arrive on the barrier at the same smem offset in cluster CTA `cta` (multicast partner).
__device__ inline void mbar_arrive_cluster(uint64_t* bar, int cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta)
      : "memory");
}
// The same arrival with the default (.release.cta) semantics, as CUTLASS's ClusterBarrier::arrive(cta_id) issues it:
// `.release.cluster` above costs a MEMBAR.ALL.GPU before every arrival (SASS), ~0.4 us per stage in the W4A8 pair
// kernel's consumer loop (measured, docs/gpu_notes.md). For releasing a stage whose partner-written bytes this CTA read
// only through wgmma (complete at wgmma.wait_group) before arriving.
__device__ inline void mbar_arrive_remote(uint64_t* bar, int cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta)
      : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// 2-D tile load (coordinates: k byte, row) completing on `bar` with the tile's byte count.
__device__ inline void tma_load_2d(void* dst, const CUtensorMap* map, int c_k, int c_row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c_k), "r"(c_row), "r"(smem_u32(bar))
      : "memory");
}
// 3-D tile load (coordinates c0, c1, c2 in elements of the map's dims) completing on `bar`.
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
// Same, written to the same smem offset in every cluster CTA of `mask` (each one's `bar` gets the bytes).
__device__ inline void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int c_k, int c_row, uint64_t* bar,
                                             uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c_k), "r"(c_row), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from touching accumulators across the asynchronous wgmma window.
template <int R>
__device__ inline void fence_regs(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int R>
__device__ inline void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ inline void fence_regs(uint32_t (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ inline uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (1ull << 62);
}

// The consumers' view of a kernel's stage ring (C: its config, kStages stages of kStageBytes). A position is a stage
// and the parity its full barrier completes with for the running fill g (g % kStages, (g / kStages) & 1), advanced by
// one compare per stage: the W4A8 16-token tile's ring of 10 stages made each `it % kStages` a multiply-high and two
// more uniform instructions, several times a stage. The stage's wgmma descriptor is the ring's first one plus the
// stage offset (addresses stay below 2^18, so the 14-bit address field cannot carry), not a generic-to-shared
// conversion per stage.
struct RingPos {
  int s;
  unsigned parity;
};

template <class C>
struct StageRing {
  uint8_t* smem;
  uint64_t* full;
  uint64_t* empty;
  uint64_t desc0;
  __device__ StageRing(uint8_t* smem_, uint64_t* full_, uint64_t* empty_)
      : smem(smem_), full(full_), empty(empty_), desc0(smem_desc(smem_u32(smem_))) {
    asm("" : "+l"(desc0));  // opaque: kept in registers, not recomputed from the smem base at every stage
  }
  __device__ static RingPos at(int g) { return {g % C::kStages, static_cast<unsigned>(g / C::kStages) & 1u}; }
  __device__ static RingPos next(RingPos r) {
    return r.s + 1 == C::kStages ? RingPos{0, r.parity ^ 1u} : RingPos{r.s + 1, r.parity};
  }
  __device__ static int prev(int s) { return s == 0 ? C::kStages - 1 : s - 1; }
  __device__ uint8_t* stage(int s) const { return smem + s * C::kStageBytes; }
  __device__ uint64_t desc(int s) const { return desc0 + static_cast<uint64_t>(s * (C::kStageBytes >> 4)); }
};

// The accumulator operands of one wgmma: C is the constraint ("+r" s32, "+f" f32).
#define LOWBIT_ACC8(C, d, i) \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define LOWBIT_ACC16(C, d, i) LOWBIT_ACC8(C, d, i), LOWBIT_ACC8(C, d, i + 8)
#define LOWBIT_ACC32(C, d, i) LOWBIT_ACC16(C, d, i), LOWBIT_ACC16(C, d, i + 16)
#define LOWBIT_ACC64(C, d) LOWBIT_ACC32(C, d, 0), LOWBIT_ACC32(C, d, 32)
#define LOWBIT_ACC128(C, d) \
  LOWBIT_ACC32(C, d, 0), LOWBIT_ACC32(C, d, 32), LOWBIT_ACC32(C, d, 64), LOWBIT_ACC32(C, d, 96)
#define LOWBIT_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define LOWBIT_REGS32                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LOWBIT_REGS64                                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "     \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, " \
  "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
  "%61, %62, %63}"
#define LOWBIT_REGS128                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "     \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, " \
  "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
  "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, " \
  "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "      \
  "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, "     \
  "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// Barrier of the two consumer warpgroups only (id 1; 0 is __syncthreads').
__device__ inline void consumer_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// Unsplit f16 epilogue of the weight-stationary GEMMs: each consumer lane writes its accumulators, as value(v)
// gives them in f16 (scales applied there), to a [token][row] tile in the idle pipeline smem (kRows + 8 halves per
// token: conflict-free), then the consumer warps copy y's rows out in 16-byte segments (scalar at the n edge or
// when y's rows are not 16-byte aligned). Accumulator v of lane `lane` in warp gw is weight row gw*16 + lane/4
// (+8 when v%4 >= 2) and token (v/4)*8 + 2*(lane%4) + v%2 (the wgmma layout).
template <int kRows, int kTokens, int kConsumerWarps, class Value>
__device__ inline void store_rows_through_smem(uint8_t* smem, __half* y, int64_t ldy, int m, int n, int m0, int n0,
                                               int gw, int lane, bool vector_y, const Value& value) {
  constexpr int kOutRow = kRows + 8;
  __half* out = reinterpret_cast<__half*>(smem);
  consumer_sync();  // both warpgroups' wgmmas have completed: the pipeline smem is free
#pragma unroll
  for (int v = 0; v < kTokens / 2; ++v) {
    const int row = gw * 16 + (lane >> 2) + ((v >> 1) & 1) * 8, token = (v >> 2) * 8 + (lane & 3) * 2 + (v & 1);
    out[token * kOutRow + row] = value(v, token);
  }
  consumer_sync();
  for (int u = gw * 32 + lane; u < kTokens * (kRows / 8); u += kConsumerWarps * 32) {
    const int token = u / (kRows / 8), col = (u % (kRows / 8)) * 8;
    const int mi = m0 + token, ni = n0 + col;
    if (mi >= m || ni >= n) continue;
    const __half* src = out + token * kOutRow + col;
    __half* dst = y + static_cast<int64_t>(mi) * ldy + ni;
    if (vector_y && ni + 8 <= n) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && ni + e < n; ++e) dst[e] = src[e];
    }
  }
}

// Split-K epilogue of the weight-stationary GEMMs (gemm_w4a8_sm90.cu, gemm_w4a16_sm90.cu): the `split` CTAs of a
// cluster along z each hold a partial 128-row x (2 kR)-token tile in kConsumerWarps consumer warps (wgmma
// accumulator layout, kR values per lane). Split rank j reduces rows [j, j+1) * 128/split: slot r of CTA j
// receives rank r's partial of that slice as [warp in slice][v/4][lane] quads (the pipeline smem is idle by
// then), summed in rank order (the same sums every run); store(warp, lane, v, quad) writes accumulators v..v+3
// of that warp's lane. Consumer threads call it; the producer warpgroup joins its two cluster barriers on its own.
template <int kConsumerWarps, class Quad, int kR, class Acc, class Store>
__device__ inline void reduce_split_k(uint8_t* smem, int gw, int lane, int rank, int split, const Acc (&acc)[kR],
                                      const Store& store) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int slice_warps = kConsumerWarps / split;
  constexpr int kWarpAccs = kR * 32;
  Quad* slots = reinterpret_cast<Quad*>(smem);
  cluster.sync();  // every CTA's pipeline smem is idle
  const int j = gw / slice_warps, lw = gw % slice_warps;
  Quad* dst = cluster.map_shared_rank(slots, j) + ((rank * slice_warps + lw) * kWarpAccs) / 4 + lane;
#pragma unroll
  for (int v = 0; v < kR; v += 4) dst[(v / 4) * 32] = Quad{acc[v], acc[v + 1], acc[v + 2], acc[v + 3]};
  cluster.sync();  // all partials have landed
  const int slice_quads = slice_warps * kWarpAccs / 4;
  for (int u = gw * 32 + lane; u < slice_quads; u += kConsumerWarps * 32) {
    Quad sum = slots[u];
    for (int r = 1; r < split; ++r) {
      const Quad c = slots[r * slice_quads + u];
      sum.x += c.x, sum.y += c.y, sum.z += c.z, sum.w += c.w;
    }
    store(rank * slice_warps + u / (kWarpAccs / 4), u % 32, ((u % (kWarpAccs / 4)) / 32) * 4, sum);
  }
}

// L2 prefetches (no shared memory, no barrier): the 3-D box a later tma_load_3d reads, and `bytes` (a multiple of 16,
// 16-byte aligned) from src, so that the later copy finds them in L2 instead of DRAM.
__device__ inline void tma_prefetch_3d(const CUtensorMap* map, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ inline void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(reinterpret_cast<uint64_t>(src)), "r"(bytes)
               : "memory");
}

// 1-D bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) completing on `bar`.
__device__ inline void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
#endif  // LOWBIT_SM90_DEVICE

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    return (e == cudaSuccess && q == cudaDriverEntryPointSuccess) ? reinterpret_cast<EncodeTiled>(f) : nullptr;
  }();
  return fn;
}

// Row-major [rows, k] of `elem_bytes`-byte elements (rows `ld_bytes` apart, a multiple of 16) as
// 128-byte x box_rows boxes (the k extent a 128B swizzle row holds), zero fill out of bounds.
inline CUtensorMap make_map_2d(const char* op, const void* base, CUtensorMapDataType type, int elem_bytes, int rows,
                               int k, int64_t ld_bytes, int box_rows) {
  const EncodeTiled fn = encode_tiled();
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, fn != nullptr, op, ": cuTensorMapEncodeTiled is not available");
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / elem_bytes), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = fn(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (", static_cast<int>(r),
                    ") for rows=", rows, " k=", k);
  return map;
}
// A packed weight [n_tiles][k_chunks][chunk_bytes] (pack_sm80's tile-major layout) as boxes of
// `tiles` consecutive 16-row tiles x `chunks` consecutive k chunks, landing in smem as
// [tile][chunk][chunk_bytes]: one TMA per stage instead of one bulk copy per tile (tiles past the
// matrix read as zeros).
inline CUtensorMap make_packed_weight_map(const char* op, const uint8_t* base, int n_tiles, int k_chunks,
                                          int chunk_bytes, int tiles, int chunks) {
  const EncodeTiled fn = encode_tiled();
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, fn != nullptr, op, ": cuTensorMapEncodeTiled is not available");
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(chunk_bytes / 4), static_cast<cuuint64_t>(k_chunks),
                              static_cast<cuuint64_t>(n_tiles)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(chunk_bytes),
                                 static_cast<cuuint64_t>(k_chunks) * static_cast<cuuint64_t>(chunk_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(chunk_bytes / 4), static_cast<cuuint32_t>(chunks),
                             static_cast<cuuint32_t>(tiles)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = fn(&map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, const_cast<uint8_t*>(base), dims, strides, box,
                        elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (", static_cast<int>(r),
                    ") for the packed weight: tiles=", n_tiles, " chunks=", k_chunks);
  return map;
}
// 8-bit activations (s8 or e4m3 bytes), rows `ld` bytes apart.
inline CUtensorMap make_map(const char* op, const int8_t* base, int rows, int k, int64_t ld, int box_rows) {
  return make_map_2d(op, base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, k, ld, box_rows);
}

// Launch facts cached per device (occupancy, and the raised shared-memory limit they need): a kernel's attributes
// belong to one device, and tensor-parallel ranks launch the same kernel on several, each from its own thread.
// Devices past kCachedDevices are measured at every call.
constexpr int kCachedDevices = 64;
using DeviceSlots = std::atomic<int>[kCachedDevices][4];
using DeviceCounts = std::atomic<int>[kCachedDevices];

inline int current_device(const char* op) {
  int device = 0;
  LOWBIT_CUDA_CHECK(op, cudaGetDevice(&device));
  return device;
}

// CTAs of `kernel` resident at once when launched in clusters of 1, 2, 4 and 8 CTAs along z (a cluster must
// fit in one GPC), measured once per kernel instantiation and device into `cache` (cfg: the launch's block size and
// smem; the kernel's shared-memory limit already raised on this device).
template <class Kernel>
void resident_ctas_per_split(const char* op, Kernel kernel, cudaLaunchConfig_t cfg, DeviceSlots& cache,
                             int (&slots)[4]) {
  const int device = current_device(op);
  std::atomic<int> uncached[4] = {};
  std::atomic<int>* row = device < kCachedDevices ? cache[device] : uncached;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  for (int i = 0, s = 1; i < 4; ++i, s *= 2) {
    slots[i] = row[i].load();
    if (slots[i] == 0) {
      cfg.gridDim = dim3(8, 1, s);
      attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = s;
      int clusters = 0;
      LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
      slots[i] = std::max(1, clusters) * s;
      row[i].store(slots[i]);
    }
  }
}

// resident_ctas_per_split for a kernel of `threads` threads and `smem` dynamic shared bytes (raising the kernel's
// shared-memory limit first: the occupancy query needs it).
template <class Kernel>
void resident_slots(const char* op, Kernel kernel, int threads, int smem, DeviceSlots& cache, int (&slots)[4]) {
  const int device = current_device(op);
  if (device >= kCachedDevices || cache[device][3].load() == 0)
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  resident_ctas_per_split(op, kernel, cfg, cache, slots);
}

// CTAs of `kernel` (`threads` threads, `smem` dynamic shared bytes) resident at once on the current device: the
// occupancy per SM x the SMs, at least 1, measured once per device into `cache` (the grid of a persistent or stream-K
// launch). Raises the kernel's shared-memory limit on the device first, which its launches rely on.
template <class Kernel>
int resident_ctas(const char* op, Kernel kernel, int threads, int smem, DeviceCounts& cache) {
  const int device = current_device(op);
  int v = device < kCachedDevices ? cache[device].load() : 0;
  if (v == 0) {
    LOWBIT_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0, sms = 0;
    LOWBIT_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    LOWBIT_CUDA_CHECK(op, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    v = std::max(1, per_sm * sms);
    if (device < kCachedDevices) cache[device].store(v);
  }
  return v;
}

// Launches `kernel` (cfg: block size, smem, stream) on a (tiles_m, tiles_n, split) grid in clusters of `split` CTAs
// along z: the split-K partners of one output tile, which reduce through distributed shared memory. `n` (the output
// width the tiles_n tiles cover) names the problem when the grid cannot hold it. Kernels that walk a linear tile
// range (W4A16, W4A8: two-launch plans) pass their range's length as tiles_m and tiles_n = 1. pdl: as a programmatic
// dependent of the kernel before it on the stream (cuda/pdl.cuh; the kernel waits before it reads that one's output).
template <class Kernel, class... Args>
void launch_split_clusters(const char* op, cudaLaunchConfig_t cfg, Kernel kernel, int64_t n, int tiles_m, int tiles_n,
                           int split, bool pdl, const Args&... args) {
  LOWBIT_CHECK(tiles_n <= 65535, op, ": n=", n, " is too large for the sm90 kernel's grid");
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = static_cast<unsigned>(split);
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  cfg.gridDim = dim3(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n), static_cast<unsigned>(split));
  LOWBIT_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, args...));
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

// Whether `device` is an sm_90 whose driver encodes tensor maps and this library holds the sm_90a image of
// `kernel` (asked once per device into `cache`: 0 unknown, 1 yes, 2 no).
template <class Kernel>
bool kernel_usable_on(const char* op, int device, Kernel kernel, std::atomic<int> (&cache)[64]) {
  if (device < 0 || device >= 64) return false;
  int v = cache[device].load();
  if (v == 0) {
    int major = 0, minor = 0;
    LOWBIT_CUDA_CHECK(op, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LOWBIT_CUDA_CHECK(op, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    bool ok = major == 9 && minor == 0 && encode_tiled() != nullptr;
    if (ok) {
      cudaFuncAttributes fa{};
      ok = cudaFuncGetAttributes(&fa, kernel) == cudaSuccess;
      (void)cudaGetLastError();  // a missing image is an answer here, not an error to keep
    }
    v = ok ? 1 : 2;
    cache[device].store(v);
  }
  return v == 1;
}

// Split-K factor (cluster size): fewest waves x k blocks per CTA, plus a fixed cost per tile and
// for the cross-CTA reduction (in units of k blocks; rough).
inline int pick_split(int tiles, int k_blocks, const int (&slots)[4]) {
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int i = 0, s = 1; i < 4; ++i, s *= 2) {
    if (s > k_blocks || slots[i] <= 0) break;
    const int64_t waves = (static_cast<int64_t>(tiles) * s + slots[i] - 1) / slots[i];
    const int64_t cost = waves * ((k_blocks + s - 1) / s + 2 + (s > 1 ? 3 : 0));
    if (cost < best_cost) best_cost = cost, best = s;
  }
  return best;
}

// The small token tiles (two CTAs per SM) of the weight-stationary GEMMs, and the one a free plan takes for m tokens
// (up to kSmallAutoMaxTokens; above, the 128 / 256-token plans).
constexpr int kSmallAutoMaxTokens = 64;
inline bool is_small_tile(int tokens) { return tokens == 16 || tokens == 32 || tokens == 64; }
inline int small_tile_for(int m) { return m <= 16 ? 16 : m <= 32 ? 32 : 64; }

// A caller's pinned split (0 = free, else 1, 2, 4, 8) and tokens per tile (0 = free, else 128, 256; with
// small_tiles also 16, 32, 64).
inline void check_tile_split_choice(const char* op, int split, int tokens, bool small_tiles = false) {
  LOWBIT_CHECK(split == 0 || split == 1 || split == 2 || split == 4 || split == 8, op,
               ": the sm90 split must be 0, 1, 2, 4 or 8, got ", split);
  const bool small = small_tiles && is_small_tile(tokens);
  LOWBIT_CHECK(tokens == 0 || tokens == 128 || tokens == 256 || small, op, ": the sm90 tokens per tile must be 0, ",
               small_tiles ? "16, 32, 64, " : "", "128 or 256, got ", tokens);
}

// Tokens per tile (wgmma n: 128 or 256) and split-K cluster size of the weight-stationary GEMMs (W4A16, W4A8):
// the fewest microseconds by a rough cost model fitted to measured timings (docs/benchmarks_gpu.md, issue 15 third
// round), per CTA: k_blocks/split blocks at c128 or c256 us each (a 256-token block costs less than two 128-token ones:
// the dequantized fragment feeds twice the tokens), a fixed cost, and for split > 1 the cluster reduction
// (proportional to the partial tile's size); times the waves of resident CTAs (slots per split, measured for each
// tile's kernel). At few tiles (M <= 256 on 4096-wide layers) the 128-token tile doubles the CTAs; forced_tokens /
// forced_split (0 = free) pin either. A free split stays <= 4: cluster size 8 was never measured to win.
// A free split may also be a two-launch plan: `head` whole waves of unsplit tiles first, then the remaining tiles
// (fewer than a wave) split to fill the last wave (qkv at M = 1024: 192 tiles of 256 tokens on 132 SMs run as 132
// unsplit, then 60 x split 2, instead of a second wave with 72 SMs idle); gap is the second launch's cost.
struct TileCosts {
  double c128, c256, fixed, reduce128, gap = 2.0;
};
struct TilePlan {
  int tokens, split;
  int head = 0;  // tiles of the first, unsplit launch (0: one launch of all tiles at `split`)
};
inline TilePlan pick_tile_split(int tiles_n, int m, int k_blocks, const int (&slots128)[4], const int (&slots256)[4],
                                const TileCosts& c, int forced_tokens, int forced_split) {
  TilePlan best{256, 1};
  double best_cost = 1e300;
  for (const int bt : {128, 256}) {
    if (forced_tokens != 0 && bt != forced_tokens) continue;
    const int(&slots)[4] = bt == 128 ? slots128 : slots256;
    const int64_t tiles = static_cast<int64_t>(tiles_n) * ((m + bt - 1) / bt);
    for (int i = 0, s = 1; i < 4; ++i, s *= 2) {
      if (forced_split != 0 ? s != forced_split : s > 4) continue;
      if (s > k_blocks || slots[i] <= 0) continue;
      const int64_t waves = (tiles * s + slots[i] - 1) / slots[i];
      const double per_cta = (k_blocks + s - 1) / s * (bt == 128 ? c.c128 : c.c256) + c.fixed +
                             (s > 1 ? c.reduce128 * bt / 128 : 0.0);
      const double cost = static_cast<double>(waves) * per_cta;
      if (cost < best_cost) best_cost = cost, best = {bt, s, 0};
      // Whole unsplit waves, then the rest split s within one wave.
      const int64_t head = tiles / slots[0] * slots[0], rest = tiles - head;
      if (forced_split != 0 || s == 1 || head == 0 || rest == 0 || rest * s > slots[i]) continue;
      const double unsplit = k_blocks * (bt == 128 ? c.c128 : c.c256) + c.fixed;
      const double two = static_cast<double>(head / slots[0]) * unsplit + per_cta + c.gap;
      if (two < best_cost) best_cost = two, best = {bt, s, static_cast<int>(head)};
    }
  }
  if (forced_split != 0 && best_cost == 1e300) {  // a forced split over k_blocks: the largest that fits
    best.tokens = forced_tokens != 0 ? forced_tokens : (m <= 128 ? 128 : 256);
    best.split = forced_split;
    while (best.split > k_blocks) best.split /= 2;
  }
  return best;
}

// The small token tiles' split (16 / 32 / 64 tokens, two CTAs per SM; the W4A8 and W4A16 kernels): per CTA, its k
// blocks at the slower of the per-CTA block time (block_us with one CTA alone on its SM, shared by the CTAs of an SM)
// and the active CTAs' share of DRAM (block_bytes each), a fixed cost, and the cluster reduction per doubling of the
// split, times the waves of resident CTAs (slots per split 1, 2, 4, 8). forced_split 0 = free; a forced split past
// k_blocks: the largest that fits.
struct SmallTileCosts {
  double block_us, block_bytes, dram_bytes_per_us, fixed, reduce;
};
inline int pick_small_split(int64_t tiles, int k_blocks, const int (&slots)[4], int ctas_per_sm,
                            const SmallTileCosts& c, int forced_split) {
  const double sms = std::max(1, slots[0] / ctas_per_sm);
  int best = forced_split != 0 ? forced_split : 1;
  double best_cost = 1e300;
  for (int i = 0, s = 1; i < 4; ++i, s *= 2) {
    if ((forced_split != 0 && s != forced_split) || s > k_blocks || slots[i] <= 0) continue;
    const int64_t ctas = tiles * s, waves = (ctas + slots[i] - 1) / slots[i];
    const double active = static_cast<double>(std::min<int64_t>(ctas, slots[i]));
    const double per_block =
        std::max(c.block_us * std::max(1.0, active / sms), active * c.block_bytes / c.dram_bytes_per_us);
    const double per_cta = (k_blocks + s - 1) / s * per_block + c.fixed + i * c.reduce;
    const double cost = static_cast<double>(waves) * per_cta;
    if (cost < best_cost) best_cost = cost, best = s;
  }
  while (best > k_blocks && best > 1) best /= 2;
  return best;
}

}  // namespace lowbit::cuda::sm90
