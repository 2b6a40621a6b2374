// KVCache: per-layer storage shapes and types, byte accounting, copy_block, config errors.
#include <gtest/gtest.h>

#include <cstring>

#include "lowbit/kv/kv_cache.h"

using namespace lowbit;

namespace {

template <typename F>
std::string error_of(F&& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "<no error>";
}

KVCacheConfig make_config(ScalarType k, ScalarType v) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.block_size = 16;
  c.num_blocks = 5;
  c.k_type = k;
  c.v_type = v;
  return c;
}

}  // namespace

TEST(KvCache, LayoutPerType) {
  for (ScalarType k : {ScalarType::f32, ScalarType::f16, ScalarType::bf16, ScalarType::u8, ScalarType::u4}) {
    for (ScalarType v : {ScalarType::f16, ScalarType::u4}) {
      KVCache cache(make_config(k, v));
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(cache.k_data(l).shape(), (Shape{5, 3, 16, 64}));
        EXPECT_EQ(cache.k_data(l).dtype(), k);
        EXPECT_EQ(cache.v_data(l).dtype(), v);
        EXPECT_EQ(cache.k_params(l).defined(), is_quantized_kv_type(k));
        EXPECT_EQ(cache.v_params(l).defined(), is_quantized_kv_type(v));
        if (is_quantized_kv_type(k)) EXPECT_EQ(cache.k_params(l).shape(), (Shape{5, 3, 16, 2}));
      }
      EXPECT_EQ(cache.total_bytes(), KVCache::bytes_per_token(cache.config()) * 5 * 16);
    }
  }
}

TEST(KvCache, BytesPerTokenCountsDataAndParams) {
  // 2 layers * 3 heads * (u4: 64/2 bytes + 8 bytes (scale, zero) ; f16: 128 bytes)
  EXPECT_EQ(KVCache::bytes_per_token(make_config(ScalarType::u4, ScalarType::f16)), 2 * 3 * (32 + 8 + 128));
  EXPECT_EQ(KVCache::bytes_per_token(make_config(ScalarType::u8, ScalarType::u8)), 2 * 3 * 2 * (64 + 8));
  EXPECT_EQ(KVCache::bytes_per_token(make_config(ScalarType::f32, ScalarType::bf16)), 2 * 3 * (256 + 128));
}

TEST(KvCache, CopyBlockCopiesEveryLayerDataAndParams) {
  KVCache cache(make_config(ScalarType::u4, ScalarType::bf16));
  // Distinct bytes everywhere, so a copy of the wrong block or a missed tensor shows.
  uint8_t counter = 1;
  auto fill = [&](const Tensor& t) {
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.nbytes(); ++i) p[i] = counter++ % 251;
  };
  for (int l = 0; l < 2; ++l) {
    fill(cache.k_data(l));
    fill(cache.v_data(l));
    fill(cache.k_params(l));
  }
  std::vector<Tensor> before;
  for (int l = 0; l < 2; ++l)
    for (const Tensor* t : {&cache.k_data(l), &cache.v_data(l), &cache.k_params(l)}) before.push_back(t->clone());
  cache.copy_block(3, 1);
  size_t i = 0;
  for (int l = 0; l < 2; ++l) {
    for (const Tensor* t : {&cache.k_data(l), &cache.v_data(l), &cache.k_params(l)}) {
      const Tensor& old = before[i++];
      const int64_t block_bytes = t->nbytes() / 5;
      const auto* now = static_cast<const uint8_t*>(t->data_ptr());
      const auto* was = static_cast<const uint8_t*>(old.data_ptr());
      for (int64_t b = 0; b < 5; ++b) {
        const int64_t from = (b == 1 ? 3 : b) * block_bytes;
        EXPECT_EQ(std::memcmp(now + b * block_bytes, was + from, static_cast<size_t>(block_bytes)), 0)
            << "layer " << l << " block " << b << " of " << t->str();
      }
    }
  }
  ErrorKind kind{};
  EXPECT_NE(error_of([&] { cache.copy_block(5, 0); }, &kind).find("'src' = 5 out of range [0, 5)"), std::string::npos);
  EXPECT_EQ(kind, ErrorKind::kIndex);
  EXPECT_NE(error_of([&] { cache.copy_block(0, -1); }).find("'dst' = -1"), std::string::npos);
}

TEST(KvCache, ConfigErrorsNameTheField) {
  ErrorKind kind{};
  auto c = make_config(ScalarType::u2, ScalarType::f16);
  c.k_per_channel = true;
  c.head_dim = 72;
  c.device = Device::cuda(0);  // the GPU's per-channel K wants 16-aligned groups: refused before any memory is taken
  std::string msg = error_of([&] { KVCache x(c); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kValue);
  EXPECT_NE(msg.find("per-channel K on cuda:0 needs block_size (the K group) and head_dim multiples of 16, got 16 "
                     "and 72"), std::string::npos) << msg;
  c = make_config(ScalarType::f16, ScalarType::e4m3);
  msg = error_of([&] { KVCache x(c); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kType);
  EXPECT_NE(msg.find("v_type must be one of f32, f16, bf16, u8, u4, u2; got e4m3"), std::string::npos) << msg;
  c = make_config(ScalarType::f16, ScalarType::u4);
  c.head_dim = 63;
  EXPECT_NE(error_of([&] { KVCache x(c); }).find("packs 2 values per byte and needs head_dim divisible by 2, got 63"), std::string::npos);
  c = make_config(ScalarType::f16, ScalarType::f16);
  c.num_kv_heads = 0;
  EXPECT_NE(error_of([&] { KVCache x(c); }).find("'num_kv_heads' must be positive, got 0"), std::string::npos);
  c = make_config(ScalarType::f16, ScalarType::f16);
  c.block_size = -4;
  EXPECT_NE(error_of([&] { KVCache::bytes_per_token(c); }).find("'block_size' must be positive, got -4"),
            std::string::npos);
  EXPECT_TRUE(is_quantized_kv_type(ScalarType::u8));
  EXPECT_FALSE(is_quantized_kv_type(ScalarType::bf16));
}
