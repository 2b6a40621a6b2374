// The sm80-family packers (W4A16 and W4A8 layouts) pack whole words, tiles in parallel (quant/packed_nibbles.h).
// Their bytes must equal those of the per-nibble loops they replaced, written out below as the reference (each
// layout's own index formulas, one nibble at a time by read-modify-write), on random codes with row tails; and
// unpacking must give the codes back. pack_sm80 / pack_sm80_w4a8 are called with a host device, so this runs
// without a GPU (the device version is the same bytes uploaded).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>

#include "lowbit/quant/pack.h"

namespace lowbit {
namespace {

uint8_t code(const uint8_t* q, int64_t row, int64_t col, int64_t k) {
  const int64_t e = row * k + col;
  return (q[e >> 1] >> ((e & 1) * 4)) & 0xF;
}

// The replaced loops, one nibble at a time by read-modify-write: for n-tile nt, chunk kc, lane, word w and nibble i
// the 32-bit word at byte ((nt*chunks + kc)*32 + lane)*16 + 4w gets code (row, col) = where(lane, w, i) (relative to
// the tile and chunk) at bit 4i.
template <class Where>
Tensor reference_pack(const uint8_t* q, int64_t n, int64_t k, Where where) {
  const int64_t tiles = (n + 15) / 16, chunks = k / 64;
  Tensor data = Tensor::zeros({tiles, chunks * 512}, ScalarType::u8);
  uint8_t* dp = data.data<uint8_t>();
  for (int64_t nt = 0; nt < tiles; ++nt)
    for (int64_t kc = 0; kc < chunks; ++kc)
      for (int lane = 0; lane < 32; ++lane)
        for (int w = 0; w < 4; ++w)
          for (int i = 0; i < 8; ++i) {
            const auto [r, c] = where(lane, w, i);
            const int64_t row = nt * 16 + r, col = kc * 64 + c;
            if (row >= n) continue;
            const int64_t word = ((nt * chunks + kc) * 32 + lane) * 16 + 4 * w;
            uint32_t v;
            std::memcpy(&v, dp + word, 4);
            v |= uint32_t(code(q, row, col, k)) << (4 * i);
            std::memcpy(dp + word, &v, 4);
          }
  return data;
}

// W4A16 (lane = (g, t), step j): nibble i is row g + 8*(i&1), col 16j + 2t + 8*((i>>1)&1) + (i>>2).
Tensor reference_w4a16(const uint8_t* q, int64_t n, int64_t k) {
  return reference_pack(q, n, k, [](int lane, int j, int i) {
    return std::pair<int, int>{lane / 4 + (i & 1) * 8, 16 * j + 2 * (lane % 4) + ((i >> 1) & 1) * 8 + (i >> 2)};
  });
}

// W4A8: word w = (step w/2, half w%2), nibble i = (byte i/2, high i%2) -> row g + 8*half,
// col 32*step + 16*high + 4t + byte.
Tensor reference_w4a8(const uint8_t* q, int64_t n, int64_t k) {
  return reference_pack(q, n, k, [](int lane, int w, int i) {
    return std::pair<int, int>{lane / 4 + 8 * (w % 2), 32 * (w / 2) + 16 * (i % 2) + 4 * (lane % 4) + i / 2};
  });
}

Tensor random_codes(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor q = Tensor::empty({n, k}, ScalarType::u4);
  uint8_t* p = q.data<uint8_t>();
  for (int64_t i = 0; i < q.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return q;
}

Tensor random_bytes(int64_t n, int64_t g, ScalarType t, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  Tensor x = Tensor::empty({n, g}, t);
  if (t == ScalarType::u8)
    for (int64_t i = 0; i < n * g; ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(d(rng));
  else  // f16 bit patterns of small positive values: the packers only move them
    for (int64_t i = 0; i < n * g; ++i) x.data<uint16_t>()[i] = static_cast<uint16_t>(0x2000 + d(rng));
  return x;
}

void expect_same_bytes(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const uint8_t* a = static_cast<const uint8_t*>(got.data_ptr());
  const uint8_t* b = static_cast<const uint8_t*>(want.data_ptr());
  int64_t first = -1, bad = 0;
  for (int64_t i = 0; i < got.nbytes(); ++i)
    if (a[i] != b[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " bytes differ, the first at " << first;
}

struct Shape {
  int64_t n, k;
};
// Row tails (1, 15, 17, 100 rows: partial 16-row tiles), one 64-k chunk to sixteen, and 63 tiles for the parallel
// loop to split.
const Shape kShapes[] = {{1, 64}, {15, 128}, {17, 576}, {100, 1024}, {1000, 256}};

TEST(PackedNibbles, W4A16BytesEqualThePerNibbleLoop) {
  for (const Shape& s : kShapes) {
    QuantizedWeight w;
    w.format = WeightFormat::w4;
    w.n = s.n, w.k = s.k, w.group = 64;
    w.q = random_codes(s.n, s.k, uint32_t(s.n * 7 + s.k));
    w.scales = random_bytes(s.n, w.num_groups(), ScalarType::f16, 3, 0, 4000);
    w.zeros = random_bytes(s.n, w.num_groups(), ScalarType::f16, 4, 0, 4000);
    const PackedWeight p = pack_sm80(w, Device::cpu());
    expect_same_bytes(p.data, reference_w4a16(w.q.data<uint8_t>(), s.n, s.k), "w4 data");
    const QuantizedWeight back = unpack_sm80(p);
    expect_same_bytes(back.q, w.q, "w4 codes after unpack");
  }
}

TEST(PackedNibbles, W4A8BytesEqualThePerNibbleLoop) {
  for (const Shape& s : kShapes) {
    for (WeightFormat f : {WeightFormat::qoq, WeightFormat::liquid}) {
      QuantizedWeight w;
      w.format = f;
      w.n = s.n, w.k = s.k, w.group = 64;
      w.q = random_codes(s.n, s.k, uint32_t(s.n * 13 + s.k));
      w.scales = random_bytes(s.n, w.num_groups(), ScalarType::u8, 5, 1, 8);  // z*s <= 15*8 < 128 for qoq
      w.zeros = random_bytes(s.n, w.num_groups(), ScalarType::u8, 6, 0, 15);
      w.channel_scales = Tensor::empty({s.n}, ScalarType::f32);
      for (int64_t r = 0; r < s.n; ++r) w.channel_scales.data<float>()[r] = 0.01f * float(r + 1);
      const PackedWeight p = pack_sm80_w4a8(w, Device::cpu());
      expect_same_bytes(p.data, reference_w4a8(w.q.data<uint8_t>(), s.n, s.k), "w4a8 data");
      const QuantizedWeight back = unpack_sm80_w4a8(p);
      expect_same_bytes(back.q, w.q, "w4a8 codes after unpack");
    }
  }
}

}  // namespace
}  // namespace lowbit
