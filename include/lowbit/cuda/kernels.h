// GPU entry points (CUDA builds only). Tensors are lowbit Tensors on one CUDA device (torch tensors
// arrive zero-copy through DLPack); outputs are caller-allocated. Every entry point checks its
// arguments (naming op, argument, expected vs actual), launches on `stream`, and checks the launch.
#pragma once
#include <cuda_runtime_api.h>

#include <tuple>
#include <utility>

#include "lowbit/core/tensor.h"
#include "lowbit/cuda/k_window.h"
#include "lowbit/quant/pack.h"

namespace lowbit::cuda {

// out[n, k] = (q - zero) * scale for arch-neutral group-wise u4 weights: q u4 [n, k], scales and
// zeros f16 [n, ceil(k / group)] (zeros undefined = symmetric, zero 8); out f16 or bf16 [n, k].
void dequantize_w4(const Tensor& q, const Tensor& scales, const Tensor& zeros, int group, Tensor& out,
                   cudaStream_t stream);

// y[m, n] = x[m, k] · Wᵀ, W a w4 weight packed by pack_sm80 and moved to the device; x, y f16 with
// unit stride in the last dim. split_k = 0 picks the split itself; a split > 1 needs an f32
// workspace of gemm_w4a16_workspace_elems(m, n, split) elements (allocated here when undefined).
// Three kernels read the same packed weight: small (mma.sync, 8..64-token tiles, split-K to fill the
// SMs), large (mma.sync, 64/128-token tiles, its pick_split splits only when the tiles leave SMs idle)
// and sm90 (f16 wgmma with the dequantized weight as a register operand, TMA, 128/256-token tiles,
// split-K in thread-block clusters; sm_90 only: a forced sm90 elsewhere throws NotSupported).
// `automatic` (the op-level API; plans name the kernel) takes sm90 on sm_90, else large, from 128
// tokens. large_tile: 0 automatic, or 64128 / 128128 / 128256 (m x n). sm90_split: 0 automatic, else
// the cluster size 1/2/4/8; sm90_tokens: 0 automatic, else 16, 32, 64 (the small tiles, two CTAs per SM),
// 128 or 256 tokens per tile; sm90_serial: the earlier mainloop that waits for each stage's wgmmas (A/B timing
// only). pdl: programmatic dependent launch of the small kernel, the decode kernels and the sm90 kernel's small
// tiles where the device has it (sm_90+).
enum class W4A16Kernel : uint8_t { automatic, small, large, sm90, decode_sm90, gemv };
struct W4A16Options {
  W4A16Kernel kernel = W4A16Kernel::automatic;
  int large_tile = 0;
  int sm90_split = 0;
  int sm90_tokens = 0;
  bool sm90_serial = false;
  bool sm90_streamk = false;  // force the sm90 kernel's stream-K launch (sm90_tokens: its tile, 0 = the model's)
  int sm90_ctas = 0;          // stream-K's CTAs (0 = every resident one; tests pin fewer)
  bool sm90_no_streamk = false;  // the cost model without its stream-K candidate (A/B timing)
  int sm90_rows = 0;  // the sm90 kernel's weight rows per CTA: 0 = the cost model's, 128 = the plans before the wide
                      // tile (A/B timing), 256 = the wide tile (128 tokens)
  int sm90_reduce = 0;  // the sm90 kernel's split-K reduction: 0 = its default, 1 = cluster shared memory, 2 = L2
  bool sm90_one_producer = false;  // the sm90 kernel's earlier one-thread producer (A/B timing: 'sm90o...' names)
  int gemv_tiles = 0;  // the gemv kernel's 16-row tiles per CTA (1, 2, 4, 8); 0 = its own pick
  int gemv_ring = 0;    // the gemv kernel's configuration ('gemv:T:rDbB'): chunks in flight per warp and
  int gemv_blocks = 0;  // CTAs per SM; 0, 0 = its own pick
  bool pdl = true;
};
void gemm_w4a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                cudaStream_t stream, const W4A16Options& options = {});
int gemm_w4a16_pick_split(int64_t m, int64_t n, int64_t k, int device, const W4A16Options& options = {});
// The sm90 kernel's {tokens per tile, split-K cluster, head} for this shape under `options` (sm_90 only); head > 0:
// tiles [0, head) run unsplit in a first launch, the rest at the split in a second; split 0: one stream-K launch.
std::tuple<int, int, int> gemm_w4a16_sm90_plan(int64_t m, int64_t n, int64_t k, int device,
                                               const W4A16Options& options = {});
// The weight rows per CTA of that plan: 128, or 256 for the wide tile (gemm_w4a16_sm90.cu).
int gemm_w4a16_sm90_plan_rows(int64_t m, int64_t n, int64_t k, int device, const W4A16Options& options = {});
// The Hopper decode kernel's split-K cluster (1, 2, 4, 8) for this shape (sm_90 only).
int gemm_w4a16_decode_sm90_split(int64_t m, int64_t n, int64_t k, int device);
// The register-direct GEMV's {16-row tiles per CTA, CTAs along k} for 1-8 tokens; `tiles` != 0 pins the first.
// ring, blocks: a configuration ('gemv:T:rDbB'), 0, 0 = the automatic one.
std::pair<int, int> gemm_w4a16_gemv_plan(int64_t m, int64_t n, int64_t k, int device, int tiles = 0, int ring = 0,
                                         int blocks = 0);
int64_t gemm_w4a16_workspace_elems(int64_t m, int64_t n, int split_k);

// y[m, n] = x[m, k] · Wᵀ for a w8 weight as the W8A8 kernels read it (row-major s8 [n, k] on the device,
// f32 scales [n] for per-channel w8 or [n, groups] for a group of 32/64/128: GGUF Q8_0 as stored), f16 x
// (unit stride in the last dim, 16-byte aligned rows) and y; k a multiple of 64. split_k = 0 picks the
// split; a split > 1 needs split * m * n f32 of workspace (allocated here when undefined). mma.sync,
// sm_80 and newer (cpp/kernels/sm80/gemm_w8a16_sm80.cu).
void gemm_w8a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                cudaStream_t stream);
// Weight-only FP8: the same for an e4m3 weight (e4m3 [n, k] row-major on the device, f32 per-channel scales
// [n]; group 0 only), the codes converted to f16 exactly (cpp/kernels/sm80/gemm_wfp8a16_sm80.cu).
void gemm_wfp8a16(const Tensor& x, const PackedWeight& w, Tensor& y, int split_k, const Tensor& workspace,
                  cudaStream_t stream);

// W4A8 over two-level weights (qoq / liquid packed by pack_sm80, on the device): y[m, n] =
// (xq · Wᵀ)[m, n] * x_scale[m] * channel_scale[n], W the s8 weights (q*s + a) XOR 0x80 per group
// (pack_sm80_w4a8.cpp), s8 xq [m, k] (16-byte aligned rows), f16 y; with an s32 y the raw int32
// accumulators are written (x_scale ignored). Two kernels read the same packed weight: sm80
// (mma.sync m16n8k32, sm_80 and newer; split_k 0 picks the split, int32 partials allocated here;
// pdl as in W4A16Options) and sm90 (wgmma with the dequantized weight as a register operand, TMA,
// sm_90 only: a forced sm90 elsewhere throws NotSupported; sm90_split 0 automatic, else the split-K
// cluster size 1/2/4/8; pdl: its one-tile-per-CTA launches too). A third, gemv (W4A8 only: the register-direct
// GEMV of cpp/kernels/sm80/gemm_w4a8_gemv_sm80.cu, 1-16 tokens, sm_80 and newer; gemv_ring / gemv_blocks pin a
// compiled configuration, 0 = its own). `automatic` (the op-level API; plans name the kernel) takes, on sm_90, gemv
// at 1-4 tokens (no pinned split_k), sm90 from 17 tokens (and from 5 on layers of 16384+ rows) and from 128 whatever
// split_k says; else sm80.
// Which 8-bit-activation GEMM kernel runs (W4A8 here, W8A8/FP8 below; gemv is W4A8's only).
enum class Gemm8Kernel : uint8_t { automatic, sm80, sm90, gemv };
// sm90_split / sm90_tokens: the wgmma kernel's split-K cluster (1/2/4/8) and tokens per tile (16/32/64/128/256),
// 0 = its cost model's; sm90_serial: its earlier mainloop that waits for each stage's wgmmas (A/B timing only).
enum class GemvWidth : uint8_t { automatic, one_tile, wide };
struct W4A8Options {
  int split_k = 0;
  bool pdl = true;
  Gemm8Kernel kernel = Gemm8Kernel::automatic;
  int sm90_split = 0;
  int sm90_tokens = 0;
  bool sm90_serial = false;
  bool sm90_streamk = false;  // force the sm90 kernel's stream-K launch (sm90_tokens: its tile, 0 = the model's)
  int sm90_ctas = 0;          // stream-K's CTAs (0 = every resident one; tests pin fewer)
  bool sm90_no_streamk = false;  // the cost model without its stream-K candidate (A/B timing)
  int gemv_ring = 0, gemv_blocks = 0;  // the gemv kernel's configuration 'rDbB' (0, 0 = automatic)
  // the gemv kernel's CTA width: its rule by shape (automatic), one 16-row weight tile ('gemv...') or the wide plan
  // ('gemvw...': 4 weight tiles per CTA share one copy of x, k split over CTAs to fill the SMs)
  GemvWidth gemv_width = GemvWidth::automatic;
  bool sm90_one_producer = false;  // the wgmma kernel's earlier one-thread producer (A/B timing: 'sm90o...' names)
  bool sm90_persistent = false;  // the wgmma kernel's persistent tile loop ('sm90p...' names; opt-in, not measured)
  // the wgmma kernel's multicast pairs (two CTAs on neighbouring weight-row tiles share the activation tile; opt-in,
  // measured 0-4% slower than the unpaired launch): 0 = the plan's (off), 1 = off ('sm90x'), 2 = one unsplit pair
  // launch ('sm90m', 'sm90m:T')
  int sm90_pair = 0;
  // the wgmma kernel's L2 prefetch of later stages and staged scales ('sm90q...' names: the rest as after 'sm90';
  // opt-in until measured); 2: 'sm90r...', and each weight-row tile's k blocks in a rotated order
  int sm90_prefetch = 0;
};
void gemm_w4a8(const Tensor& xq, const Tensor& x_scale, const PackedWeight& w, Tensor& y, cudaStream_t stream,
               const W4A8Options& options = {});
int gemm_w4a8_pick_split(int64_t m, int64_t n, int64_t k, int device);
// The wgmma kernel's {tokens per tile, split-K cluster, head} for this shape under `options` (sm_90 only); head > 0:
// tiles [0, head) run unsplit in a first launch, the rest at the split in a second.
std::tuple<int, int, int> gemm_w4a8_sm90_plan(int64_t m, int64_t n, int64_t k, int device,
                                              const W4A8Options& options = {});

// Per-token symmetric int8 activations: q = rint(x / s), s[m] = max|x[m, :]| / 127 (1 for a zero
// row), in f32 (activation.h semantics). x f16 [m, k], q s8 [m, k], scales f32 [m].
void quantize_per_token_s8(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream);

// COMET FMPQ (activation.h): the block map travels in the kernels' arguments as a bit mask (bit b set =
// block b is int8), so a captured CUDA graph needs no device copy of it; at most kFmpqMaxBlocks blocks.
constexpr int kFmpqMaxBlocks = 256;
struct FmpqBits {
  uint32_t int8_mask[kFmpqMaxBlocks / 32];
};
// The mask of a host u8 block map (4 or 8 per block; checked, naming `op`).
FmpqBits fmpq_bits_of(const Tensor& block_bits, const char* op);
// x f16/f32 [m, k] (unit stride in the last dim), block_bits host u8 [ceil(k / 128)], q s8 [m, k],
// scales f32 [m, blocks] (contiguous): the CPU quantize_fmpq's codes and scales, bit for bit. perm (s32 [k]
// on the device, a permutation; undefined = none): quantize x[:, perm] (the gather happens in the read).
void quantize_fmpq(const Tensor& x, const Tensor& block_bits, Tensor& q, Tensor& scales, cudaStream_t stream,
                   const Tensor& perm = Tensor());
// SiLU·mul with quantize_fmpq fused (the down linear's input): gate_up f16 [m, 2k] (unit stride in the last dim);
// q, scales, block_bits and perm as above, the bytes quantize_fmpq makes of the f16 rows silu_mul writes (which are
// not written).
void silu_mul_quantize_fmpq(const Tensor& gate_up, const Tensor& block_bits, Tensor& q, Tensor& scales,
                            cudaStream_t stream, const Tensor& perm = Tensor());

// COMET W4Ax GEMM over FMPQ activations (cpp/kernels/sm80/gemm_fmpq_sm80.cu, mma.sync s8, sm_80 and
// newer): y[m, n] = channel_scale[n] * sum_b x_scale[m, b] * acc_b[m, n], acc_b the exact int32 sum of
// 128-channel block b (q · W, W the qoq/liquid s8 weights as gemm_w4a8 reads them). xq s8 [m, k]
// (16-byte aligned rows), x_scale f32 [m, blocks] contiguous; y f16 or f32 [m, n], or s32 [m, blocks, n]:
// the raw per-block accumulators (x_scale ignored). Two kernels: sm80 (mma.sync; split_k 0 picks the split,
// whole blocks per split) and sm90 (wgmma + TMA, sm_90 only, scaled outputs only, 128-token tiles; split_k 0
// automatic, else the split-K cluster size 1/2/4/8; its block flush overlapped with the next block's wgmmas;
// sm90_serial: the same kernel flushing between blocks, bit-identical outputs, kept for A/B timing).
// sm80_s4 (the sm80 kernel with the s4 stream of cpp/kernels/sm80/fmpq_s4_stream_sm80.cuh): int4 blocks on
// mma.sync m16n8k64 s4, int8 blocks on the sm80 kernel's s8 stream, by the host u8 block map `block_bits` (4 / 8
// per block; int4 blocks must hold codes in [-8, 7]); split_k and raw outputs as sm80, the same int32 block sums
// bit for bit; slow on sm_90 (no fast s4).
// gemv (the register-direct W4A8 GEMV's FMPQ form, 1-16 tokens, scaled outputs only, split_k 0: its own k split;
// its width by shape, or gemv_one_tile / gemv_wide): block sums flushed in f32 per warp, so its outputs equal the
// other kernels' to f32 rounding, not bit for bit.
// `automatic` takes the gemv on sm_90 at 1-4 tokens, sm90 on sm_90 from 128 tokens on, sm80_s4 on sm_80/86/87/89
// when block_bits is given.
enum class FmpqKernel : uint8_t { automatic, sm80, sm90, sm90_serial, sm80_s4, gemv, gemv_one_tile, gemv_wide };
void gemm_fmpq(const Tensor& xq, const Tensor& x_scale, const PackedWeight& w, Tensor& y, cudaStream_t stream,
               int split_k = 0, FmpqKernel kernel = FmpqKernel::automatic, const Tensor& block_bits = Tensor());

// Which 8-bit GEMM runs and its knobs: sm80 (mma.sync) or sm90 (wgmma + TMA, sm_90 only; a forced
// sm90 elsewhere throws NotSupported); `automatic` (the op-level API; plans name the kernel) takes
// sm90 on sm_90. sm90_split: 0 automatic, else the split-K cluster size 1/2/4/8; sm90_pairs:
// multicast weight tiles to pairs of A tiles (measured slower on the H100, kept for further work);
// fp8_fast_accum: the fp8 wgmma kernel keeps the tensor cores' own sums (no per-stage promotion).
struct Gemm8Options {
  Gemm8Kernel kernel = Gemm8Kernel::automatic;
  int sm90_split = 0;
  bool sm90_pairs = false;
  bool fp8_fast_accum = false;
};

// W8A8: y[m, n] = (xq · wqᵀ)[m, n] * x_scale[m] * w_scale[n] with s8 xq [m, k], wq [n, k] (k a
// multiple of 64), f32 scales, y f16; with an s32 y the raw int32 accumulators are written
// (scales ignored), which the tests compare bit-exactly.
void gemm_w8a8(const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale, Tensor& y,
               cudaStream_t stream, const Gemm8Options& options = {});

// FP8 W8A8 (compute capability 8.9+, NotSupported below): per-token e4m3 activations, s[m] =
// max|x[m, :]| / 448 (1 for a zero row), q = e4m3(x / s) rounded to nearest even and saturated;
// x f16 [m, k], q e4m3 [m, k], scales f32 [m].
void quantize_per_token_e4m3(const Tensor& x, Tensor& q, Tensor& scales, cudaStream_t stream);
// y[m, n] = (xq · wqᵀ)[m, n] * x_scale[m] * w_scale[n] with e4m3 xq [m, k], wq [n, k] (k a multiple
// of 64) on e4m3 tensor cores with f32 accumulators, y f16; with an f32 y the raw accumulators. The
// sm90 kernel adds each 128-k stage's tensor-core sum into f32 registers (unless fp8_fast_accum).
// Products of e4m3 values are exact; the sums are not bit-reproducible across kernels or split-K.
void gemm_fp8(const Tensor& xq, const Tensor& x_scale, const Tensor& wq, const Tensor& w_scale, Tensor& y,
              cudaStream_t stream, const Gemm8Options& options = {});

// Decode attention (one query token per sequence) over the paged KV cache of one layer
// (include/lowbit/kv/kv_cache.h layout): q f16 [B, Hq, D]; k_data/v_data [blocks, Hkv, block_size, D]
// of f16, u8 or u4; k_params/v_params f32 [blocks, Hkv, block_size, 2]
// (scale, zero) for u8/u4; block_tables s32 [B, max_blocks]; seq_lens s32 [B] (on the device);
// max_seq_len >= every seq_len (decides the split-KV grid, so it is graph-capture friendly);
// out f16 [B, Hq, D]. split_tokens = 0 picks the split size itself. D in {64, 80, 96, 128, 256} (80 and
// 96 only when built with LOWBIT_ATTN_ALL_INSTANCES=ON), Hq/Hkv <= 16 (groups over 8 run as slices of 8
// heads, each reading the K/V once; registered as decode_attention_sm80; other shapes throw NotSupported).
// K and V types may differ (e.g. u8 K with u4 V).
// Per-channel u4 K (window defined; k_params f32 [blocks, Hkv, 2, D]): each sequence's complete blocks are
// read as codes and its last (len % block_size) keys from the window rows; V per token as above.
void decode_attention(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                      const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_lens,
                      int max_seq_len, float scale, Tensor& out, int split_tokens, cudaStream_t stream,
                      const KWindow& window = {});

}  // namespace lowbit::cuda
