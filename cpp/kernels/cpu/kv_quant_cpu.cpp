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

void quantize_kv_row(const float* x, int64_t n, int bits, uint8_t* codes, float* params) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const int qmax = (1 << bits) - 1;
  const float scale = (hi - lo) / static_cast<float>(qmax);
  params[0] = scale;
  params[1] = lo;
  // A constant row (or one so narrow that the scale underflows) is exactly `zero`: store q = 0.
  auto code = [&](int64_t i) {
    const float q = scale > 0.f ? std::nearbyint((x[i] - lo) / scale) : 0.f;
    return static_cast<uint8_t>(std::clamp(q, 0.f, static_cast<float>(qmax)));
  };
  if (bits == 8) {
    for (int64_t i = 0; i < n; ++i) codes[i] = code(i);
  } else if (bits == 4) {
    for (int64_t i = 0; i < n; i += 2) {
      const uint8_t hi_nibble = i + 1 < n ? code(i + 1) : 0;
      codes[i / 2] = static_cast<uint8_t>(code(i) | (hi_nibble << 4));
    }
  } else {
    LOWBIT_NOT_SUPPORTED("quantize_kv_row: ", bits, "-bit KV (supported: 8, 4)");
  }
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
  } else {
    LOWBIT_NOT_SUPPORTED("dequantize_kv_row: ", bits, "-bit KV (supported: 8, 4)");
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

}  // namespace

void kv_write_cpu(KVCache& cache, int layer, const Tensor& k, const Tensor& v, const Tensor& slot_mapping) {
  const int32_t* slots = slot_mapping.data<int32_t>();
  const int bs = cache.config().block_size;
  write_side(k, cache.k_data(layer), cache.k_params(layer), bs, slots);
  write_side(v, cache.v_data(layer), cache.v_params(layer), bs, slots);
}

}  // namespace lowbit::cpu
