// CPU helpers shared by kv_write and paged attention: converting rows of f32/f16/bf16 to and from
// f32, and the per-token per-head asymmetric integer KV format (QServe §4.1, dynamic):
//   zero = min(x), scale = (max(x) - min(x)) / (2^bits - 1), q = clamp(round((x - zero) / scale)),
//   x' = q * scale + zero.  Sub-byte rows pack element 2i in the low nibble of byte i.
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

// Quantizes one row of n values to `bits` (8 or 4), writing packed codes and params[0..1] = (scale, zero).
void quantize_kv_row(const float* x, int64_t n, int bits, uint8_t* codes, float* params);
// x'[i] = q[i] * scale + zero for one packed row of n codes.
void dequantize_kv_row(const uint8_t* codes, int64_t n, int bits, const float* params, float* out);

// Reads `rows` consecutive token rows (head_dim values each) of one cache head as f32, whatever the
// cache type: `data` points at the first row's bytes, `params` at its (scale, zero) pair (integer types).
void load_kv_rows(const uint8_t* data, const float* params, ScalarType t, int64_t rows, int64_t head_dim, float* out);

// Writes token rows k/v [T, Hkv, D] (f32/f16/bf16, last dim contiguous) into their cache slots
// (s32 [T]; a negative slot skips the token), quantizing for integer cache types.
// Arguments are validated by ops::kv_write.
void kv_write_cpu(KVCache& cache, int layer, const Tensor& k, const Tensor& v, const Tensor& slot_mapping);

}  // namespace lowbit::cpu
