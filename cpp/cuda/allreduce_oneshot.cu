// The one-shot all-reduce kernel (cuda/allreduce_oneshot.h says the protocol and why it is safe).
#include <algorithm>
#include <type_traits>

#include "cuda/allreduce_oneshot.cuh"
#include "cuda/float_io.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 256;

// One element as f32, read from L2 (peer staging is read once per step; L1 could hold a line of step e-2).
__device__ __forceinline__ float load_cg_f32(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float load_cg_f32(const __half* p) {
  return __half2float(__ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}
__device__ __forceinline__ float load_cg_f32(const __nv_bfloat16* p) {
  return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(OneShotArgs a, T* data, int64_t n, int64_t chunk) {
  constexpr int kVec = Pack<T>::kVec;
  __shared__ uint32_t s_step;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {  // only block b of this rank touches counters[b]; kernels on a stream run in order
    const uint32_t e = a.counters[b] + 1;
    a.counters[b] = e;
    s_step = e;
  }
  __syncthreads();
  const uint32_t step = s_step;
  const int64_t slot = (step & 1u) * a.capacity + int64_t(b) * (a.capacity / a.max_blocks);
  const int64_t begin = int64_t(b) * chunk;
  const int count = int(max(int64_t(0), min(n, begin + chunk) - begin));  // <= a slot: int indices below
  T* io = data + begin;
  // chunk is a multiple of kVec, so the block's input is 16-byte aligned whenever data is
  const int packs = (reinterpret_cast<uintptr_t>(data) % 16 == 0) ? count / kVec : 0;

  // 1. stage this rank's chunk
  T* mine = reinterpret_cast<T*>(static_cast<char*>(a.staging[a.rank]) + slot);
  for (int p = threadIdx.x; p < packs; p += kThreads)
    reinterpret_cast<uint4*>(mine)[p] = reinterpret_cast<const uint4*>(io)[p];
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;  // raw copy (__half's operator= spills)
  for (int i = packs * kVec + threadIdx.x; i < count; i += kThreads)
    reinterpret_cast<Bits*>(mine)[i] = reinterpret_cast<const Bits*>(io)[i];
  __syncthreads();  // the whole chunk is staged before any thread signals

  // 2. thread q signals peer q, then waits for peer q's signal (acquire), for every peer
  const int q = threadIdx.x;
  if (q < a.world && q != a.rank) {
    __threadfence_system();  // the block's staging stores (ordered before by the barrier) before the flag
    store_release_sys(a.flags[q] + b * kOneShotMaxWorld + a.rank, step);
    const uint32_t* flag = a.flags[a.rank] + b * kOneShotMaxWorld + q;
    // The peer may already be one step further (its flag = step + 1): compare by signed distance (wraps safely).
    for (uint32_t spins = 1; int32_t(load_acquire_sys(flag) - step) < 0; ++spins)
      if ((spins & 1023u) == 0 && *a.abort) break;  // the group failed: leave garbage instead of hanging
  }
  __syncthreads();  // every peer's chunk is visible to the whole block

  // 3. sum every rank's staged chunk in rank order, f32 accumulation, one rounding
  // (loops over ranks unrolled to kOneShotMaxWorld with static indices: no local-memory copy of the pointers)
  for (int p = threadIdx.x; p < packs; p += kThreads) {
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
#pragma unroll
    for (int r = 0; r < kOneShotMaxWorld; ++r)
      if (r < a.world)
        Pack<T>::add(__ldcg(reinterpret_cast<const uint4*>(static_cast<const char*>(a.staging[r]) + slot) + p), acc);
    reinterpret_cast<uint4*>(io)[p] = Pack<T>::round(acc);
  }
  for (int i = packs * kVec + threadIdx.x; i < count; i += kThreads) {
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < kOneShotMaxWorld; ++r)
      if (r < a.world)
        acc += load_cg_f32(reinterpret_cast<const T*>(static_cast<const char*>(a.staging[r]) + slot) + i);
    store_f32(io + i, acc);
  }
}

// Blocks and elements per block for n elements of `elem` bytes: one 16-byte pack per thread until max_blocks.
void plan(const OneShotArgs& a, int64_t n, int elem, int* blocks, int64_t* chunk) {
  const int vec = 16 / elem;
  const int64_t packs = (n + vec - 1) / vec;
  *blocks = int(std::min<int64_t>(a.max_blocks, std::max<int64_t>(1, (packs + kThreads - 1) / kThreads)));
  *chunk = (packs + *blocks - 1) / *blocks * vec;
}

}  // namespace

int64_t oneshot_max_message_bytes(const OneShotArgs& a) {
  // every block's chunk (whole 16-byte packs) must fit its slot of capacity / max_blocks bytes
  return (a.capacity / a.max_blocks / 16) * 16 * a.max_blocks;
}

void oneshot_all_reduce(const OneShotArgs& a, void* data, int64_t n, ScalarType dtype, cudaStream_t stream) {
  constexpr const char* op = "oneshot_all_reduce";
  LOWBIT_CHECK(a.world >= 2 && a.world <= kOneShotMaxWorld && a.rank >= 0 && a.rank < a.world, op,
               ": bad group (rank ", a.rank, " of ", a.world, ")");
  LOWBIT_CHECK(a.max_blocks >= 1 && a.max_blocks <= kOneShotMaxBlocks && a.capacity / a.max_blocks >= 16 * kThreads,
               op, ": bad staging layout (", a.capacity, " bytes, ", a.max_blocks, " blocks)");
  if (n == 0) return;
  const int elem = float_bytes(dtype);
  LOWBIT_CHECK(n > 0 && n * elem <= oneshot_max_message_bytes(a), op, ": ", n, " elements exceed the staging (",
               oneshot_max_message_bytes(a), " bytes)");
  int blocks = 1;
  int64_t chunk = 0;
  plan(a, n, elem, &blocks, &chunk);
  dispatch_float(dtype, op, [&](auto tag) {
    using T = decltype(tag);
    oneshot_kernel<T><<<blocks, kThreads, 0, stream>>>(a, static_cast<T*>(data), n, chunk);
  });
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
