#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lowbit/core/allocator.h"
#include "lowbit/core/dlpack.h"
#include "lowbit/core/tensor.h"

using namespace lowbit;

TEST(Dtype, SizesAndNames) {
  EXPECT_EQ(bits_of(ScalarType::u4), 4);
  EXPECT_EQ(bytes_for(ScalarType::u4, 7), 4);
  EXPECT_EQ(bytes_for(ScalarType::u2, 5), 2);
  EXPECT_EQ(bytes_for(ScalarType::bf16, 3), 6);
  for (int i = 0; i < kNumScalarTypes; ++i) {
    auto t = static_cast<ScalarType>(i);
    EXPECT_EQ(scalar_type_from_name(name_of(t)), t);
  }
  EXPECT_THROW(scalar_type_from_name("f13"), Error);
}

TEST(Dtype, HalfConversionsRoundTripEveryF16) {
  // Every finite f16 bit pattern must survive f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    const float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(f32_to_f16_bits(f), h) << "pattern " << h;
  }
  // Round to nearest even, against a double reference on random values.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  for (int i = 0; i < 10000; ++i) {
    const float f = u(rng) * (i % 2 ? 1e-4f : 1.f);
    const float r = f16_bits_to_f32(f32_to_f16_bits(f));
    if (std::fabs(f) > 65504.f) continue;
    EXPECT_LE(std::fabs(r - f), std::fabs(f) * (1.0 / 2048) + 6e-8) << f;
  }
}

TEST(Dtype, Fp8MatchesSpec) {
  EXPECT_EQ(e4m3_bits_to_f32(0x7e), 448.f);
  EXPECT_EQ(f32_to_e4m3_bits(1000.f), 0x7e);  // saturates
  EXPECT_EQ(e4m3_bits_to_f32(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(e5m2_bits_to_f32(0x7b), 57344.f);
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_e4m3_bits(e4m3_bits_to_f32(static_cast<uint8_t>(v))), v == 0x80 ? 0x80 : v);
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::empty({4, 6}, ScalarType::f32);
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor s = t.slice(1, 2, 5);
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_FALSE(s.is_contiguous());
  Tensor c = s.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.data<float>()[0], 2.f);
  EXPECT_EQ(c.data<float>()[3], 8.f);
  Tensor r = t.select(0, 1);
  EXPECT_EQ(r.data<float>()[0], 6.f);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_EQ(t.view({-1, 3}).shape(), (Shape{8, 3}));
}

TEST(Tensor, SubByteSizes) {
  Tensor t = Tensor::empty({3, 10}, ScalarType::u4);
  EXPECT_EQ(t.nbytes(), 15);
  EXPECT_THROW(Tensor::empty({3, 3}, ScalarType::u4), Error);
  EXPECT_EQ(t.as_dtype_view(ScalarType::u8).shape(), (Shape{3, 5}));
}

TEST(Tensor, ErrorsNameTheArgument) {
  Tensor t = Tensor::empty({2, 3}, ScalarType::f16);
  try {
    check_dtype(t, ScalarType::f32, "gemm", "x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kType);
    EXPECT_NE(std::string(e.what()).find("gemm: argument 'x' must have dtype f32, got f16"), std::string::npos);
  }
}

TEST(DLPack, RoundTripKeepsStorageAlive) {
  const auto before = host_allocator().stats().allocated_bytes;
  {
    Tensor t = Tensor::empty({5, 7}, ScalarType::f32);
    t.data<float>()[3] = 1.5f;
    DLManagedTensor* m = to_dlpack(t.slice(0, 1, 3));
    t = Tensor();  // the export alone keeps the memory alive now
    Tensor back = from_dlpack(m);
    EXPECT_EQ(back.shape(), (Shape{2, 7}));
    EXPECT_EQ(back.byte_offset(), 7 * 4);
    back.data<float>()[0] = 2.f;
  }
  EXPECT_EQ(host_allocator().stats().allocated_bytes, before);  // freed exactly once
}
