// How fast the copy engine moves a W4A8 stage's packed weights into shared memory, with no math in the way: each CTA
// streams its own eight 16-row tiles (pack_sm80's [tile][64-k chunk][512 B] layout) over K blocks of 128 k, one stage
// (two chunks of each tile: 8 KB) at a time, through a ring of S stages on full / empty mbarriers; one consumer warp
// waits for each stage and releases it. Three copy kinds for the same bytes and the same smem layout:
//   box3  one 3-D TMA box [128 u32, 2 chunks, 8 tiles]   (what gemm_w4a8_sm90's weight producer issues)
//   box2  one 2-D TMA box [256 u32, 8 tiles] over [tile][k bytes] (1 KB rows)
//   bulk  eight 1-D bulk copies of 1 KB (each tile's two chunks are contiguous)
// Grid: B CTAs per SM (set by the shared memory each asks) on all SMs, or half the SMs at one CTA each (a per-CTA
// rate without DRAM contention). The weight is past L2 (each CTA its own rows). Prints GB/s in total, per SM and per
// CTA, and the us per stage per CTA; the medians of 7 timed launches after 2 warm-ups.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I include -I cpp tools/bench_sm90_weight_copy.cu \
//     -o /tmp/wc && /tmp/wc [K blocks, default 112]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_tool_check.h"
#include "kernels/sm90/sm90_common.cuh"

using namespace lowbit::cuda::sm90;

constexpr int kTiles = 8, kChunkBytes = 512, kStageBytes = kTiles * 2 * kChunkBytes;  // 8 KB

template <int kKind>
__global__ void __launch_bounds__(64) stream_weights(const __grid_constant__ CUtensorMap map3,
                                                     const __grid_constant__ CUtensorMap map2, const uint8_t* w,
                                                     int k_chunks, int blocks, int stages, unsigned* sink) {
#ifdef LOWBIT_SM90_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + stages * kStageBytes);
  uint64_t* empty = full + stages;
  const int tile0 = blockIdx.x * kTiles, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // producer
    for (int b = 0, s = 0, phase = 1; b < blocks; ++b) {
      mbar_wait(&empty[s], phase);
      uint8_t* st = smem + s * kStageBytes;
      mbar_expect_tx(&full[s], kStageBytes);
      if (kKind == 0) {
        tma_load_3d(st, &map3, 0, 2 * b, tile0, &full[s]);
      } else if (kKind == 1) {
        tma_load_2d(st, &map2, 2 * b * (kChunkBytes / 4), tile0, &full[s]);
      } else {
        for (int t = 0; t < kTiles; ++t)
          bulk_load(st + t * 2 * kChunkBytes,
                    w + (static_cast<int64_t>(tile0 + t) * k_chunks + 2 * b) * kChunkBytes, 2 * kChunkBytes, &full[s]);
      }
      if (++s == stages) s = 0, phase ^= 1;
    }
  } else if (threadIdx.x >= 32) {  // consumer warp
    unsigned acc = 0;
    for (int b = 0, s = 0, phase = 0; b < blocks; ++b) {
      mbar_wait(&full[s], phase);
      acc += reinterpret_cast<const unsigned*>(smem + s * kStageBytes)[lane * 64];
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
      if (++s == stages) s = 0, phase ^= 1;
    }
    if (acc == 0x12345678u) sink[blockIdx.x] = acc;  // keeps the reads
  }
#endif
}

CUtensorMap encode(const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                   const cuuint32_t* box) {
  CUtensorMap map;
  const cuuint32_t es[3] = {1, 1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT32, rank, const_cast<void*>(base), dims, strides,
                                    box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 112;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int k_chunks = 2 * blocks, max_ctas = 2 * sms;
  const size_t bytes = static_cast<size_t>(max_ctas) * kTiles * k_chunks * kChunkBytes;
  uint8_t* w = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&w, bytes));
  CK(cudaMemset(w, 1, bytes));
  CK(cudaMalloc(&sink, max_ctas * sizeof(unsigned)));
  const int n_tiles = max_ctas * kTiles;
  const cuuint64_t d3[3] = {kChunkBytes / 4, static_cast<cuuint64_t>(k_chunks), static_cast<cuuint64_t>(n_tiles)};
  const cuuint64_t s3[2] = {kChunkBytes, static_cast<cuuint64_t>(k_chunks) * kChunkBytes};
  const cuuint32_t b3[3] = {kChunkBytes / 4, 2, kTiles};
  const cuuint64_t d2[2] = {static_cast<cuuint64_t>(k_chunks) * kChunkBytes / 4, static_cast<cuuint64_t>(n_tiles)};
  const cuuint64_t s2[1] = {static_cast<cuuint64_t>(k_chunks) * kChunkBytes};
  const cuuint32_t b2[2] = {2 * kChunkBytes / 4, kTiles};
  const CUtensorMap map3 = encode(w, 3, d3, s3, b3), map2 = encode(w, 2, d2, s2, b2);
  std::printf("%d SMs, %d k blocks per CTA (%.1f MB per CTA), weight %.0f MB\n", sms, blocks,
              blocks * kStageBytes / 1e6, bytes / 1e6);
  std::printf("%-5s %6s %6s %5s | %8s %9s %9s %9s\n", "kind", "stages", "per_sm", "ctas", "us", "GB/s", "GB/s/SM",
              "us/stage");
  const char* names[3] = {"box3", "box2", "bulk"};
  for (int kind = 0; kind < 3; ++kind) {
    auto kernel = kind == 0 ? stream_weights<0> : kind == 1 ? stream_weights<1> : stream_weights<2>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    for (const int stages : {4, 8, 12, 16}) {
      for (const int per_sm : {1, 2, 0}) {  // 0: one CTA on half the SMs
        const int need = 1024 + stages * kStageBytes + 16 * stages;
        if (per_sm == 2 && 2 * (need + 1024) > 228 * 1024) continue;
        const int smem = per_sm == 2 ? need : std::max(need, 120 * 1024);  // > half an SM's smem: one CTA per SM
        const int ctas = per_sm == 0 ? sms / 2 : per_sm * sms;
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<float> ms;
        for (int rep = 0; rep < 9; ++rep) {
          CK(cudaEventRecord(a));
          kernel<<<ctas, 64, smem>>>(map3, map2, w, k_chunks, blocks, stages, sink);
          CK(cudaGetLastError());
          CK(cudaEventRecord(b));
          CK(cudaEventSynchronize(b));
          float t = 0;
          CK(cudaEventElapsedTime(&t, a, b));
          if (rep >= 2) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double us = ms[ms.size() / 2] * 1e3, moved = static_cast<double>(ctas) * blocks * kStageBytes;
        const int sms_used = per_sm == 0 ? ctas : sms;
        std::printf("%-5s %6d %6d %5d | %8.1f %9.1f %9.1f %9.3f\n", names[kind], stages, per_sm == 0 ? 1 : per_sm,
                    ctas, us, moved / us / 1e3, moved / us / 1e3 / sms_used, us / blocks);
        CK(cudaEventDestroy(a));
        CK(cudaEventDestroy(b));
      }
    }
  }
  CK(cudaFree(w));
  CK(cudaFree(sink));
  return 0;
}
