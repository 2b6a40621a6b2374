// kv_write on the CPU: float cache types store the (rounded) input exactly; integer types follow the
// per-token per-head asymmetric format (QServe §4.1): zero = min, scale = (max - min) / (2^b - 1),
// codes within half a step of (x - zero) / scale, min -> 0, max -> 2^b - 1, round trip within scale/2.
// Slots not written (and tokens with slot -1) keep their poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/cpu/kv_quant_cpu.h"

using namespace lowbit;

namespace {

float element(const Tensor& x, int64_t i) {
  switch (x.dtype()) {
    case ScalarType::f32: return x.data<float>()[i];
    case ScalarType::f16: return f16_bits_to_f32(x.data<uint16_t>()[i]);
    default: return bf16_bits_to_f32(x.data<uint16_t>()[i]);
  }
}

Tensor random_rows(int64_t T, int64_t H, int64_t D, ScalarType t, std::mt19937& rng, bool with_constant_row) {
  Tensor x = Tensor::empty({T, H, D}, t);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) {
    float v = nd(rng) * (i % 7 == 0 ? 4.f : 1.f);  // a few outliers widen the range
    if (with_constant_row && i < D) v = 0.375f;     // token 0 head 0 is constant: scale 0
    if (t == ScalarType::f32) x.data<float>()[i] = v;
    if (t == ScalarType::f16) x.data<uint16_t>()[i] = f32_to_f16_bits(v);
    if (t == ScalarType::bf16) x.data<uint16_t>()[i] = f32_to_bf16_bits(v);
  }
  return x;
}

// Checks one side (K or V) of the cache against the input rows.
void check_side(const Tensor& src, const Tensor& pool, const Tensor& params, const std::vector<int32_t>& slots,
                int bs) {
  const int64_t T = src.size(0), H = src.size(1), D = src.size(2);
  const ScalarType ct = pool.dtype();
  const int64_t row_bytes = bytes_for(ct, D);
  const auto* base = static_cast<const uint8_t*>(pool.data_ptr());
  std::vector<char> written(static_cast<size_t>(pool.numel() / D), 0);
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t r = ((slots[t] / bs) * H + h) * bs + slots[t] % bs;
      written[r] = 1;
      const uint8_t* row = base + r * row_bytes;
      std::vector<float> x(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) x[d] = element(src, (t * H + h) * D + d);
      if (!is_quantized_kv_type(ct)) {
        for (int64_t d = 0; d < D; ++d) {
          float got = 0;
          if (ct == ScalarType::f32) got = reinterpret_cast<const float*>(row)[d];
          if (ct == ScalarType::f16) {
            const uint16_t b = reinterpret_cast<const uint16_t*>(row)[d];
            ASSERT_EQ(b, f32_to_f16_bits(x[d]));
            got = f16_bits_to_f32(b);
          }
          if (ct == ScalarType::bf16) {
            const uint16_t b = reinterpret_cast<const uint16_t*>(row)[d];
            ASSERT_EQ(b, f32_to_bf16_bits(x[d]));
            got = bf16_bits_to_f32(b);
          }
          ASSERT_NEAR(got, x[d], std::abs(x[d]) * (ct == ScalarType::f32 ? 0 : 0x1p-8));
        }
        continue;
      }
      const int bits = bits_of(ct), qmax = (1 << bits) - 1;
      const float lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
      const float* p = params.data<float>() + 2 * r;
      ASSERT_EQ(p[1], lo) << "zero must be the row minimum";
      ASSERT_EQ(p[0], (hi - lo) / static_cast<float>(qmax)) << "scale must be (max - min) / (2^bits - 1)";
      const double scale = p[0];
      for (int64_t d = 0; d < D; ++d) {
        const int code = bits == 8 ? row[d] : (row[d / 2] >> (4 * (d % 2))) & 0xf;
        ASSERT_LE(code, qmax);
        if (scale == 0) {
          ASSERT_EQ(code, 0);
          continue;
        }
        const double exact = (static_cast<double>(x[d]) - lo) / scale;
        ASSERT_LE(std::abs(code - exact), 0.5 + 1e-4) << "d " << d;
        if (x[d] == lo) ASSERT_EQ(code, 0);
        if (x[d] == hi) ASSERT_EQ(code, qmax);
        // Round trip: within half a quantization step (plus f32 rounding of the params).
        const double back = code * scale + lo;
        ASSERT_LE(std::abs(back - x[d]), 0.5 * scale * (1 + 1e-4) + 1e-6 * std::abs(hi - lo));
      }
    }
  }
  // Rows no token was written to keep the 0xab poison bytes.
  for (size_t r = 0; r < written.size(); ++r) {
    if (written[r]) continue;
    for (int64_t b = 0; b < row_bytes; ++b) ASSERT_EQ(base[r * row_bytes + b], 0xab) << "row " << r;
  }
}

}  // namespace

class KvWrite : public ::testing::TestWithParam<std::tuple<ScalarType, ScalarType, int>> {};

TEST_P(KvWrite, QuantizesIntoSlots) {
  const auto [cache_type, input_type, D] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(D) * 31 + static_cast<uint32_t>(cache_type));
  KVCacheConfig cfg;
  cfg.num_layers = 2;
  cfg.num_kv_heads = 3;
  cfg.head_dim = D;
  cfg.block_size = 16;
  cfg.num_blocks = 8;
  cfg.k_type = cache_type;
  cfg.v_type = cache_type == ScalarType::u4 ? ScalarType::u8 : ScalarType::u4;  // K and V types differ
  KVCache cache(cfg);
  for (int l = 0; l < 2; ++l) {
    const_cast<Tensor&>(cache.k_data(l)).fill_bytes_(0xab);
    const_cast<Tensor&>(cache.v_data(l)).fill_bytes_(0xab);
  }
  const int64_t T = 101;  // large enough for the threaded path when D >= 64
  Tensor k = random_rows(T, 3, D, input_type, rng, true);
  Tensor v = random_rows(T, 3, D, input_type, rng, false);
  std::vector<int32_t> all(128);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> slots(all.begin(), all.begin() + T);
  slots[5] = -1;  // padding token: skipped
  Tensor slot_mapping = Tensor::empty({T}, ScalarType::s32);
  std::copy(slots.begin(), slots.end(), slot_mapping.data<int32_t>());
  cpu::kv_write_cpu(cache, 1, k, v, slot_mapping);
  check_side(k, cache.k_data(1), cache.k_params(1), slots, 16);
  check_side(v, cache.v_data(1), cache.v_params(1), slots, 16);
  // Layer 0 untouched.
  const auto* l0 = static_cast<const uint8_t*>(cache.k_data(0).data_ptr());
  for (int64_t b = 0; b < cache.k_data(0).nbytes(); ++b) ASSERT_EQ(l0[b], 0xab);
}

INSTANTIATE_TEST_SUITE_P(Types, KvWrite,
                         ::testing::Combine(::testing::Values(ScalarType::f32, ScalarType::f16, ScalarType::bf16,
                                                              ScalarType::u8, ScalarType::u4),
                                            ::testing::Values(ScalarType::f32, ScalarType::f16, ScalarType::bf16),
                                            ::testing::Values(64, 80, 2, 130)));

// Strided input (a view into a wider [T, 2*H, D] tensor) reads the right rows.
TEST(KvWriteStrided, ReadsRowsThroughStrides) {
  std::mt19937 rng(3);
  KVCacheConfig cfg;
  cfg.num_layers = 1;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.num_blocks = 2;
  cfg.k_type = ScalarType::u8;
  cfg.v_type = ScalarType::f32;
  KVCache cache(cfg);
  const_cast<Tensor&>(cache.k_data(0)).fill_bytes_(0xab);
  const_cast<Tensor&>(cache.v_data(0)).fill_bytes_(0xab);
  Tensor wide = random_rows(5, 4, 64, ScalarType::f32, rng, false);
  Tensor k = wide.slice(1, 0, 2), v = wide.slice(1, 2, 4);
  std::vector<int32_t> slots = {3, 4, 20, 0, 31};
  Tensor slot_mapping = Tensor::empty({5}, ScalarType::s32);
  std::copy(slots.begin(), slots.end(), slot_mapping.data<int32_t>());
  cpu::kv_write_cpu(cache, 0, k, v, slot_mapping);
  check_side(k.contiguous(), cache.k_data(0), cache.k_params(0), slots, 16);
  check_side(v.contiguous(), cache.v_data(0), cache.v_params(0), slots, 16);
}

// Round-trip error per bit width on Gaussian rows: the mean error shrinks ~16x from 4 to 8 bits.
TEST(KvQuantRow, RoundTripErrorPerBits) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  double mean_err[2] = {0, 0};
  const int bits_list[2] = {4, 8};
  for (int b = 0; b < 2; ++b) {
    for (int row = 0; row < 200; ++row) {
      std::vector<float> x(128), back(128);
      for (auto& v : x) v = nd(rng);
      std::vector<uint8_t> codes(128);
      float params[2];
      cpu::quantize_kv_row(x.data(), 128, bits_list[b], codes.data(), params);
      cpu::dequantize_kv_row(codes.data(), 128, bits_list[b], params, back.data());
      const float range = *std::max_element(x.begin(), x.end()) - *std::min_element(x.begin(), x.end());
      for (int i = 0; i < 128; ++i) {
        const double e = std::abs(back[i] - x[i]);
        ASSERT_LE(e, 0.5 * range / ((1 << bits_list[b]) - 1) * 1.0001 + 1e-6);
        mean_err[b] += e / (200 * 128);
      }
    }
  }
  // Uniform rounding error averages a quarter step: range/(4 * 15) vs range/(4 * 255).
  EXPECT_GT(mean_err[0] / mean_err[1], 12.0);
  EXPECT_LT(mean_err[0] / mean_err[1], 22.0);
}

// dequantize_kv_row (vector body and scalar tail) against an independent decode, every length 1..40.
TEST(KvQuantRow, DequantizeEveryLengthMatchesDecode) {
  std::mt19937 rng(21);
  for (int bits : {8, 4}) {
    for (int64_t n = 1; n <= 40; ++n) {
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (auto& c : codes) c = static_cast<uint8_t>(rng());
      const float params[2] = {0.037f, -1.25f};
      std::vector<float> out(static_cast<size_t>(n) + 1, std::nanf(""));
      cpu::dequantize_kv_row(codes.data(), n, bits, params, out.data());
      for (int64_t i = 0; i < n; ++i) {
        const int q = bits == 8 ? codes[i] : (codes[i / 2] >> (4 * (i % 2))) & 0xf;
        ASSERT_NEAR(out[i], q * 0.037 - 1.25, 1e-6) << "bits " << bits << " n " << n << " i " << i;
      }
      ASSERT_TRUE(std::isnan(out[n])) << "wrote past the row";
    }
  }
}

// store_row_f32 (vector body and tail) gives exactly the core conversions, specials included.
TEST(RowConversion, StoreMatchesCoreConversionsBitForBit) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) {  // every exponent, sign and mantissa pattern
    const uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (!std::isnan(f)) x.push_back(f);
  }
  for (float s : {0.f, -0.f, 65504.f, 65520.f, 1e-8f, -6.1e-5f, 3.0e38f, INFINITY, -INFINITY, 1.00390625f,
                  1.01171875f})  // f16 max, overflow edge, subnormals, bf16 ties
    x.push_back(s);
  for (int64_t n : {static_cast<int64_t>(x.size()), int64_t{7}, int64_t{9}}) {
    std::vector<uint16_t> h(static_cast<size_t>(n) + 1, 0xdead), b(static_cast<size_t>(n) + 1, 0xdead);
    cpu::store_row_f32(x.data(), ScalarType::f16, n, h.data());
    cpu::store_row_f32(x.data(), ScalarType::bf16, n, b.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], f32_to_f16_bits(x[i])) << "f16 of " << x[i];
      ASSERT_EQ(b[i], f32_to_bf16_bits(x[i])) << "bf16 of " << x[i];
    }
    EXPECT_EQ(h[n], 0xdead);
    EXPECT_EQ(b[n], 0xdead);
  }
  // NaN stays NaN (payloads may differ from the scalar path).
  std::vector<float> nans(9, std::nanf(""));
  std::vector<uint16_t> h(9), b(9);
  cpu::store_row_f32(nans.data(), ScalarType::f16, 9, h.data());
  cpu::store_row_f32(nans.data(), ScalarType::bf16, 9, b.data());
  for (int i = 0; i < 9; ++i) {
    EXPECT_TRUE(std::isnan(f16_bits_to_f32(h[i])));
    EXPECT_TRUE(std::isnan(bf16_bits_to_f32(b[i])));
  }
}
