// CPU helpers shared by kv_write and paged attention: converting rows of f32/f16/bf16 to and from
// f32, and the per-token per-head asymmetric integer KV format (QServe §4.1, dynamic):
//   zero = min(x), scale = (max(x) - min(x)) / (2^bits - 1), q = clamp(round((x - zero) / scale)),
//   x' = q * scale + zero.  Sub-byte rows pack little-end first: u4 element 2i in the low nibble of
//   byte i, u2 element 4i + j in bits 2j..2j+1 of byte i.
// Per-channel K (kv_cache.h) applies the same rule down each channel of a full block (G = block_size
// tokens); a partly filled block's K rows stay f16 in the cache's residual store until it fills.
#pragma once
#include <cstdint>

#include "lowbit/core/dtype.h"
#include "lowbit/core/tensor.h"
#include "lowbit/kv/kv_cache.h"

namespace lowbit::cpu {

// dst[i] = float(src[i]) for f32/f16/bf16 rows.
void load_row_f32(const void* src, ScalarType t, int64_t n, float* dst);
// dst[i] = round_to_nearest_even(src[i]) for f32/f16/bf16 rows.
void store_row_f32(const float* src, ScalarType t, int64_t n, void* dst);

// Quantizes one row of n values to `bits` (8, 4 or 2), writing packed codes and params[0..1] = (scale, zero).
void quantize_kv_row(const float* x, int64_t n, int bits, uint8_t* codes, float* params);
// (scale, zero) of n values by the rule above.
void kv_range_params(const float* x, int64_t n, int64_t stride, int bits, float* scale, float* zero);
// The code of x under (scale, zero) at `bits`.
uint8_t kv_code(float x, float scale, float zero, int bits);
// x'[i] = q[i] * scale + zero for one packed row of n codes.
void dequantize_kv_row(const uint8_t* codes, int64_t n, int bits, const float* params, float* out);

// Reads `rows` consecutive token rows (head_dim values each) of one cache head as f32, whatever the
// cache type: `data` points at the first row's bytes, `params` at its (scale, zero) pair (integer types).
void load_kv_rows(const uint8_t* data, const float* params, ScalarType t, int64_t rows, int64_t head_dim, float* out);

// Per-channel K of one head of one full block: x [rows, head_dim] f32 -> packed token rows of codes and
// params [2, head_dim] (scales, then zeros), each channel over the rows.
void quantize_k_block_per_channel(const float* x, int64_t rows, int64_t head_dim, int bits, uint8_t* codes,
                                  float* params);
// The first `rows` token rows of one head of a per-channel K block as f32 (params [2, head_dim]).
void load_k_rows_per_channel(const uint8_t* data, const float* params, ScalarType t, int64_t rows, int64_t head_dim,
                             float* out);
// K rows [rows, head_dim] of one head of a block for attention: per-channel K reads the codes when
// `quantized`, else the residual f16 rows (a partly full block, or one quantized in this step read by a
// query before its last token); other formats go to load_kv_rows.
void load_k_block_rows(const KVCache& cache, int layer, int32_t block, int64_t head, int64_t rows, bool quantized,
                       float* out);

// Writes token rows k/v [T, Hkv, D] (f32/f16/bf16, last dim contiguous) into their cache slots
// (s32 [T]; a negative slot skips the token), quantizing for integer cache types.
// Arguments are validated by ops::kv_write.
void kv_write_cpu(KVCache& cache, int layer, const Tensor& k, const Tensor& v, const Tensor& slot_mapping);

}  // namespace lowbit::cpu
