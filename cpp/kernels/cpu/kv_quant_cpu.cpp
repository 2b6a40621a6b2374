// Row conversions and the integer KV format on the CPU; kv_write quantizes on write.
#include "kernels/cpu/kv_quant_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace lowbit::cpu {

void load_row_f32(const void* src, ScalarType t, int64_t n, float* dst) {
  switch (t) {
    case ScalarType::f32:
      std::copy_n(static_cast<const float*>(src), n, dst);
      return;
    case ScalarType::f16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      for (; i < n; ++i) dst[i] = f16_bits_to_f32(s[i]);
      return;
    }
    case ScalarType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(s[i]);
      return;
    }
    default:
      LOWBIT_NOT_SUPPORTED("load_row_f32: dtype ", name_of(t), " (expected f32, f16 or bf16)");
  }
}

void store_row_f32(const float* src, ScalarType t, int64_t n, void* dst) {
  switch (t) {
    case ScalarType::f32:
      std::copy_n(src, n, static_cast<float*>(dst));
      return;
    case ScalarType::f16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
      // Hardware conversion rounds to nearest even like f32_to_f16_bits (NaN payloads may differ).
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
      for (; i < n; ++i) d[i] = f32_to_f16_bits(src[i]);
      return;
    }
    case ScalarType::bf16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if defined(__AVX2__)
      // Round to nearest even on the bit pattern, NaN kept quiet: the same rule as f32_to_bf16_bits.
      const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
      const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
      for (; i + 8 <= n; i += 8) {
        const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, half), lsb), 16);
        const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
        const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
        const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
        // Pack the eight 32-bit results to 16 bits (packus works per 128-bit lane, then fix the order).
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
      }
#endif
      for (; i < n; ++i) d[i] = f32_to_bf16_bits(src[i]);
      return;
    }
    default:
      LOWBIT_NOT_SUPPORTED("store_row_f32: dtype ", name_of(t), " (expected f32, f16 or bf16)");
  }
}

void kv_range_params(const float* x, int64_t n, int64_t stride, int bits, float* scale, float* zero) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  *scale = (hi - lo) / static_cast<float>((1 << bits) - 1);
  *zero = lo;
}

uint8_t kv_code(float x, float scale, float zero, int bits) {
  // A constant row (or one so narrow that the scale underflows) is exactly `zero`: store q = 0.
  const float q = scale > 0.f ? std::nearbyint((x - zero) / scale) : 0.f;
  return static_cast<uint8_t>(std::clamp(q, 0.f, static_cast<float>((1 << bits) - 1)));
}

namespace {

// Packs n codes code(i) into bytes of `bits`-wide fields, little-end first.
template <typename F>
void pack_codes(int64_t n, int bits, uint8_t* out, F code) {
  if (bits == 8) {
    for (int64_t i = 0; i < n; ++i) out[i] = code(i);
    return;
  }
  const int per_byte = 8 / bits;
  for (int64_t i = 0; i < n; i += per_byte) {
    uint8_t b = 0;
    for (int j = 0; j < per_byte && i + j < n; ++j) b = static_cast<uint8_t>(b | (code(i + j) << (bits * j)));
    out[i / per_byte] = b;
  }
}

void check_bits(int bits, const char* fn) {
  if (bits != 8 && bits != 4 && bits != 2) LOWBIT_NOT_SUPPORTED(fn, ": ", bits, "-bit KV (supported: 8, 4, 2)");
}

}  // namespace

void quantize_kv_row(const float* x, int64_t n, int bits, uint8_t* codes, float* params) {
  check_bits(bits, "quantize_kv_row");
  kv_range_params(x, n, 1, bits, &params[0], &params[1]);
  const float scale = params[0], zero = params[1];
  pack_codes(n, bits, codes, [&](int64_t i) { return kv_code(x[i], scale, zero, bits); });
}

void quantize_k_block_per_channel(const float* x, int64_t rows, int64_t head_dim, int bits, uint8_t* codes,
                                  float* params) {
  check_bits(bits, "quantize_k_block_per_channel");
  float* scales = params;
  float* zeros = params + head_dim;
  for (int64_t d = 0; d < head_dim; ++d) kv_range_params(x + d, rows, head_dim, bits, &scales[d], &zeros[d]);
  const int64_t row_bytes = (head_dim * bits + 7) / 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * head_dim;
    pack_codes(head_dim, bits, codes + r * row_bytes,
               [&](int64_t d) { return kv_code(xr[d], scales[d], zeros[d], bits); });
  }
}

namespace {

// Unpacks n codes of `bits` to floats (no scale).
void unpack_codes(const uint8_t* codes, int64_t n, int bits, float* out) {
  const int per_byte = 8 / bits, mask = (1 << bits) - 1;
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>((codes[i / per_byte] >> (bits * (i % per_byte))) & mask);
}

}  // namespace

void load_k_rows_per_channel(const uint8_t* data, const float* params, ScalarType t, int64_t rows, int64_t head_dim,
                             float* out) {
  const int bits = bits_of(t);
  const int64_t row_bytes = bytes_for(t, head_dim);
  const float* scales = params;
  const float* zeros = params + head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * head_dim;
    unpack_codes(data + r * row_bytes, head_dim, bits, o);
    for (int64_t d = 0; d < head_dim; ++d) o[d] = o[d] * scales[d] + zeros[d];
  }
}

void load_k_block_rows(const KVCache& cache, int layer, int32_t block, int64_t head, int64_t rows, bool quantized,
                       float* out) {
  const KVCacheConfig& cfg = cache.config();
  const int64_t D = cfg.head_dim, bs = cfg.block_size;
  const int64_t row0 = (int64_t(block) * cfg.num_kv_heads + head) * bs;
  const uint8_t* data = static_cast<const uint8_t*>(cache.k_data(layer).data_ptr()) + row0 * bytes_for(cfg.k_type, D);
  const Tensor& kp = cache.k_params(layer);
  if (!cfg.k_per_channel) {
    load_kv_rows(data, kp.defined() ? kp.data<float>() + 2 * row0 : nullptr, cfg.k_type, rows, D, out);
    return;
  }
  if (quantized) {
    load_k_rows_per_channel(data, kp.data<float>() + (int64_t(block) * cfg.num_kv_heads + head) * 2 * D, cfg.k_type,
                            rows, D, out);
    return;
  }
  const uint16_t* res = cache.k_residual(layer).find(block);
  LOWBIT_CHECK(res != nullptr, "paged_attention: per-channel K block ", block, " of layer ", layer,
               " has no residual (f16 window) rows: read before written, or quantized in an earlier step");
  load_row_f32(res + head * bs * D, ScalarType::f16, rows * D, out);
}

void dequantize_kv_row(const uint8_t* codes, int64_t n, int bits, const float* params, float* out) {
  const float scale = params[0], zero = params[1];
  int64_t i = 0;  // elements done by the vector loops
  if (bits == 8) {
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 vs = _mm256_set1_ps(scale), vz = _mm256_set1_ps(zero);
    for (; i + 8 <= n; i += 8) {
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), vs, vz));
    }
#endif
    for (; i < n; ++i) out[i] = static_cast<float>(codes[i]) * scale + zero;
  } else if (bits == 4) {
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 vs = _mm256_set1_ps(scale), vz = _mm256_set1_ps(zero);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    for (; i + 16 <= n; i += 16) {
      // 8 bytes = 16 codes; interleaving the low and high nibbles restores element order.
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2));
      const __m128i q = _mm_unpacklo_epi8(_mm_and_si128(b, low4), _mm_and_si128(_mm_srli_epi16(b, 4), low4));
      const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
      const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(f0, vs, vz));
      _mm256_storeu_ps(out + i + 8, _mm256_fmadd_ps(f1, vs, vz));
    }
#endif
    for (; i < n; ++i) out[i] = static_cast<float>((codes[i / 2] >> (4 * (i % 2))) & 0xf) * scale + zero;
  } else if (bits == 2) {
    unpack_codes(codes, n, 2, out);
    for (; i < n; ++i) out[i] = out[i] * scale + zero;
  } else {
    LOWBIT_NOT_SUPPORTED("dequantize_kv_row: ", bits, "-bit KV (supported: 8, 4, 2)");
  }
}

void load_kv_rows(const uint8_t* data, const float* params, ScalarType t, int64_t rows, int64_t head_dim,
                  float* out) {
  const int64_t row_bytes = bytes_for(t, head_dim);
  if (is_quantized_kv_type(t)) {
    const int bits = bits_of(t);
    for (int64_t r = 0; r < rows; ++r)
      dequantize_kv_row(data + r * row_bytes, head_dim, bits, params + 2 * r, out + r * head_dim);
  } else {
    load_row_f32(data, t, rows * head_dim, out);  // rows of one head are contiguous
  }
}

namespace {

// Writes one side (K or V) of every token into the cache pool of `layer`.
void write_side(const Tensor& src, const Tensor& pool, const Tensor& params, int block_size, const int32_t* slots) {
  const int64_t T = src.size(0), H = src.size(1), D = src.size(2);
  const ScalarType ct = pool.dtype();
  const int64_t row_bytes = bytes_for(ct, D);
  uint8_t* base = static_cast<uint8_t*>(pool.data_ptr());
  float* pbase = params.defined() ? params.data<float>() : nullptr;
  const int64_t elem = bytes_for(src.dtype(), 1);
  const char* sbase = static_cast<const char*>(src.data_ptr());
  // A decode step writes a handful of rows: not worth waking the thread team.
#pragma omp parallel if (T * H * D >= (1 << 14))
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        const int64_t b = slot / block_size, off = slot % block_size;
        const int64_t r = (b * H + h) * block_size + off;  // row index in [blocks, heads, block_size]
        const void* s = sbase + (t * src.stride(0) + h * src.stride(1)) * elem;
        if (is_quantized_kv_type(ct)) {
          load_row_f32(s, src.dtype(), D, row.data());
          quantize_kv_row(row.data(), D, bits_of(ct), base + r * row_bytes, pbase + 2 * r);
        } else if (ct == src.dtype()) {
          std::copy_n(static_cast<const uint8_t*>(s), row_bytes, base + r * row_bytes);
        } else {
          load_row_f32(s, src.dtype(), D, row.data());
          store_row_f32(row.data(), ct, D, base + r * row_bytes);
        }
      }
    }
  }
}

// Per-channel K: rows go to the f16 residual window of their block; a block whose last token arrives is
// quantized per channel into the pool and leaves the window after this step (k_residual_store.h).
void write_k_per_channel(KVCache& cache, int layer, const Tensor& src, const int32_t* slots) {
  const KVCacheConfig& cfg = cache.config();
  const int64_t T = src.size(0), H = src.size(1), D = src.size(2), bs = cfg.block_size;
  KResidualStore& store = cache.k_residual(layer);
  store.release_retired();  // blocks sealed by the previous step: its attention is done with their f16 rows
  std::vector<uint16_t*> dst(static_cast<size_t>(T), nullptr);  // each token's residual block (acquired serially)
  std::vector<int32_t> filled;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    const int32_t b = slots[t] / cfg.block_size;
    dst[size_t(t)] = store.acquire(b);
    if (slots[t] % bs == bs - 1) filled.push_back(b);
  }
  const int64_t elem = bytes_for(src.dtype(), 1);
  const char* sbase = static_cast<const char*>(src.data_ptr());
#pragma omp parallel if (T * H * D >= (1 << 14))
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        if (slots[t] < 0) continue;
        const int64_t off = slots[t] % bs;
        load_row_f32(sbase + (t * src.stride(0) + h * src.stride(1)) * elem, src.dtype(), D, row.data());
        store_row_f32(row.data(), ScalarType::f16, D, dst[size_t(t)] + (h * bs + off) * D);
      }
    }
  }
  if (filled.empty()) return;
  const int bits = bits_of(cfg.k_type);
  const int64_t row_bytes = bytes_for(cfg.k_type, D);
  uint8_t* codes = static_cast<uint8_t*>(cache.k_data(layer).data_ptr());
  float* params = cache.k_params(layer).data<float>();
  std::vector<float> x(static_cast<size_t>(bs * D));
  for (const int32_t b : filled) {
    const uint16_t* res = store.find(b);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = int64_t(b) * H + h;
      load_row_f32(res + h * bs * D, ScalarType::f16, bs * D, x.data());
      quantize_k_block_per_channel(x.data(), bs, D, bits, codes + bh * bs * row_bytes, params + bh * 2 * D);
    }
    store.retire(b);
  }
}

}  // namespace

void kv_write_cpu(KVCache& cache, int layer, const Tensor& k, const Tensor& v, const Tensor& slot_mapping) {
  const int32_t* slots = slot_mapping.data<int32_t>();
  const int bs = cache.config().block_size;
  if (cache.config().k_per_channel)
    write_k_per_channel(cache, layer, k, slots);
  else
    write_side(k, cache.k_data(layer), cache.k_params(layer), bs, slots);
  write_side(v, cache.v_data(layer), cache.v_params(layer), bs, slots);
}

}  // namespace lowbit::cpu
