// CPU RoPE vs a float64 reference: neox (HF rotate_half) and GPT-J pairing, partial rotary_dim,
// Llama-3 frequency scaling (HF `_compute_llama3_parameters`) and linear scaling, f32/f16/bf16,
// positions up to 1e5.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lowbit/ops/ops.h"
#include "kernels/cpu/rope_cpu.h"

using namespace lowbit;

namespace {

double load(const Tensor& x, int64_t i) {
  switch (x.dtype()) {
    case ScalarType::f32: return x.data<float>()[i];
    case ScalarType::f16: return f16_bits_to_f32(x.data<uint16_t>()[i]);
    default: return bf16_bits_to_f32(x.data<uint16_t>()[i]);
  }
}

Tensor random_tensor(const Shape& s, ScalarType t, std::mt19937& rng) {
  Tensor x = Tensor::empty(s, t);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = u(rng);
    if (t == ScalarType::f32) x.data<float>()[i] = v;
    if (t == ScalarType::f16) x.data<uint16_t>()[i] = f32_to_f16_bits(v);
    if (t == ScalarType::bf16) x.data<uint16_t>()[i] = f32_to_bf16_bits(v);
  }
  return x;
}

// Reference frequencies written from the HF formulas, independently of the kernel.
std::vector<double> reference_inv_freq(const ops::RopeConfig& c, int rd) {
  std::vector<double> f;
  for (int i = 0; i < rd; i += 2) f.push_back(1.0 / std::pow(static_cast<double>(c.theta), static_cast<double>(i) / rd));
  if (c.llama3) {
    const double low_wl = c.original_max_position / c.low_freq_factor;
    const double high_wl = c.original_max_position / c.high_freq_factor;
    for (double& x : f) {
      const double wl = 2 * M_PI / x;
      const double scaled = wl > low_wl ? x / c.factor : x;
      const double smooth = (c.original_max_position / wl - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      const double smoothed = (1 - smooth) * scaled / c.factor + smooth * scaled;
      const bool medium = !(wl < high_wl) && !(wl > low_wl);
      x = medium ? smoothed : scaled;
    }
  }
  return f;
}

void check_rope(const Tensor& before, const Tensor& after, const std::vector<int32_t>& pos, const ops::RopeConfig& c) {
  const int64_t T = before.size(0), H = before.size(1), D = before.size(2);
  const int rd = c.rotary_dim ? c.rotary_dim : static_cast<int>(D);
  const std::vector<double> f = reference_inv_freq(c, rd);
  const double rel = before.dtype() == ScalarType::f32 ? 1e-6 : before.dtype() == ScalarType::f16 ? 0x1p-11 : 0x1p-8;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t row = (t * H + h) * D;
      std::vector<double> ref(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) ref[d] = load(before, row + d);
      for (int i = 0; i < rd / 2; ++i) {
        // Position scaled the HF "linear" way: position / factor.
        const double a = pos[t] / static_cast<double>(c.linear_factor) * f[i];
        const int ia = c.neox ? i : 2 * i, ib = c.neox ? i + rd / 2 : 2 * i + 1;
        const double x = load(before, row + ia), y = load(before, row + ib);
        ref[ia] = x * std::cos(a) - y * std::sin(a);
        ref[ib] = y * std::cos(a) + x * std::sin(a);
      }
      for (int64_t d = 0; d < D; ++d) {
        const double got = load(after, row + d);
        if (d >= rd) {
          ASSERT_EQ(got, ref[d]) << "features past rotary_dim must be untouched";
        } else {
          ASSERT_NEAR(got, ref[d], rel * 1.01 * std::abs(ref[d]) + 3e-6)
              << "t " << t << " h " << h << " d " << d << " pos " << pos[t];
        }
      }
    }
  }
}

void run(const ops::RopeConfig& c, int64_t D, ScalarType t, uint32_t seed) {
  SCOPED_TRACE(std::string(name_of(t)) + " D " + std::to_string(D) + (c.neox ? " neox" : " gptj") +
               (c.llama3 ? " llama3" : "") + " rotary_dim " + std::to_string(c.rotary_dim));
  std::mt19937 rng(seed);
  const int64_t T = 13;
  Tensor q = random_tensor({T, 9, D}, t, rng), k = random_tensor({T, 3, D}, t, rng);
  const Tensor q0 = q.clone(), k0 = k.clone();
  std::vector<int32_t> pos = {0, 1, 2, 7, 100, 2047, 8191, 8192, 16000, 32767, 65536, 99991, 131071};
  Tensor p = Tensor::empty({T}, ScalarType::s32);
  std::copy(pos.begin(), pos.end(), p.data<int32_t>());
  cpu::rope_cpu(q, k, p, c);
  check_rope(q0, q, pos, c);
  check_rope(k0, k, pos, c);
}

}  // namespace

TEST(Rope, NeoxAndGptjPairing) {
  for (ScalarType t : {ScalarType::f32, ScalarType::f16, ScalarType::bf16})
    for (bool neox : {true, false})
      for (int64_t D : {64, 80, 128}) {
        ops::RopeConfig c;
        c.theta = 100000.f;
        c.neox = neox;
        run(c, D, t, 17u + static_cast<uint32_t>(D));
      }
}

TEST(Rope, PartialRotaryDim) {
  for (bool neox : {true, false}) {
    ops::RopeConfig c;
    c.rotary_dim = 32;
    c.neox = neox;
    run(c, 80, ScalarType::f32, 3);
    run(c, 80, ScalarType::bf16, 4);
  }
}

TEST(Rope, Llama3Scaling) {
  ops::RopeConfig c;
  c.theta = 500000.f;
  c.llama3 = true;
  c.factor = 8.f;
  c.low_freq_factor = 1.f;
  c.high_freq_factor = 4.f;
  c.original_max_position = 8192;
  for (ScalarType t : {ScalarType::f32, ScalarType::f16}) run(c, 128, t, 5);
  // The scaling must actually change the low frequencies (guards against a reference that ignores it).
  const std::vector<double> scaled = cpu::rope_inv_freq(c, 128);
  c.llama3 = false;
  const std::vector<double> plain = cpu::rope_inv_freq(c, 128);
  EXPECT_DOUBLE_EQ(scaled[0], plain[0]);           // high frequency: kept
  EXPECT_DOUBLE_EQ(scaled[63], plain[63] / 8.0);   // low frequency: divided by factor
  int medium = 0;
  for (int i = 0; i < 64; ++i) medium += scaled[i] < plain[i] && scaled[i] > plain[i] / 8.0;
  EXPECT_GT(medium, 0);  // the smoothed band exists for these parameters
}

TEST(Rope, LinearScaling) {
  ops::RopeConfig c;
  c.linear_factor = 4.f;
  run(c, 64, ScalarType::f32, 9);
}

TEST(Rope, OnlyQOrOnlyK) {
  std::mt19937 rng(1);
  Tensor q = random_tensor({3, 2, 64}, ScalarType::f32, rng);
  const Tensor q0 = q.clone();
  Tensor none;
  std::vector<int32_t> pos = {5, 6, 9};
  Tensor p = Tensor::empty({3}, ScalarType::s32);
  std::copy(pos.begin(), pos.end(), p.data<int32_t>());
  ops::RopeConfig c;
  cpu::rope_cpu(q, none, p, c);
  check_rope(q0, q, pos, c);
}
