// GPU entry points (CUDA builds only). Tensors are lowbit Tensors on one CUDA device (torch tensors
// arrive zero-copy through DLPack); outputs are caller-allocated. Every entry point checks its
// arguments (naming op, argument, expected vs actual), launches on `stream`, and checks the launch.
#pragma once
#include <cuda_runtime_api.h>

#include "lowbit/core/tensor.h"
#include "lowbit/quant/pack.h"

namespace lowbit::cuda {

// out[n, k] = (q - zero) * scale for arch-neutral group-wise u4 weights: q u4 [n, k], scales and
// zeros f16 [n, ceil(k / group)] (zeros undefined = symmetric, zero 8); out f16 or bf16 [n, k].
void dequantize_w4(const Tensor& q, const Tensor& scales, const Tensor& zeros, int group, Tensor& out,
                   cudaStream_t stream);

// y[m, n] = x[m, k] · Wᵀ, W a w4 weight packed by pack_sm80 and moved to the device; x, y f16 with
// unit stride in the last dim. split_k = 0 picks the split itself; a split > 1 needs an f32
// workspace of gemm_w4a16_workspace_elems(m, n, split) elements (allocated here when undefined).
// From 128 tokens a large-M kernel runs (its pick_split splits only when the tiles leave SMs idle);
// LOWBIT_W4A16_KERNEL=small|large|large:64x128|large:128x128|large:128x256 overrides (read per call).
void gemm_w4a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                cudaStream_t stream);
int gemm_w4a16_pick_split(int64_t m, int64_t n, int64_t k, int device);
int64_t gemm_w4a16_workspace_elems(int64_t m, int64_t n, int split_k);

// Per-token symmetric int8 activations: q = rint(x / s), s[m] = max|x[m, :]| / 127 (1 for a zero
// row), in f32 (activation.h semantics). x f16 [m, k], q s8 [m, k], scales f32 [m].
void quantize_per_token_s8(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream);

// W8A8: y[m, n] = (xq · wqᵀ)[m, n] * x_scale[m] * w_scale[n] with s8 xq [m, k], wq [n, k] (k a
// multiple of 64), f32 scales, y f16; with an s32 y the raw int32 accumulators are written
// (scales ignored), which the tests compare bit-exactly. On sm_90 it runs the wgmma kernel unless
// LOWBIT_W8A8_KERNEL=sm80 ("sm90[:S]" forces it, with split-K cluster size S).
void gemm_w8a8(const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale, Tensor& y,
               cudaStream_t stream);

// FP8 W8A8 (compute capability 8.9+, NotSupported below): per-token e4m3 activations, s[m] =
// max|x[m, :]| / 448 (1 for a zero row), q = e4m3(x / s) rounded to nearest even and saturated;
// x f16 [m, k], q e4m3 [m, k], scales f32 [m].
void quantize_per_token_e4m3(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream);
// y[m, n] = (xq · wqᵀ)[m, n] * x_scale[m] * w_scale[n] with e4m3 xq [m, k], wq [n, k] (k a multiple
// of 64) on e4m3 tensor cores with f32 accumulators, y f16; with an f32 y the raw accumulators. On
// sm_90 it runs the wgmma kernel (LOWBIT_W8A8_KERNEL picks a kernel, as for gemm_w8a8), which adds
// each 128-k stage's tensor-core sum into f32 registers (LOWBIT_FP8_SM90_FAST_ACCUM=1: no promotion).
// Products of e4m3 values are exact; the sums are not bit-reproducible across kernels or split-K.
void gemm_fp8(const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale, Tensor& y,
              cudaStream_t stream);

// Decode attention (one query token per sequence) over the paged KV cache of one layer
// (include/lowbit/kv/kv_cache.h layout): q f16 [B, Hq, D]; k_data/v_data [blocks, Hkv, block_size, D]
// of f16, u8 or u4; k_params/v_params f32 [blocks, Hkv, block_size, 2]
// (scale, zero) for u8/u4; block_tables s32 [B, max_blocks]; seq_lens s32 [B] (on the device);
// max_seq_len >= every seq_len (decides the split-KV grid, so it is graph-capture friendly);
// out f16 [B, Hq, D]. split_tokens = 0 picks the split size itself. D in {64, 128}, Hq/Hkv <= 8.
// K and V types may differ (e.g. u8 K with u4 V).
void decode_attention(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                      const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_lens,
                      int max_seq_len, float scale, Tensor& out, int split_tokens, cudaStream_t stream);

}  // namespace lowbit::cuda
