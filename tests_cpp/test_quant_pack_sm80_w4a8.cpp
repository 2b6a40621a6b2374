// pack_sm80 for the two-level W4A8 formats (qoq, liquid) runs on the host, so CI checks it without a
// GPU: bit-exact round trips, the fragment order and byte dequant the W4A8 kernel relies on
// (emulated here in integers: (codes*s + a) ^ 0x80808080 per 32-bit word), adversarial groups at the
// edge of the protective range, and the refusal of QoQ parameters the byte dequant cannot hold.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "lowbit/quant/pack.h"

namespace lowbit {
namespace {

Tensor random_weight(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.02f);
  Tensor w = Tensor::empty({n, k}, ScalarType::f32);
  for (int64_t i = 0; i < n * k; ++i) w.data<float>()[i] = dist(rng) * (i % 89 == 5 ? 8.f : 1.f);
  return w;
}

int u4_at(const QuantizedWeight& w, int64_t r, int64_t c) {
  const int64_t e = r * w.k + c;
  return (w.q.data<uint8_t>()[e >> 1] >> ((e & 1) * 4)) & 0xF;
}

// The s8 weight by each paper's own formula, from the unpacked fields.
int s8_reference(const QuantizedWeight& w, int64_t r, int64_t c) {
  const int64_t gi = r * w.num_groups() + c / w.group;
  const int q = u4_at(w, r, c), s = w.scales.data<uint8_t>()[gi], z = w.zeros.data<uint8_t>()[gi];
  return w.format == WeightFormat::qoq ? q * s - z * s : q * s + z - 128;  // liquid: zeros hold a = 128 + min
}

void expect_same_bytes(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(0, std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes())) << what;
}

struct Case {
  WeightFormat format;
  int64_t n, k;
  int group;
};

class PackSm80W4A8 : public ::testing::TestWithParam<Case> {};

TEST_P(PackSm80W4A8, RoundTripsBitExactly) {
  const Case c = GetParam();
  const QuantizedWeight w = quantize_weight(random_weight(c.n, c.k, 7 + c.n * 3 + c.k), c.format, c.group);
  const PackedWeight p = pack_sm80(w, Device::cpu());
  EXPECT_EQ(p.target, PackTarget::sm80);
  EXPECT_EQ(p.data.size(0), (c.n + 15) / 16);
  const QuantizedWeight u = unpack_sm80(p);
  expect_same_bytes(u.q, w.q, "q");
  expect_same_bytes(u.scales, w.scales, "scales");
  expect_same_bytes(u.zeros, w.zeros, "zeros");
  expect_same_bytes(u.channel_scales, w.channel_scales, "channel_scales");
}

// What the kernel does with lane (g, t)'s four words of a chunk: word 2j + h (row g + 8h, k32 step j),
// low nibbles -> register a_h, high nibbles -> a_{h+2}, each byte (code*s + a) ^ 0x80 with its row's
// group step s and offset a. Byte b of a0/a1 is fragment column 4t+b of k32 step j, of a2/a3 column
// 16+4t+b (the mma.sync m16n8k32 and wgmma m64nNk32 A layout), with no k permutation: actual k
// 32j + column. Every byte must be the s8 weight at that (row, k); padding rows 0.
TEST_P(PackSm80W4A8, KernelDequantGivesTheS8WeightsInMmaOrder) {
  const Case c = GetParam();
  const QuantizedWeight w = quantize_weight(random_weight(c.n, c.k, 11 + c.n + c.k * 5), c.format, c.group);
  const PackedWeight p = pack_sm80(w, Device::cpu());
  const int64_t n_tiles = (c.n + 15) / 16, npad = n_tiles * 16, chunks = c.k / 64;
  const uint8_t* d = p.data.data<uint8_t>();
  int64_t checked = 0;
  for (int64_t nt = 0; nt < n_tiles; ++nt)
    for (int64_t kc = 0; kc < chunks; ++kc)
      for (int lane = 0; lane < 32; ++lane)
        for (int word_i = 0; word_i < 4; ++word_i) {
          const int g = lane / 4, t = lane % 4, j = word_i / 2, h = word_i % 2;
          const int64_t row = nt * 16 + g + 8 * h, gi = kc * 64 / c.group;
          const uint32_t s = p.scales.data<uint8_t>()[gi * npad + row];
          const uint32_t a = p.zeros.data<uint8_t>()[gi * npad + row] * 0x01010101u;
          uint32_t word;
          std::memcpy(&word, d + ((nt * chunks + kc) * 32 + lane) * 16 + 4 * word_i, 4);
          const uint32_t regs[2] = {((word & 0x0f0f0f0fu) * s + a) ^ 0x80808080u,
                                    (((word >> 4) & 0x0f0f0f0fu) * s + a) ^ 0x80808080u};
          for (int hi = 0; hi < 2; ++hi)
            for (int b = 0; b < 4; ++b) {
              const int got = static_cast<int8_t>(regs[hi] >> (8 * b));
              const int64_t col = kc * 64 + 32 * j + (hi ? 16 + 4 * t + b : 4 * t + b);
              const int want = row < c.n ? s8_reference(w, row, col) : 0;
              ASSERT_EQ(got, want) << "row " << row << " k " << col << " lane " << lane << " word " << word_i;
              ++checked;
            }
        }
  EXPECT_EQ(checked, npad * c.k);
  for (int64_t r = 0; r < npad; ++r)
    EXPECT_EQ(p.channel_scales.data<float>()[r], r < c.n ? w.channel_scales.data<float>()[r] : 0.f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PackSm80W4A8,
                         ::testing::Values(Case{WeightFormat::qoq, 16, 64, 64}, Case{WeightFormat::liquid, 1, 64, 64},
                                           Case{WeightFormat::qoq, 33, 576, 128},  // n tail, short last group
                                           Case{WeightFormat::liquid, 40, 576, 64}, Case{WeightFormat::liquid, 7, 256, 128},
                                           Case{WeightFormat::qoq, 50, 192, 64}));

// Every group spans the whole protective range [-119, 119] (step 16, the largest): the byte dequant
// must still never carry, for both formats.
TEST(PackSm80W4A8Edges, GroupsAtTheProtectiveRangeEdge) {
  const int64_t n = 16, k = 128;
  Tensor f = Tensor::empty({n, k}, ScalarType::f32);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> v(-119, 119);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const int x = c % 64 == 0 ? 119 : c % 64 == 1 ? -119 : v(rng);
      f.data<float>()[r * k + c] = static_cast<float>(x) / 128.f;
    }
  for (WeightFormat fmt : {WeightFormat::qoq, WeightFormat::liquid}) {
    const QuantizedWeight w = quantize_weight(f, fmt, 64);
    for (int64_t i = 0; i < w.scales.numel(); ++i) ASSERT_EQ(w.scales.data<uint8_t>()[i], 16) << name_of(fmt);
    const PackedWeight p = pack_sm80(w, Device::cpu());
    const QuantizedWeight u = unpack_sm80(p);
    expect_same_bytes(u.q, w.q, "q");
    // Every used code at its group's (s, a) stays inside one byte and gives the s8 weight.
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const int64_t gi = (c / 64) * 16 + r;
        const int q = u4_at(w, r, c), s = p.scales.data<uint8_t>()[gi], a = p.zeros.data<uint8_t>()[gi];
        ASSERT_LE(q * s + a, 255) << name_of(fmt) << " row " << r << " k " << c;
        ASSERT_EQ(static_cast<int8_t>((q * s + a) ^ 0x80), s8_reference(w, r, c)) << name_of(fmt);
      }
  }
}

TEST(PackSm80W4A8Errors, RefusesQoqZeroPointsTheByteDequantCannotHold) {
  QuantizedWeight w = quantize_weight(random_weight(16, 64, 5), WeightFormat::qoq, 64);
  // z*s = 9*15 = 135 > 128; codes of 9 and above keep q*s - z*s inside s8, so the weight is valid.
  for (int64_t r = 0; r < 16; ++r) {
    w.scales.data<uint8_t>()[r] = 15;
    w.zeros.data<uint8_t>()[r] = 9;
  }
  for (int64_t e = 0; e < 16 * 64; ++e) {
    const uint8_t v = 9 + (e % 7);  // 9..15
    uint8_t& byte = w.q.data<uint8_t>()[e >> 1];
    byte = static_cast<uint8_t>((byte & ~(0xF << ((e & 1) * 4))) | (v << ((e & 1) * 4)));
  }
  validate_quantized_weight(w, "test");
  try {
    pack_sm80(w, Device::cpu());
    FAIL() << "expected NotSupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("row 0 group 0 has z*s = 9*15 = 135 > 128"), std::string::npos) << e.what();
  }
  QuantizedWeight odd = quantize_weight(random_weight(16, 96, 6), WeightFormat::liquid, 32);
  EXPECT_THROW(pack_sm80(odd, Device::cpu()), Error);
}

}  // namespace
}  // namespace lowbit
