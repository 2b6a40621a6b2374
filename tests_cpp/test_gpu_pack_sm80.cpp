// pack_sm80 / unpack_sm80 run on the host, so CI checks them without a GPU: bit-exact round trip,
// the fragment order the W4A16 kernel relies on (emulating its magic-number dequant in integers),
// and clear errors for shapes the layout cannot hold.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "lowbit/quant/pack.h"

namespace lowbit {
namespace {

QuantizedWeight random_w4(int64_t n, int64_t k, int group, bool symmetric, uint32_t seed) {
  std::mt19937 rng(seed);
  QuantizedWeight w;
  w.format = WeightFormat::w4;
  w.n = n;
  w.k = k;
  w.group = group;
  w.symmetric = symmetric;
  w.q = Tensor::empty({n, k}, ScalarType::u4);
  for (int64_t i = 0; i < w.q.nbytes(); ++i) w.q.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  const int64_t g = w.num_groups();
  w.scales = Tensor::empty({n, g}, ScalarType::f16);
  for (int64_t i = 0; i < n * g; ++i) w.scales.data<uint16_t>()[i] = static_cast<uint16_t>(rng());
  if (!symmetric) {
    w.zeros = Tensor::empty({n, g}, ScalarType::f16);
    for (int64_t i = 0; i < n * g; ++i) w.zeros.data<uint16_t>()[i] = static_cast<uint16_t>(rng());
  }
  return w;
}

uint8_t u4_at(const Tensor& q, int64_t r, int64_t c) {
  const int64_t e = r * q.size(1) + c;
  return (q.data<uint8_t>()[e >> 1] >> ((e & 1) * 4)) & 0xF;
}

void expect_same_bytes(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(0, std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes())) << what;
}

struct Shape3 { int64_t n, k; int group; bool symmetric; };

class PackSm80RoundTrip : public ::testing::TestWithParam<Shape3> {};

TEST_P(PackSm80RoundTrip, BitExact) {
  const Shape3 s = GetParam();
  const QuantizedWeight w = random_w4(s.n, s.k, s.group, s.symmetric, 1234 + s.n + s.k);
  const PackedWeight p = pack_sm80(w, Device::cpu());
  EXPECT_EQ(p.target, PackTarget::sm80);
  EXPECT_EQ(p.data.size(0), (s.n + 15) / 16);
  const QuantizedWeight u = unpack_sm80(p);
  expect_same_bytes(u.q, w.q, "q");
  expect_same_bytes(u.scales, w.scales, "scales");
  if (!s.symmetric) expect_same_bytes(u.zeros, w.zeros, "zeros");
  EXPECT_EQ(u.symmetric, s.symmetric);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PackSm80RoundTrip,
                         ::testing::Values(Shape3{16, 64, 64, false}, Shape3{1, 64, 64, false},
                                           Shape3{33, 576, 128, false},  // n tail, short last group
                                           Shape3{48, 256, 128, true}, Shape3{7, 192, 64, false},
                                           Shape3{19, 192, 32, false}, Shape3{16, 128, 32, true},  // g32
                                           Shape3{17, 640, 96, false}));  // an odd multiple of 32

// What the kernel does with one 32-bit word: (w & 0x000f000f) | 0x64006400 is the f16 pair
// (1024 + nibble0, 1024 + nibble4), the 0x00f000f0 mask gives nibbles 1 and 5 (times 16), then the
// word shifts by 8. Registers a0..a3 of the A fragment (natural k order of step j) must come out as documented.
TEST(PackSm80Layout, FragmentsMatchMmaOrder) {
  const int64_t n = 32, k = 128;
  const QuantizedWeight w = random_w4(n, k, 64, false, 99);
  const PackedWeight p = pack_sm80(w, Device::cpu());
  const uint8_t* d = p.data.data<uint8_t>();
  for (int64_t nt = 0; nt < 2; ++nt)
    for (int64_t kc = 0; kc < 2; ++kc)
      for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < 4; ++j) {
          uint32_t word;
          std::memcpy(&word, d + nt * (k / 64) * 512 + (kc * 32 + lane) * 16 + 4 * j, 4);
          uint32_t a[4];
          for (int half = 0; half < 2; ++half) {
            const uint32_t lo = (word & 0x000f000fu) | 0x64006400u;
            const uint32_t hi = (word & 0x00f000f0u) | 0x64006400u;
            a[2 * half] = (((lo & 0xffff) - 0x6400)) | (((lo >> 16) - 0x6400) << 16);
            a[2 * half + 1] = (((hi & 0xffff) - 0x6400) >> 4) | ((((hi >> 16) - 0x6400) >> 4) << 16);
            word >>= 8;
          }
          const int g = lane / 4, t = lane % 4;
          const int64_t r0 = nt * 16 + g, k0 = kc * 64 + 16 * j + 2 * t;
          // a0: row g, (k0, k0+1); a1: row g+8; a2: row g, (k0+8, k0+9); a3: row g+8, (k0+8, k0+9)
          const int64_t rows[4] = {r0, r0 + 8, r0, r0 + 8};
          const int64_t cols[4] = {k0, k0, k0 + 8, k0 + 8};
          for (int r = 0; r < 4; ++r) {
            EXPECT_EQ(a[r] & 0xffff, u4_at(w.q, rows[r], cols[r])) << "lane " << lane << " j " << j << " reg " << r;
            EXPECT_EQ(a[r] >> 16, u4_at(w.q, rows[r], cols[r] + 1)) << "lane " << lane << " j " << j << " reg " << r;
          }
        }
}

TEST(PackSm80Errors, RejectsUnsupportedShapes) {
  QuantizedWeight w = random_w4(16, 96, 32, false, 5);  // k not a multiple of 64
  EXPECT_THROW(pack_sm80(w, Device::cpu()), Error);
  try {
    pack_sm80(w, Device::cpu());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k must be a multiple of 64, got k=96"), std::string::npos) << e.what();
  }
  QuantizedWeight g16 = random_w4(16, 128, 16, false, 6);  // groups are multiples of 32 (half a chunk)
  EXPECT_THROW(pack_sm80(g16, Device::cpu()), Error);
  QuantizedWeight bad = random_w4(16, 128, 64, false, 7);
  bad.scales = Tensor::empty({16, 3}, ScalarType::f16);
  EXPECT_THROW(pack_sm80(bad, Device::cpu()), Error);
  bad = random_w4(16, 128, 64, false, 8);
  bad.format = WeightFormat::w8;
  EXPECT_THROW(pack_sm80(bad, Device::cpu()), Error);
}

}  // namespace
}  // namespace lowbit
