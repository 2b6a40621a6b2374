// COMET FMPQ activations on the GPU (activation.h semantics, the same bytes as the CPU quantizer):
// per token and 128-channel block, s = max|x| / qmax (qmax 7 for int4 blocks, 127 for int8; 1 for an
// all-zero block), q = rint(x / s) clamped to +-qmax, stored as s8. One warp per (token, block): each
// lane holds 4 channels, the block maximum is a warp reduction. The divisions are IEEE (no fast-math),
// which is what makes the codes and scales bit-exact against the CPU.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/fmpq_code.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"
#include "lowbit/quant/activation.h"

namespace lowbit::cuda {
namespace {

constexpr int kWarps = 8;  // (token, block) pairs per CTA

__device__ inline float load_x(const void* x, bool half, int64_t i) {
  return half ? __half2float(static_cast<const __half*>(x)[i]) : static_cast<const float*>(x)[i];
}

__global__ void quantize_fmpq_kernel(const void* x, bool half, int64_t ldx, const int32_t* perm, int m, int k,
                                     int blocks, FmpqBits bits, int8_t* q, int64_t ldq, float* scales) {
  const int warp = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp >= m * blocks) return;
  const int row = warp / blocks, b = warp % blocks, c0 = b * kFmpqBlock;
  const bool int8 = (bits.int8_mask[b >> 5] >> (b & 31)) & 1u;
  const float qmax = int8 ? 127.f : 7.f;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = c0 + lane + 32 * i;
    v[i] = c < k ? load_x(x, half, row * ldx + (perm ? perm[c] : c)) : 0.f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float s = amax > 0.f ? amax / qmax : 1.f;
  const int lim = static_cast<int>(qmax);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = c0 + lane + 32 * i;
    if (c < k) q[row * ldq + c] = static_cast<int8_t>(max(-lim, min(lim, __float2int_rn(v[i] / s))));
  }
  if (lane == 0) scales[static_cast<int64_t>(row) * blocks + b] = s;
}

// SiLU·mul with quantize_fmpq fused (the down linear's input): each half warp takes one (token, block) of the f16
// rows silu_mul would write, act[t, c] = silu(gate[t, c]) * up[t, c] with silu_mul's f32 expression rounded to f16,
// read through perm (output column c from act column perm[c]). Lane l of the half holds columns 8 l .. + 7 of the
// block: 16-byte loads of gate and up where `vec` (no perm, rows 16-byte aligned, I % 8 == 0), else one element at
// a time. The f16 rows are never written.
constexpr int kSiluThreads = 256, kSiluPairs = kSiluThreads / 16;  // (token, block) pairs per CTA

__device__ __forceinline__ void load8_f16(const __half* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __half* h = reinterpret_cast<const __half*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = __half2float(h[e]);
}

__global__ void __launch_bounds__(kSiluThreads)
    silu_mul_quantize_fmpq_kernel(const __half* gu, int64_t ldg, const int32_t* perm, int m, int k, int blocks,
                                  FmpqBits bits, bool vec, int8_t* q, int64_t ldq, bool q8, float* scales) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kSiluPairs + threadIdx.x / 16;
  const bool active = pair < static_cast<int64_t>(m) * blocks;  // a whole half warp agrees
  const int row = active ? static_cast<int>(pair / blocks) : 0, b = active ? static_cast<int>(pair % blocks) : 0;
  const int c = b * kFmpqBlock + 8 * static_cast<int>(threadIdx.x % 16);
  const __half* g = gu + row * ldg;
  const __half* u = g + k;
  float a[8], v[8];
  if (vec && active && c + 8 <= k) {
    load8_f16(g + c, a);
    load8_f16(u + c, v);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const bool in = active && c + e < k;
      const int j = in ? (perm ? perm[c + e] : c + e) : 0;
      a[e] = in ? __half2float(g[j]) : 0.f;
      v[e] = in ? __half2float(u[j]) : 0.f;  // silu(0) * 0 = 0: no effect on the block max
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) a[e] = __half2float(__float2half_rn(a[e] / (1.f + expf(-a[e])) * v[e]));
  fmpq_codes_half_warp(a, b, k, active && fmpq_int8_block(bits, b), active, q + row * ldq,
                       scales + static_cast<int64_t>(row) * blocks + b, q8);
}

}  // namespace

FmpqBits fmpq_bits_of(const Tensor& block_bits, const char* op) {
  check_defined(block_bits, op, "block_bits");
  check_dtype(block_bits, ScalarType::u8, op, "block_bits");
  check_dim(block_bits, 1, op, "block_bits");
  LOWBIT_CHECK_TYPE(block_bits.device().is_cpu(), op, ": argument 'block_bits' must be on the CPU (it travels in the ",
                    "kernel's arguments), got ", block_bits.device().str());
  const int64_t blocks = block_bits.size(0);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, blocks <= kFmpqMaxBlocks, op, ": ", blocks, " FMPQ blocks (k up to ",
                    blocks * kFmpqBlock, "); the GPU kernels take at most ", kFmpqMaxBlocks, " (k <= ",
                    kFmpqMaxBlocks * kFmpqBlock, ")");
  FmpqBits bits{};
  const Tensor c = block_bits.contiguous();
  for (int64_t b = 0; b < blocks; ++b) {
    const int v = c.data<uint8_t>()[b];
    LOWBIT_CHECK(v == 4 || v == 8, op, ": argument 'block_bits' must hold 4 or 8 per block of ", kFmpqBlock,
                 " channels, got ", v, " for block ", b);
    if (v == 8) bits.int8_mask[b >> 5] |= 1u << (b & 31);
  }
  return bits;
}

namespace {
// The block map (one entry per 128 channels of k) and the outputs both FMPQ producers write: q [m, k] s8, scales
// [m, blocks] f32, and the optional input permutation perm [k] s32, all on `ref`'s device.
FmpqBits check_fmpq_outputs(const Tensor& ref, const Tensor& block_bits, const Tensor& q, const Tensor& scales,
                            const Tensor& perm, int64_t m, int64_t k, const char* op) {
  const int64_t blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  LOWBIT_CHECK(block_bits.defined() && block_bits.dim() == 1 && block_bits.size(0) == blocks, op,
               ": argument 'block_bits' must have shape [", blocks, "] (one entry per ", kFmpqBlock,
               " channels of k=", k, "), got ", block_bits.defined() ? shape_str(block_bits.shape()) : "undefined");
  const FmpqBits bits = fmpq_bits_of(block_bits, op);
  check_same_device(q, ref, op, "q");
  check_dtype(q, ScalarType::s8, op, "q");
  check_shape(q, {m, k}, op, "q");
  LOWBIT_CHECK(q.stride(1) == 1 || k <= 1, op, ": argument 'q' needs unit stride in the last dim");
  check_same_device(scales, ref, op, "scales");
  check_dtype(scales, ScalarType::f32, op, "scales");
  check_shape(scales, {m, blocks}, op, "scales");
  check_contiguous(scales, op, "scales");
  if (perm.defined()) {  // its values were checked where it was set (Model.set_input_permutation)
    check_same_device(perm, ref, op, "perm");
    check_dtype(perm, ScalarType::s32, op, "perm");
    check_shape(perm, {k}, op, "perm");
    check_contiguous(perm, op, "perm");
  }
  return bits;
}
}  // namespace

void quantize_fmpq(const Tensor& x, const Tensor& block_bits, Tensor& q, Tensor& scales, cudaStream_t stream,
                   const Tensor& perm) {
  const char* op = "quantize_fmpq";
  check_cuda_tensor(x, op, "x");
  check_dim(x, 2, op, "x");
  LOWBIT_CHECK_TYPE(x.dtype() == ScalarType::f16 || x.dtype() == ScalarType::f32, op,
                    ": on the GPU argument 'x' must be f16 or f32, got ", name_of(x.dtype()));
  LOWBIT_CHECK(x.stride(1) == 1 || x.size(1) <= 1, op, ": argument 'x' needs unit stride in the last dim");
  const int64_t m = x.size(0), k = x.size(1), blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  const FmpqBits bits = check_fmpq_outputs(x, block_bits, q, scales, perm, m, k, op);
  LOWBIT_CHECK(m * blocks < (1LL << 31) / 32 && m * std::max<int64_t>(k, 1) < (1LL << 40), op, ": problem too large");
  if (m == 0 || k == 0) return;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(x.device().index));
  const int64_t warps = m * blocks;
  quantize_fmpq_kernel<<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(
      x.data_ptr(), x.dtype() == ScalarType::f16, x.stride(0), perm.defined() ? perm.data<int32_t>() : nullptr,
      static_cast<int>(m), static_cast<int>(k),
      static_cast<int>(blocks), bits, q.data<int8_t>(), q.stride(0), scales.data<float>());
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda

namespace lowbit::cuda {

void silu_mul_quantize_fmpq(const Tensor& gate_up, const Tensor& block_bits, Tensor& q, Tensor& scales,
                            cudaStream_t stream, const Tensor& perm) {
  const char* op = "silu_mul_quantize_fmpq";
  check_cuda_tensor(gate_up, op, "gate_up");
  check_dim(gate_up, 2, op, "gate_up");
  check_dtype(gate_up, ScalarType::f16, op, "gate_up");
  LOWBIT_CHECK(gate_up.size(1) % 2 == 0, op, ": argument 'gate_up' must have an even last dimension [m, 2 * k], got ",
               shape_str(gate_up.shape()));
  LOWBIT_CHECK(gate_up.stride(1) == 1 || gate_up.size(1) <= 1, op, ": argument 'gate_up' needs unit stride in the ",
               "last dim");
  const int64_t m = gate_up.size(0), k = gate_up.size(1) / 2, blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  const FmpqBits bits = check_fmpq_outputs(gate_up, block_bits, q, scales, perm, m, k, op);
  LOWBIT_CHECK(m * blocks < (1LL << 31) / 16 && m * std::max<int64_t>(2 * k, 1) < (1LL << 40), op,
               ": problem too large");
  if (m == 0 || k == 0) return;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(gate_up.device().index));
  const auto* g = static_cast<const __half*>(gate_up.data_ptr());
  const int64_t ldg = gate_up.stride(0);
  const bool vec = !perm.defined() && reinterpret_cast<uintptr_t>(g) % 16 == 0 && ldg % 8 == 0 && k % 8 == 0;
  int8_t* qp = q.data<int8_t>();
  const bool q8 = reinterpret_cast<uintptr_t>(qp) % 8 == 0 && q.stride(0) % 8 == 0;
  const int64_t pairs = m * blocks;
  silu_mul_quantize_fmpq_kernel<<<static_cast<unsigned>((pairs + kSiluPairs - 1) / kSiluPairs), kSiluThreads, 0,
                                  stream>>>(g, ldg, perm.defined() ? perm.data<int32_t>() : nullptr,
                                            static_cast<int>(m), static_cast<int>(k), static_cast<int>(blocks), bits,
                                            vec, qp, q.stride(0), q8, scales.data<float>());
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
