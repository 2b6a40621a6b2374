// Plain f16 GEMM for w16a16: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias), f32 accumulation. Three kernels:
//  - mma (gemm_f16_mma_sm80.cu): mma.sync with a cp.async ring, the default for every m >= 2 whose x and
//    w rows start 16-byte aligned (row stride % 8 == 0, aligned base): any m, n, k otherwise.
//  - GEMV (here): m == 1, one warp per output column streaming its weight row once (~80% of the
//    weight-bandwidth floor at batch 1). Its cost is NOT flat in m: per 16-byte weight load each lane
//    re-loads m 16-byte x vectors (every one of the n warps reads all of x: m times the weight bytes
//    through L1/L2) and issues 8m FFMA + 8m f16->f32 conversions, so from m ~ 4 the SM issue rate and
//    L1 bandwidth, not DRAM, set its speed (41.8 ms for the 8B step at batch 16 against 7.7 at 1).
//    The mma kernel reads x once per block from smem and does 16 x 8 x 16 MACs per instruction, so it
//    stays on the bandwidth floor up to m = 64; the GEMV is kept only for m == 1 (where the mma
//    kernel's 32-token tile would waste 31/32 of its mma and add a split-K pass) and as the m <= 16
//    fallback for misaligned rows.
//  - wmma (here): 64 x 64 tiles, 4 warps, synchronous loads, element-wise edges: the fallback for
//    misaligned rows (k % 8 != 0 contiguous, odd strides) at m > 16.
// F16GemmKernel::gemv|wmma|mma (a plan names one; kernel_overrides force one) picks it; a named gemv
// runs 16-row slices for larger m; a named mma on misaligned rows throws NotSupported.
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/sm80/gemm_f16_mma_sm80.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

namespace wmma = nvcuda::wmma;
constexpr int kBM = 64, kBN = 64, kBK = 32, kPad = 8, kLd = kBK + kPad, kThreads = 128, kCLd = kBN + 4;

struct F16GemmArgs {
  const __half* x;
  const __half* w;
  const __half* bias;
  __half* y;
  int64_t ldx, ldw, ldy;
  int m, n, k;
  bool x_vec, w_vec;  // rows 16-byte aligned: 8-element vector loads allowed
};

// Copies a kRows x kBK tile of a row-major [rows, k] matrix into smem, zero past its edges.
__device__ __forceinline__ void load_tile(__half (*dst)[kLd], const __half* src, int64_t ld, int row0, int rows,
                                          int k0, int k, bool vec) {
  for (int c = threadIdx.x; c < kBM * kBK / 8; c += kThreads) {
    const int r = c / (kBK / 8), kc = (c % (kBK / 8)) * 8;
    const int gr = row0 + r, gk = k0 + kc;
    __half* d = &dst[r][kc];
    if (gr < rows && vec && gk + 8 <= k) {
      *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(gr) * ld + gk);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) d[e] = gr < rows && gk + e < k ? src[static_cast<int64_t>(gr) * ld + gk + e] : __float2half(0.f);
    }
  }
}

__global__ void __launch_bounds__(kThreads) gemm_f16_kernel(F16GemmArgs p) {
  __shared__ __align__(32) union {
    struct {
      __half a[kBM][kLd];
      __half b[kBN][kLd];
    } in;
    float c[kBM][kCLd];
  } smem;
  const int warp = threadIdx.x / 32, wm = (warp / 2) * 32, wn = (warp % 2) * 32;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int k0 = 0; k0 < p.k; k0 += kBK) {
    load_tile(smem.in.a, p.x, p.ldx, m0, p.m, k0, p.k, p.x_vec);
    load_tile(smem.in.b, p.w, p.ldw, n0, p.n, k0, p.k, p.w_vec);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];  // w rows = columns of wᵀ
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &smem.in.a[wm + 16 * i][kk], kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &smem.in.b[wn + 16 * j][kk], kLd);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&smem.c[wm + 16 * i][wn + 16 * j], acc[i][j], kCLd, wmma::mem_row_major);
  __syncthreads();
  for (int e = threadIdx.x; e < kBM * kBN; e += kThreads) {
    const int r = e / kBN, c = e % kBN, gr = m0 + r, gc = n0 + c;
    if (gr >= p.m || gc >= p.n) continue;
    float v = smem.c[r][c];
    if (p.bias) v += __half2float(p.bias[gc]);
    p.y[static_cast<int64_t>(gr) * p.ldy + gc] = __float2half_rn(v);
  }
}

constexpr int kGemvMaxM = 16, kGemvWarps = 4;

// One warp per output column c: lanes stride over k (8 halves per 16-byte load where rows allow it,
// then a scalar tail), f32 partial sums for every row, one warp reduction per row.
__global__ void __launch_bounds__(32 * kGemvWarps) gemv_f16_kernel(F16GemmArgs p) {
  const int lane = threadIdx.x % 32;
  const int c = blockIdx.x * kGemvWarps + threadIdx.x / 32;
  if (c >= p.n) return;
  const __half* w = p.w + c * p.ldw;
  float acc[kGemvMaxM];
#pragma unroll
  for (int r = 0; r < kGemvMaxM; ++r) acc[r] = 0.f;
  const int kv = p.x_vec && p.w_vec ? p.k / 8 : 0;
  for (int v = lane; v < kv; v += 32) {
    const uint4 wq = *reinterpret_cast<const uint4*>(w + 8 * v);
    const __half2* wh = reinterpret_cast<const __half2*>(&wq);
#pragma unroll
    for (int r = 0; r < kGemvMaxM; ++r) {
      if (r >= p.m) break;
      const uint4 xq = *reinterpret_cast<const uint4*>(p.x + r * p.ldx + 8 * v);
      const __half2* xh = reinterpret_cast<const __half2*>(&xq);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = __half22float2(xh[e]), b = __half22float2(wh[e]);
        acc[r] = fmaf(a.x, b.x, fmaf(a.y, b.y, acc[r]));
      }
    }
  }
  for (int j = 8 * kv + lane; j < p.k; j += 32) {
    const float b = __half2float(w[j]);
#pragma unroll
    for (int r = 0; r < kGemvMaxM; ++r)
      if (r < p.m) acc[r] = fmaf(__half2float(p.x[r * p.ldx + j]), b, acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxM; ++r) {
    if (r >= p.m) break;
    float v = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) p.y[r * p.ldy + c] = __float2half_rn(p.bias ? v + __half2float(p.bias[c]) : v);
  }
}

void launch_gemv(const F16GemmArgs& p, cudaStream_t stream, const char* op) {
  // The GEMV holds kGemvMaxM rows of accumulators: larger m (forced) runs in row slices.
  for (int r0 = 0; r0 < p.m; r0 += kGemvMaxM) {
    F16GemmArgs s = p;
    s.x = p.x + static_cast<int64_t>(r0) * p.ldx;
    s.y = p.y + static_cast<int64_t>(r0) * p.ldy;
    s.m = std::min(kGemvMaxM, p.m - r0);
    gemv_f16_kernel<<<static_cast<unsigned>((p.n + kGemvWarps - 1) / kGemvWarps), 32 * kGemvWarps, 0, stream>>>(s);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace

void gemm_f16(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, cudaStream_t stream,
              F16GemmKernel kernel) {
  const char* op = "gemm_f16";
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  LOWBIT_CHECK(m < (1LL << 31) && n < (1LL << 31) && k < (1LL << 31), op, ": problem too large");
  if (m == 0 || n == 0) return;
  F16GemmArgs p{};
  p.x = x.data<__half>();
  p.w = w.data<__half>();
  p.bias = bias.defined() ? bias.data<__half>() : nullptr;
  p.y = y.data<__half>();
  p.ldx = x.stride(0);
  p.ldw = w.stride(0);
  p.ldy = y.stride(0);
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.x_vec = p.ldx % 8 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  p.w_vec = p.ldw % 8 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
  const bool aligned = p.x_vec && p.w_vec;
  const bool automatic = kernel == F16GemmKernel::automatic;
  if (automatic)
    kernel = m == 1 ? F16GemmKernel::gemv
             : aligned ? F16GemmKernel::mma
             : m <= kGemvMaxM ? F16GemmKernel::gemv
                              : F16GemmKernel::wmma;
  if (kernel == F16GemmKernel::mma) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, aligned, op,
                      ": the mma kernel needs 16-byte aligned rows (cp.async): row strides multiples of 8 and "
                      "aligned starts");
    const int device = x.device().index;  // current for the smem attribute and launch, as gemm_w4a16 does
    LOWBIT_CUDA_CHECK(op, cudaSetDevice(device));
    const F16MmaPlan plan = gemm_f16_mma_plan(m, n, k, device);
    if (plan.ok) {
      LOWBIT_CHECK(n <= 65535LL * 128, op, ": n = ", n, " needs too many column tiles");
      Tensor ws;
      if (plan.split > 1) ws = Tensor::empty({plan.split * m * n}, ScalarType::f32, x.device());
      const F16MmaArgs a{p.x, p.ldx, p.w, p.ldw, p.bias, p.y, p.ldy, plan.split > 1 ? ws.data<float>() : nullptr,
                         p.m, p.n, p.k, plan.chunks_per_split};
      gemm_f16_mma(a, plan, stream);
      return;
    }
    // The op-level automatic choice takes wmma when the tile does not fit this device's shared memory;
    // a named mma (a plan's) must not change kernels behind the plan's back.
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, automatic, op, ": the mma tile for m = ", m,
                      " does not fit this device's shared memory");
    kernel = F16GemmKernel::wmma;
  }
  if (kernel == F16GemmKernel::gemv) {
    launch_gemv(p, stream, op);
    return;
  }
  const dim3 grid(static_cast<unsigned>((n + kBN - 1) / kBN), static_cast<unsigned>((m + kBM - 1) / kBM));
  LOWBIT_CHECK(grid.y < 65536, op, ": m = ", m, " needs too many row tiles");
  gemm_f16_kernel<<<grid, kThreads, 0, stream>>>(p);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
