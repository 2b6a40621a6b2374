// pack_weight / unpack_weight dispatch: bit-exact cpu round trip for every format, target errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "lowbit/quant/pack.h"

namespace lowbit {
namespace {

Tensor random_weight(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.1f);
  Tensor w = Tensor::empty({n, k}, ScalarType::f32);
  for (int64_t i = 0; i < n * k; ++i) w.data<float>()[i] = dist(rng);
  return w;
}

void expect_same_bytes(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  ASSERT_EQ(std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()), 0) << what;
}

TEST(QuantPack, CpuRoundTripEveryFormat) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 64}, {13, 130}, {33, 576}})
    for (WeightFormat f : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::w8,
                           WeightFormat::w4, WeightFormat::qoq, WeightFormat::liquid, WeightFormat::e4m3})
      for (bool sym : {false, true}) {
        if (sym && f != WeightFormat::w4) continue;
        const QuantizedWeight w = quantize_weight(random_weight(n, k, 5 + n + k), f, 64, sym);
        const PackedWeight p = pack_weight(w, PackTarget::cpu, Device::cpu());
        EXPECT_EQ(p.target, PackTarget::cpu);
        EXPECT_EQ(p.format, f);
        const QuantizedWeight u = unpack_weight(p);
        EXPECT_EQ(u.format, f);
        EXPECT_EQ(u.n, n);
        EXPECT_EQ(u.k, k);
        EXPECT_EQ(u.group, w.group);
        EXPECT_EQ(u.symmetric, sym);
        expect_same_bytes(u.q, w.q, "q");
        expect_same_bytes(u.scales, w.scales, "scales");
        expect_same_bytes(u.zeros, w.zeros, "zeros");
        expect_same_bytes(u.channel_scales, w.channel_scales, "channel_scales");
      }
}

// Runs where a GPU is visible (a CUDA build); the sm80 layout itself is tested by test_gpu_pack_sm80.
TEST(QuantPack, Sm80DispatchRoundTripOnGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  for (bool sym : {false, true}) {
    const QuantizedWeight w = quantize_weight(random_weight(40, 576, 3), WeightFormat::w4, 128, sym);
    const PackedWeight p = pack_weight(w, PackTarget::sm80, Device::cuda(0));
    EXPECT_EQ(p.target, PackTarget::sm80);
    EXPECT_TRUE(p.data.device().is_cuda());
    const QuantizedWeight u = unpack_weight(p);
    expect_same_bytes(u.q, w.q, "q");
    expect_same_bytes(u.scales, w.scales, "scales");
    expect_same_bytes(u.zeros, w.zeros, "zeros");
  }
}

template <typename Fn>
void expect_error(Fn fn, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL() << "expected an error mentioning " << parts[0];
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(QuantPack, TargetErrors) {
  const QuantizedWeight w = quantize_weight(random_weight(16, 128, 1), WeightFormat::qoq, 128);
  expect_error([&] { pack_weight(w, PackTarget::sm90, Device::cpu()); }, ErrorKind::kNotSupported,
               {"pack_weight", "sm90", "qoq"});
  expect_error([&] { pack_weight(w, PackTarget::sm80, Device::cpu()); }, ErrorKind::kValue,
               {"pack_weight", "sm80", "CUDA", "cpu"});
  expect_error([&] { pack_weight(w, PackTarget::cpu, Device::cuda(0)); }, ErrorKind::kValue,
               {"pack_weight", "cpu", "cuda:0"});
  QuantizedWeight broken = w;
  broken.channel_scales = Tensor();
  expect_error([&] { pack_weight(broken, PackTarget::cpu, Device::cpu()); }, ErrorKind::kValue,
               {"pack_weight", "channel_scales"});
  EXPECT_EQ(pack_target_from_name("sm80"), PackTarget::sm80);
  EXPECT_STREQ(name_of(PackTarget::sm90), "sm90");
  expect_error([&] { pack_target_from_name("sm70"); }, ErrorKind::kValue, {"sm70", "cpu, sm80, sm90"});
}

}  // namespace
}  // namespace lowbit
