// GPU kernels of the model forward pass that are not GEMMs (CUDA builds only): row-wise
// normalisation and activation, embedding gather, RoPE, quantize-on-write into the paged KV cache,
// prefill attention, and a plain f16 GEMM. The ops layer (cpp/ops) checks arguments and dispatches
// here; these entry points check only what the kernels themselves rely on. Every launch is checked.
// All kernels compute in f32 and round once to the output dtype, like the CPU kernels.
#pragma once
#include <cuda_runtime_api.h>

#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/cuda/k_window.h"

namespace lowbit::cuda {

struct FmpqBits;  // lowbit/cuda/kernels.h

// `rows` rows of `cols` contiguous elements of an f32/f16/bf16 tensor, `stride` elements apart.
struct Rows {
  void* base = nullptr;
  ScalarType dtype = ScalarType::f32;
  int64_t rows = 0, cols = 0, stride = 0;
};

// out = x * rsqrt(mean(x^2) + eps) * weight, row by row (weight: one row of cols).
void rms_norm(const Rows& x, const Rows& weight, float eps, const Rows& out, cudaStream_t stream);
// residual += x (rounded to residual's dtype); out = rms_norm(residual) * weight.
void add_rms_norm(const Rows& residual, const Rows& x, const Rows& weight, float eps, const Rows& out,
                  cudaStream_t stream);
// The pre-norm of a W8A8 / FP8 linear with its activation quantizer fused: with x (x.base set),
// residual += x first; then the normed rows (f16, as rms_norm would write them) become per-token
// codes (s8 or e4m3, [rows, ldq]) and f32 scales, the bytes quantize_per_token_{s8,e4m3} would make
// of them. The normed rows themselves are not written.
void norm_quantize(const Rows& residual, const Rows& x, const Rows& weight, float eps, void* q, int64_t ldq,
                   ScalarType q_type, float* scales, cudaStream_t stream);
// The pre-norm of a COMET FMPQ linear with quantize_fmpq fused: with x (x.base set), residual += x first; then the
// f16 rows rms_norm / add_rms_norm would write, gathered through perm (device s32 [cols], null = none), become
// codes (s8 [rows, ldq], int4 or int8 values per 128-channel block by `bits`) and f32 block scales ([rows, blocks],
// contiguous): quantize_fmpq's bytes. The normed rows are not written. f16 rows of at most 8192 columns and an
// f16/f32 weight; false (nothing launched) otherwise.
bool norm_quantize_fmpq(const Rows& residual, const Rows& x, const Rows& weight, float eps, const FmpqBits& bits,
                        const int32_t* perm, int8_t* q, int64_t ldq, float* scales, cudaStream_t stream);
// out[r, i] = silu(gu[r, i]) * gu[r, I + i] with I = out.cols.
void silu_mul(const Rows& gate_up, const Rows& out, cudaStream_t stream);
// SiLU·mul with the next linear's per-token quantizer fused: codes (s8 or e4m3, [rows, ldq]) and f32 scales of the
// f16 rows silu_mul would write, the bytes quantize_per_token_{s8,e4m3} would make of them (the rows are not
// written). f16 gate_up rows with 16-byte groups, I = cols / 2 <= 16384, 8-byte aligned code rows; false (nothing
// launched) otherwise. pdl: launched as a programmatic dependent of the kernel before it (sm_90+).
bool silu_mul_quantize(const Rows& gate_up, void* q, int64_t ldq, ScalarType q_type, float* scales, bool pdl,
                       cudaStream_t stream);
// Row clusters (sm_90): silu_mul_quantize spreads each of a few rows over a cluster of CTAs (the same bytes as one
// block per row). mode -1: when rows * cluster <= SMs (default); 0: never; 1: always on sm_90+.
// Returns the previous mode. For tests and benchmarks comparing the two paths in one process. sample_rows reads it
// too: mode 0 keeps its one block per row, otherwise sm_90 scans each row with a cluster (see sample_rows).
int set_row_cluster_mode(int mode);
int get_row_cluster_mode();
// out[r] = table[ids[r]] for device ids (s32); an id outside [0, table.rows) gives a NaN row (the
// ids live on the device, so they cannot be checked on the host without a synchronizing copy).
void embedding(const int32_t* ids, const Rows& table, const Rows& out, cudaStream_t stream);
// out[r, j] = x[r, perm[j]] for device perm (s32 [out.cols]); an entry outside [0, x.cols) gives NaN.
void gather_columns(const Rows& x, const int32_t* perm, const Rows& out, cudaStream_t stream);
// y[r, :] += bias (one row of y.cols).
void add_bias(const Rows& y, const Rows& bias, cudaStream_t stream);
// out (f32 rows) = float(x) for f32/f16/bf16 rows.
void cast_rows_to_f32(const Rows& x, const Rows& out, cudaStream_t stream);

// Sampling, one token per row of logits, with ops::sample_token's semantics: params (device f64
// [rows, 5]) = (temperature, top_k, top_p, min_p, uniform) per row; temperature 0 takes the first
// index of the row's maximum. tokens[r] gets the token, logprobs[r] its log-softmax under the
// unmodified row (f32). tokens/logprobs: device s32/f32 [rows]. On sm_90 (row cluster mode not 0) a cluster of 8
// CTAs scans each row: the same tokens, the logprob's sum of exp in another order (its last bits may differ).
void sample_rows(const Rows& logits, const double* params, int32_t* tokens, float* logprobs, cudaStream_t stream);
// ids[i] = sampled[feed[i]] where feed[i] >= 0: a queued decode step takes its token ids from the tokens the step
// before it sampled, still on the device. ids, feed, sampled: device s32 ([n], [n], rows of that step).
void feed_sampled_tokens(int32_t* ids, const int32_t* feed, const int32_t* sampled, int64_t n, cudaStream_t stream);

// Rotates q [T, Hq, D] and k [T, Hkv, D] (either may be undefined; f32/f16/bf16; last dim
// contiguous) at device positions (s32 [T]). inv_freq has rotary_dim / 2 (<= 128) entries computed
// on the host in double (same table as the CPU kernel); angles are formed and turned in double.
void rope(Tensor& q, Tensor& k, const Tensor& positions, const std::vector<double>& inv_freq, bool neox,
          cudaStream_t stream);

// Writes k/v [T, Hkv, D] (f32/f16/bf16, last dim contiguous) into the slots of one layer's cache
// tensors (kv_cache.h layout; f32/f16/bf16 stored as is, u8/u4 quantized per token per head with
// the same arithmetic as the CPU cache, so both caches hold identical bytes). slot_mapping s32 [T]
// on the device; a negative slot skips the token, and so does a slot past the cache (the
// slots live on the device: the host cannot check them without a synchronizing copy).
// With a KWindow (per-channel u4 K): K rows go to the window rows of their block's slot, and every block
// whose last slot is written here is quantized per channel into k_data / k_params ([blocks, Hkv, 2, D]).
void kv_write(const Tensor& k, const Tensor& v, Tensor& k_data, Tensor& v_data, Tensor& k_params, Tensor& v_params,
              const Tensor& slot_mapping, cudaStream_t stream, const KWindow& window = {});

// rope(q, k, ...) then kv_write(k, v, ...) in one launch, with the same results bit for bit: q and k
// [T, Hq|Hkv, D] are rotated in place (q may be undefined) and the rotated k and v are written to
// the cache's slots. inv_freq and neox as for rope; the rest as for kv_write.
void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const std::vector<double>& inv_freq,
                   bool neox, Tensor& k_data, Tensor& v_data, Tensor& k_params, Tensor& v_params,
                   const Tensor& slot_mapping, cudaStream_t stream, const KWindow& window = {});

// Causal paged attention for any q_len (prefill, chunked prefill, mixed batches): seq_info is s32
// [3, num_seqs] = (q_start, q_len, kv_len) rows on the device, block_tables s32 [num_seqs, max_blocks];
// q and out [T, Hq, D] f32/f16/bf16 with strided rows; K/V of any type kv_write writes.
// max_q_len bounds every q_len (it sizes the grid). Two kernels: tensor_core (f16 q/out with aligned
// rows, head_dim 64/128, f16/u8/u4 caches: 64-row query tiles, P and dequantized K/V in f16) and warp
// (one warp per (query token, head) in f32, head_dim <= 256); f32 online softmax either way. On sm_90,
// hopper (wgmma, 128-row query tiles, per-token f16/u8/u4/u2 K and V, head_dim 64/128). A kernel that
// cannot run its operands throws NotSupported; `automatic` takes hopper, else tensor_core, where it can
// run (the op-level API; plans name the kernel). Rows of out outside every sequence are left untouched.
enum class PrefillKernel : uint8_t { automatic, tensor_core, warp, hopper };
// Knobs of the hopper kernel (the plan's tuning prefill_key_split / prefill_pack_heads): key_splits 0 = the launch's
// plan (a short chunk over a long prefix splits its keys over CTAs), 1 = none, N = N (at most 16); pack_heads 0 = its
// rule, 1 = one query head per CTA, 2 = the query heads of a kv head share a CTA wherever the cache allows.
// ref_dequant (tests and measurements): u4 / u2 dequantized the previous way (K and V both u4 or both u2 only; per
// channel: u4c K with u4 V, u2c K with u2 V, head_dim 128). dequant_copy 0 = its rule (a per-token u8 / u4 / u2
// cache whose prefix tiles the fused launch would dequantize 4 or more times is dequantized once into an f16 copy,
// then the f16 instance runs on it; per-channel K from 4 visits too: the keys sealed before the chunk copied, the
// rest by the per-channel instance as the last split of a key split), 1 = never, 2 = wherever the cache allows.
// side_stream (that per-channel split): 0 / 2 = the per-channel instance on a second stream beside the copy and the
// f16 instance (forked from and joined back to `stream` with events; capturable), 1 = all on `stream` (A/Bs).
struct PrefillSm90Options {
  int key_splits = 0;
  int pack_heads = 0;
  bool ref_dequant = false;
  int dequant_copy = 0;
  int side_stream = 0;
};
void prefill_attention(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                       const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, int max_q_len,
                       float scale, Tensor& out, cudaStream_t stream, PrefillKernel kernel = PrefillKernel::automatic,
                       const KWindow& window = {}, const PrefillSm90Options& sm90 = {});

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]) with x, w, y f16 (bias f16 or undefined), last dims
// contiguous; f32 accumulation. Kernels: gemv (one warp per output column, 16 rows per pass), mma
// (mma.sync + cp.async, needs 16-byte aligned rows and a tile that fits the device's shared memory)
// and wmma (any alignment). A forced kernel that cannot run throws NotSupported; `automatic` (the
// op-level API; plans name the kernel) takes gemv for m = 1, mma where it runs, else gemv up to 16
// rows and wmma beyond.
enum class F16GemmKernel : uint8_t { automatic, gemv, wmma, mma };
void gemm_f16(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, cudaStream_t stream,
              F16GemmKernel kernel = F16GemmKernel::automatic);

}  // namespace lowbit::cuda
