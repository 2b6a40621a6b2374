// What one int8 wgmma costs on an SM when nothing else runs: m64nNk32 s8 x s8 -> s32 with the A operand from
// registers (RS: how gemm_w4a8_sm90 feeds its dequantized weights) or from shared memory (SS), N = 16 / 64 / 128 / 256,
// with 1, 2 or 4 warpgroups per SM (one CTA of 128 threads each, several CTAs per SM), each issuing groups of four
// wgmmas on one accumulator set and keeping one group in flight (wait_group 1), as the W4A8 consumer loop does.
// Prints the SM's cycles per wgmma and the s8 MACs per cycle per SM; the operands' values do not matter for time.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I include -I cpp tools/bench_sm90_wgmma_issue.cu \
//     -o /tmp/wi && /tmp/wi
#include <cstdio>
#include <cstdlib>

#include "cuda_tool_check.h"
#include "kernels/sm90/sm90_common.cuh"

using namespace lowbit::cuda::sm90;

#ifdef LOWBIT_SM90_DEVICE
template <int N, bool kRs>
__device__ inline void mma(int (&d)[N / 2], const uint32_t (&a)[4], uint64_t da, uint64_t db);

#define DEF_MMA(NN, REGS, ACCN, BASE)                                                                            \
  template <>                                                                                                    \
  __device__ inline void mma<NN, true>(int (&d)[NN / 2], const uint32_t (&a)[4], uint64_t, uint64_t db) {        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #NN "k32.s32.s8.s8 " REGS ", {%" #BASE ", %" BASE1(BASE)    \
                 ", %" BASE2(BASE) ", %" BASE3(BASE) "}, %" BASE4(BASE) ", p;\n}\n"                              \
                 : ACCN("+r", d)                                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                        \
  }                                                                                                              \
  template <>                                                                                                    \
  __device__ inline void mma<NN, false>(int (&d)[NN / 2], const uint32_t (&)[4], uint64_t da, uint64_t db) {     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #NN "k32.s32.s8.s8 " REGS ", %" #BASE ", %" BASE1(BASE)     \
                 ", p;\n}\n"                                                                                     \
                 : ACCN("+r", d)                                                                                 \
                 : "l"(da), "l"(db));                                                                            \
  }
#define BASE1(b) BASE1_##b
#define BASE2(b) BASE2_##b
#define BASE3(b) BASE3_##b
#define BASE4(b) BASE4_##b
#define BASE1_8 "9"
#define BASE2_8 "10"
#define BASE3_8 "11"
#define BASE4_8 "12"
#define BASE1_32 "33"
#define BASE2_32 "34"
#define BASE3_32 "35"
#define BASE4_32 "36"
#define BASE1_64 "65"
#define BASE2_64 "66"
#define BASE3_64 "67"
#define BASE4_64 "68"
#define BASE1_128 "129"
#define BASE2_128 "130"
#define BASE3_128 "131"
#define BASE4_128 "132"
#define ACC_8(C, d) LOWBIT_ACC8(C, d, 0)
#define ACC_32(C, d) LOWBIT_ACC32(C, d, 0)
#define REGS8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
DEF_MMA(16, REGS8, ACC_8, 8)
DEF_MMA(64, LOWBIT_REGS32, ACC_32, 32)
DEF_MMA(128, LOWBIT_REGS64, LOWBIT_ACC64, 64)
DEF_MMA(256, LOWBIT_REGS128, LOWBIT_ACC128, 128)
#endif

template <int N, bool kRs>
__global__ void __launch_bounds__(128) wgmma_loop(int iters, long long* cycles, int* sink) {
#ifdef LOWBIT_SM90_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // A (64 x 128 B) then B (N x 128 B)
  for (int i = threadIdx.x; i < (64 + N) * 128 / 4; i += blockDim.x) reinterpret_cast<int*>(smem)[i] = i * 2654435761u;
  __syncthreads();
  const uint64_t da = smem_desc(smem_u32(smem)), db = smem_desc(smem_u32(smem + 64 * 128));
  uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  int d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0;
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) mma<N, kRs>(d, a, da + 2 * j, db + 2 * j);
    wgmma_commit();
    wgmma_wait<1>();
    a[0] += 1;  // the next group's A registers change, as the consumer's next stage does
  }
  wgmma_wait<0>();
  const long long t1 = clock64();
  int s = 0;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += d[i];
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if (s == 0x7654321) sink[blockIdx.x] = s;
#endif
}

template <int N, bool kRs>
void run(int sms, int per_sm, long long* cycles, int* sink) {
  const int iters = 2000, smem = 1024 + (64 + N) * 128;
  // one CTA per SM slot: ask enough shared memory that at most per_sm CTAs fit an SM
  const int ask = std::max(smem, 220 * 1024 / per_sm - 2048);
  auto k = wgmma_loop<N, kRs>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  k<<<sms * per_sm, 128, ask>>>(iters, cycles, sink);  // warm-up
  CK(cudaGetLastError());
  k<<<sms * per_sm, 128, ask>>>(iters, cycles, sink);
  CK(cudaDeviceSynchronize());
  long long c = 0;
  CK(cudaMemcpy(&c, cycles, sizeof(c), cudaMemcpyDeviceToHost));
  const double per_wgmma_sm = static_cast<double>(c) / (iters * 4.0 * per_sm);  // SM cycles per wgmma
  std::printf("n%-4d %s  warpgroups/SM %d | %7.1f SM cycles per wgmma | %7.0f MACs per cycle per SM\n", N,
              kRs ? "RS" : "SS", per_sm, per_wgmma_sm, 64.0 * N * 32 / per_wgmma_sm);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* cycles = nullptr;
  int* sink = nullptr;
  CK(cudaMalloc(&cycles, 4 * sms * sizeof(long long)));
  CK(cudaMalloc(&sink, 4 * sms * sizeof(int)));
  for (const int per_sm : {1, 2, 4}) {
    run<16, true>(sms, per_sm, cycles, sink);
    run<16, false>(sms, per_sm, cycles, sink);
    run<64, true>(sms, per_sm, cycles, sink);
    run<64, false>(sms, per_sm, cycles, sink);
    run<128, true>(sms, per_sm, cycles, sink);
    run<128, false>(sms, per_sm, cycles, sink);
    run<256, true>(sms, per_sm, cycles, sink);
    run<256, false>(sms, per_sm, cycles, sink);
  }
  return 0;
}
