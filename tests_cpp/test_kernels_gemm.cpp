// CPU packing and GEMM for every weight format against a float64 (float activations) or exact
// integer (int8 activations) reference built from an independent quantizer in this file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lowbit/ops/ops.h"
#include "kernels/cpu/gemm_cpu.h"
#include "quant/pack_cpu_layout.h"
#include "lowbit/quant/pack.h"

using namespace lowbit;

namespace {

std::mt19937& rng() {
  static std::mt19937 g(1234);
  return g;
}
float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng()); }
int randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng()); }

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

uint8_t get_u4(const Tensor& t, int64_t e) { return (t.data<uint8_t>()[e >> 1] >> ((e & 1) * 4)) & 0xF; }
void set_u4(Tensor& t, int64_t e, uint8_t v) {
  uint8_t& b = t.data<uint8_t>()[e >> 1];
  b = static_cast<uint8_t>((b & ~(0xF << ((e & 1) * 4))) | (v << ((e & 1) * 4)));
}

Tensor random_f32(const Shape& s, float lo, float hi) {
  Tensor t = Tensor::empty(s, ScalarType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = uniform(lo, hi);
  return t;
}

// A random QuantizedWeight of the given format, built field by field (not by the library's quantizer).
QuantizedWeight random_weight(WeightFormat f, int64_t n, int64_t k, int group, bool symmetric = false) {
  QuantizedWeight w;
  w.format = f;
  w.n = n;
  w.k = k;
  const int64_t nk = n * k;
  switch (f) {
    case WeightFormat::f32: w.q = random_f32({n, k}, -1, 1); break;
    case WeightFormat::f16:
    case WeightFormat::bf16: {
      w.q = Tensor::empty({n, k}, f == WeightFormat::f16 ? ScalarType::f16 : ScalarType::bf16);
      for (int64_t i = 0; i < nk; ++i)
        w.q.data<uint16_t>()[i] = f == WeightFormat::f16 ? f32_to_f16_bits(uniform(-1, 1)) : f32_to_bf16_bits(uniform(-1, 1));
      break;
    }
    case WeightFormat::w8:
    case WeightFormat::e4m3: {
      w.q = Tensor::empty({n, k}, f == WeightFormat::w8 ? ScalarType::s8 : ScalarType::e4m3);
      for (int64_t i = 0; i < nk; ++i) {
        uint8_t v = static_cast<uint8_t>(randint(0, 255));
        if (f == WeightFormat::e4m3 && (v & 0x7F) == 0x7F) v = 0x3C;  // avoid the NaN code
        if (f == WeightFormat::w8 && v == 0x80) v = 0x81;            // symmetric s8 range [-127, 127]
        w.q.data<uint8_t>()[i] = v;
      }
      w.scales = random_f32({n}, 0.001f, 0.02f);
      break;
    }
    default: {
      w.group = group;
      w.symmetric = symmetric;
      const int64_t G = w.num_groups();
      w.q = Tensor::zeros({n, k}, ScalarType::u4);
      for (int64_t i = 0; i < nk; ++i) set_u4(w.q, i, static_cast<uint8_t>(randint(0, 15)));
      if (f == WeightFormat::w4) {
        w.scales = Tensor::empty({n, G}, ScalarType::f16);
        for (int64_t i = 0; i < n * G; ++i) w.scales.data<uint16_t>()[i] = f32_to_f16_bits(uniform(0.001f, 0.05f));
        if (!symmetric) {
          w.zeros = Tensor::empty({n, G}, ScalarType::f16);  // fractional zeros exercise exactness of -z*s
          for (int64_t i = 0; i < n * G; ++i) w.zeros.data<uint16_t>()[i] = f32_to_f16_bits(uniform(0.f, 15.f));
        }
      } else {
        w.scales = Tensor::empty({n, G}, ScalarType::u8);
        w.zeros = Tensor::empty({n, G}, ScalarType::u8);
        // Parameters whose s8 reconstruction stays in [-128, 127] for every q (what the quantizers
        // guarantee and pack_cpu checks): qoq (q - z) * s with s <= 8; liquid q*s + a - 128 with
        // a <= 255 - 15 s.
        for (int64_t i = 0; i < n * G; ++i) {
          const int scale = f == WeightFormat::qoq ? randint(1, 8) : randint(1, 16);
          w.scales.data<uint8_t>()[i] = static_cast<uint8_t>(scale);
          w.zeros.data<uint8_t>()[i] = static_cast<uint8_t>(f == WeightFormat::qoq ? randint(0, 15) : randint(0, 255 - 15 * scale));
        }
        w.channel_scales = random_f32({n}, 0.001f, 0.02f);
      }
    }
  }
  return w;
}

// The s8 weight of qoq (QServe: q*s - z*s) or liquid (LiquidGEMM: (q*s + a) XOR 0x80 in u8).
int s8_weight(const QuantizedWeight& w, int64_t r, int64_t c) {
  const int64_t g = r * w.num_groups() + c / w.group;
  const int q = get_u4(w.q, r * w.k + c), s = w.scales.data<uint8_t>()[g], z = w.zeros.data<uint8_t>()[g];
  if (w.format == WeightFormat::qoq) return static_cast<int8_t>(static_cast<uint8_t>((q * s - z * s) & 0xFF));
  return static_cast<int8_t>(static_cast<uint8_t>(((q * s + z) & 0xFF) ^ 0x80));
}

// Float64 value of weight (r, c) as the float-activation kernels must see it.
double ref_weight(const QuantizedWeight& w, int64_t r, int64_t c) {
  const int64_t e = r * w.k + c;
  switch (w.format) {
    case WeightFormat::f32: return w.q.data<float>()[e];
    case WeightFormat::f16: return f16_bits_to_f32(w.q.data<uint16_t>()[e]);
    case WeightFormat::bf16: return bf16_bits_to_f32(w.q.data<uint16_t>()[e]);
    case WeightFormat::w8: return double(w.q.data<int8_t>()[e]) * w.scales.data<float>()[r];
    case WeightFormat::e4m3: return double(e4m3_bits_to_f32(w.q.data<uint8_t>()[e])) * w.scales.data<float>()[r];
    case WeightFormat::w4: {
      const int64_t g = r * w.num_groups() + c / w.group;
      const double s = f16_bits_to_f32(w.scales.data<uint16_t>()[g]);
      const double z = w.zeros.defined() ? f16_bits_to_f32(w.zeros.data<uint16_t>()[g]) : 8.0;
      return (get_u4(w.q, e) - z) * s;
    }
    default: return double(s8_weight(w, r, c)) * w.channel_scales.data<float>()[r];
  }
}

float as_float(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case ScalarType::f16: return f16_bits_to_f32(t.data<uint16_t>()[i]);
    case ScalarType::bf16: return bf16_bits_to_f32(t.data<uint16_t>()[i]);
    default: return t.data<float>()[i];
  }
}

Tensor random_activations(int64_t m, int64_t k, ScalarType dt) {
  Tensor x = Tensor::empty({m, k}, dt);
  for (int64_t i = 0; i < m * k; ++i) {
    const float v = uniform(-2, 2);
    if (dt == ScalarType::f32) x.data<float>()[i] = v;
    else x.data<uint16_t>()[i] = dt == ScalarType::f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
  }
  return x;
}

// y as a view with 3 extra poisoned columns per row, to catch writes past n.
struct PoisonedOutput {
  Tensor base, y;
  PoisonedOutput(int64_t m, int64_t n, ScalarType dt) {
    base = Tensor::empty({m, n + 3}, dt);
    base.fill_bytes_(0xFF);  // NaN in f32/f16/bf16
    y = base.slice(1, 0, n);
  }
  bool pad_untouched() const {
    const int64_t es = bytes_for(base.dtype(), 1), n = y.size(1);
    for (int64_t i = 0; i < base.size(0); ++i)
      for (int64_t c = n; c < n + 3; ++c)
        for (int64_t b = 0; b < es; ++b)
          if (static_cast<const uint8_t*>(base.data_ptr())[(i * (n + 3) + c) * es + b] != 0xFF) return false;
    return true;
  }
};

const WeightFormat kAllFormats[] = {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::w8,
                                    WeightFormat::e4m3, WeightFormat::w4, WeightFormat::qoq, WeightFormat::liquid};

bool is_u4(WeightFormat f) { return f == WeightFormat::w4 || f == WeightFormat::qoq || f == WeightFormat::liquid; }

struct Case {
  int64_t m, n, k;
  int group;
};
// M=1 (decode), M in 2..4 (direct), M > 4 (prefill buffer path); n tails; k odd (float formats),
// k not a multiple of the group (short last group), tiny k.
const Case kCases[] = {{1, 13, 37, 8},   {1, 64, 576, 128}, {3, 7, 2, 4},    {4, 24, 70, 64},
                       {5, 33, 130, 32}, {9, 17, 258, 64},  {1, 200, 96, 32}, {2, 8, 1, 2}};

void expect_same_tensor(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  if (a.dtype() == ScalarType::u4) {
    for (int64_t e = 0; e < a.numel(); ++e) ASSERT_EQ(get_u4(a, e), get_u4(b, e)) << what << " element " << e;
  } else {
    ASSERT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << what;
  }
}

}  // namespace

TEST(PackCpu, RoundTripsBitExactlyForEveryFormat) {
  for (WeightFormat f : kAllFormats)
    for (const Case& c : kCases) {
      if (is_u4(f) && c.k % 2) continue;  // u4 rows fill whole bytes
      for (bool sym : {false, true}) {
        if (sym && f != WeightFormat::w4) continue;
        SCOPED_TRACE(std::string(name_of(f)) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k));
        const QuantizedWeight w = random_weight(f, c.n, c.k, c.group, sym);
        const PackedWeight p = pack_cpu(w);
        EXPECT_EQ(p.target, PackTarget::cpu);
        const QuantizedWeight u = unpack_cpu(p);
        EXPECT_EQ(u.format, w.format);
        EXPECT_EQ(u.n, w.n);
        EXPECT_EQ(u.k, w.k);
        EXPECT_EQ(u.group, w.group);
        EXPECT_EQ(u.symmetric, w.symmetric);
        expect_same_tensor(u.q, w.q, "q");
        expect_same_tensor(u.scales, w.scales, "scales");
        expect_same_tensor(u.zeros, w.zeros, "zeros");
        expect_same_tensor(u.channel_scales, w.channel_scales, "channel_scales");
      }
    }
}

TEST(GemmCpu, FloatActivationsMatchFloat64ForEveryFormat) {
  for (WeightFormat f : kAllFormats)
    for (const Case& c : kCases)
      for (ScalarType dt : {ScalarType::f32, ScalarType::f16, ScalarType::bf16}) {
        if (is_u4(f) && c.k % 2) continue;
        SCOPED_TRACE(std::string(name_of(f)) + " " + name_of(dt) + " m=" + std::to_string(c.m) +
                     " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k));
        const QuantizedWeight w = random_weight(f, c.n, c.k, c.group, c.m == 3);
        const PackedWeight p = pack_cpu(w);
        const Tensor x = random_activations(c.m, c.k, dt);
        const bool with_bias = c.m % 2 == 1;
        const Tensor bias = with_bias ? random_f32({c.n}, -1, 1) : Tensor();
        PoisonedOutput out(c.m, c.n, dt);
        cpu::linear_cpu(x, p, bias, out.y, ops::LinearActivation::float16);
        EXPECT_TRUE(out.pad_untouched());
        // f32 accumulation of k products: error well below 1e-5 of sum|x*w| (a single wrong weight
        // moves the result by ~1/k of it); f16/bf16 outputs add one rounding of 2^-11 / 2^-8
        // relative, or half the f16 subnormal spacing (2^-25) for tiny results.
        const double out_rel = dt == ScalarType::f32 ? 0 : dt == ScalarType::f16 ? 1.0 / 2048 : 1.0 / 256;
        const double out_abs = dt == ScalarType::f16 ? std::ldexp(1.0, -25) : 0.0;
        int bad = 0;
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t r = 0; r < c.n; ++r) {
            double ref = with_bias ? bias.data<float>()[r] : 0.0, mag = std::fabs(ref);
            for (int64_t kk = 0; kk < c.k; ++kk) {
              const double t = double(as_float(x, i * c.k + kk)) * ref_weight(w, r, kk);
              ref += t;
              mag += std::fabs(t);
            }
            const double got = as_float(out.y.select(0, i), r);
            const double tol = 1e-5 * mag + out_rel * std::fabs(ref) + out_abs + 1e-30;
            if (!(std::fabs(got - ref) <= tol) && bad++ < 5)
              ADD_FAILURE() << "row " << i << " col " << r << ": got " << got << " want " << ref << " tol " << tol;
          }
      }
}

// w4 with per-group mins (GGUF Q4_1: w = q*s + m): the packed layout round-trips, the float-activation GEMM
// matches float64 of q*s + m on odd shapes (n tails, a short last group, M on every path), and the GPU layout
// (pack_sm80 into host memory) round-trips it too.
TEST(GemmCpu, W4WithMinsMatchesFloat64AndRoundTrips) {
  for (const Case& c : kCases) {
    if (c.k % 2) continue;
    SCOPED_TRACE("m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k));
    QuantizedWeight w = random_weight(WeightFormat::w4, c.n, c.k, c.group, true);  // q and scales only
    w.symmetric = false;
    w.mins = Tensor::empty({c.n, w.num_groups()}, ScalarType::f16);
    for (int64_t i = 0; i < w.mins.numel(); ++i) w.mins.data<uint16_t>()[i] = f32_to_f16_bits(uniform(-1.5f, 0.5f));
    const bool valid_group = c.group == 32 || c.group == 64 || c.group == 128;  // pack_cpu also takes small ones
    if (valid_group) validate_quantized_weight(w, "test");
    const PackedWeight p = pack_cpu(w);
    const QuantizedWeight u = unpack_cpu(p);
    expect_same_tensor(u.q, w.q, "q");
    expect_same_tensor(u.mins, w.mins, "mins");
    EXPECT_FALSE(u.zeros.defined());
    const Tensor x = random_activations(c.m, c.k, ScalarType::f32);
    PoisonedOutput out(c.m, c.n, ScalarType::f32);
    cpu::linear_cpu(x, p, Tensor(), out.y, ops::LinearActivation::float16);
    EXPECT_TRUE(out.pad_untouched());
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t r = 0; r < c.n; ++r) {
        double ref = 0, mag = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const int64_t g = r * w.num_groups() + kk / w.group;
          const double wt = double(get_u4(w.q, r * c.k + kk)) * f16_bits_to_f32(w.scales.data<uint16_t>()[g]) +
                            f16_bits_to_f32(w.mins.data<uint16_t>()[g]);
          ref += double(as_float(x, i * c.k + kk)) * wt;
          mag += std::fabs(double(as_float(x, i * c.k + kk)) * wt);
        }
        EXPECT_NEAR(as_float(out.y.select(0, i), r), ref, 1e-5 * mag + 1e-30) << "row " << i << " col " << r;
      }
    if (valid_group && c.k % 64 == 0) {
      const QuantizedWeight g = unpack_sm80(pack_sm80(w, Device::cpu()));
      expect_same_tensor(g.q, w.q, "q (sm80)");
      expect_same_tensor(g.scales, w.scales, "scales (sm80)");
      expect_same_tensor(g.mins, w.mins, "mins (sm80)");
      EXPECT_FALSE(g.zeros.defined());
    }
  }
  {  // g32 with mins in the GPU layout: two groups per 64-k chunk, a 16-row tile tail
    QuantizedWeight w = random_weight(WeightFormat::w4, 19, 192, 32, true);
    w.symmetric = false;
    w.mins = Tensor::empty({19, 6}, ScalarType::f16);
    for (int64_t i = 0; i < w.mins.numel(); ++i) w.mins.data<uint16_t>()[i] = f32_to_f16_bits(uniform(-1.5f, 0.5f));
    const QuantizedWeight g = unpack_sm80(pack_sm80(w, Device::cpu()));
    expect_same_tensor(g.q, w.q, "q (sm80 g32)");
    expect_same_tensor(g.scales, w.scales, "scales (sm80 g32)");
    expect_same_tensor(g.mins, w.mins, "mins (sm80 g32)");
  }
  QuantizedWeight bad = random_weight(WeightFormat::w4, 4, 64, 32, false);  // zeros and mins together
  bad.mins = Tensor::empty({4, 2}, ScalarType::f16);
  for (int64_t i = 0; i < bad.mins.numel(); ++i) bad.mins.data<uint16_t>()[i] = f32_to_f16_bits(0.25f);
  EXPECT_THROW(validate_quantized_weight(bad, "test"), Error);
}

// Grouped w8 (GGUF Q8_0 as stored: w = q * s with one f32 scale per row and group): the packed layout
// round-trips, the float-activation GEMM matches float64 of q * s on odd shapes (n tails, a short last
// group, M on every path), and the GPU packer refuses it (the registry test checks the int8 kernels do).
TEST(GemmCpu, GroupedW8MatchesFloat64AndRoundTrips) {
  for (const Case& c : kCases) {
    if (c.group % 2) continue;
    SCOPED_TRACE("m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k));
    QuantizedWeight w = random_weight(WeightFormat::w8, c.n, c.k, 0);  // q and per-channel scales
    w.group = c.group;
    w.scales = random_f32({c.n, w.num_groups()}, 0.001f, 0.02f);
    const bool valid_group = c.group == 32 || c.group == 64 || c.group == 128;  // pack_cpu also takes small ones
    if (valid_group) validate_quantized_weight(w, "test");
    const PackedWeight p = pack_cpu(w);
    const QuantizedWeight u = unpack_cpu(p);
    EXPECT_EQ(u.group, w.group);
    expect_same_tensor(u.q, w.q, "q");
    expect_same_tensor(u.scales, w.scales, "scales");
    const Tensor x = random_activations(c.m, c.k, ScalarType::f32);
    PoisonedOutput out(c.m, c.n, ScalarType::f32);
    cpu::linear_cpu(x, p, Tensor(), out.y, ops::LinearActivation::float16);
    EXPECT_TRUE(out.pad_untouched());
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t r = 0; r < c.n; ++r) {
        double ref = 0, mag = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double wt = double(w.q.data<int8_t>()[r * c.k + kk]) *
                            w.scales.data<float>()[r * w.num_groups() + kk / w.group];
          ref += double(as_float(x, i * c.k + kk)) * wt;
          mag += std::fabs(double(as_float(x, i * c.k + kk)) * wt);
        }
        EXPECT_NEAR(as_float(out.y.select(0, i), r), ref, 1e-5 * mag + 1e-30) << "row " << i << " col " << r;
      }
    if (valid_group) {
      const Tensor d = dequantize_weight(w);
      for (int64_t e = 0; e < c.n * c.k; ++e)
        ASSERT_EQ(d.data<float>()[e], float(w.q.data<int8_t>()[e]) *
                                          w.scales.data<float>()[(e / c.k) * w.num_groups() + (e % c.k) / w.group]);
      try {
        pack_weight(w, PackTarget::sm80, Device::cpu());
        ADD_FAILURE() << "pack_weight(sm80) accepted a grouped w8 weight";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("grouped w8"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(GemmCpu, Int8ActivationsAccumulateExactlyInInt32) {
  for (WeightFormat f : {WeightFormat::w8, WeightFormat::qoq, WeightFormat::liquid})
    for (const Case& c : kCases) {
      if (is_u4(f) && c.k % 2) continue;
      SCOPED_TRACE(std::string(name_of(f)) + " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                   " k=" + std::to_string(c.k));
      const QuantizedWeight w = random_weight(f, c.n, c.k, c.group);
      const PackedWeight p = pack_cpu(w);
      const int64_t ldx = 2 * cpu::num_k_pairs(c.k);
      std::vector<int16_t> xq(c.m * ldx, 0);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t kk = 0; kk < c.k; ++kk) xq[i * ldx + kk] = static_cast<int16_t>(randint(-127, 127));
      std::vector<int32_t> acc(c.m * c.n);
      std::memset(acc.data(), 0xA5, acc.size() * 4);  // poison
      cpu::gemm_s8act_cpu(xq.data(), ldx, c.m, p, acc.data());
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t r = 0; r < c.n; ++r) {
          int64_t ref = 0;
          for (int64_t kk = 0; kk < c.k; ++kk) {
            const int wv = f == WeightFormat::w8 ? w.q.data<int8_t>()[r * c.k + kk] : s8_weight(w, r, kk);
            ref += int64_t(xq[i * ldx + kk]) * wv;
          }
          ASSERT_EQ(acc[i * c.n + r], ref) << "row " << i << " col " << r;
        }
    }
}

TEST(GemmCpu, PerTokenInt8QuantizationRoundsHalfToEven) {
  const int64_t m = 3, k = 45, ldq = 46;
  Tensor x = random_f32({m, k}, -3, 3);
  for (int64_t c = 0; c < k; ++c) x.data<float>()[2 * k + c] = 0.f;  // all-zero row: scale 1
  x.data<float>()[0] = 3.5f;                                          // row max -> q = 127
  x.data<float>()[1] = 3.5f * 0.5f / 127.f;                           // exactly half a step
  std::vector<int16_t> q(m * ldq, 99);
  std::vector<float> s(m, -1.f);
  cpu::quantize_rows_s8(x.data<float>(), k, m, k, q.data(), ldq, s.data());
  EXPECT_FLOAT_EQ(s[2], 1.f);
  for (int64_t i = 0; i < m; ++i) {
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(x.data<float>()[i * k + c]));
    if (i < 2) EXPECT_EQ(s[i], amax / 127.f);
    for (int64_t c = 0; c < k; ++c)
      EXPECT_EQ(q[i * ldq + c], static_cast<int16_t>(std::nearbyint(x.data<float>()[i * k + c] / s[i])));
    EXPECT_EQ(q[i * ldq + k], 0) << "padding must be zero";
  }
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], static_cast<int16_t>(std::nearbyint(x.data<float>()[1] / s[0])));
}

TEST(GemmCpu, Int8LinearAppliesTokenAndChannelScales) {
  for (WeightFormat f : {WeightFormat::w8, WeightFormat::qoq, WeightFormat::liquid}) {
    const int64_t m = 6, n = 21, k = 66;
    const QuantizedWeight w = random_weight(f, n, k, 32);
    const PackedWeight p = pack_cpu(w);
    const Tensor x = random_activations(m, k, ScalarType::f32);
    const Tensor bias = random_f32({n}, -1, 1);
    PoisonedOutput out(m, n, ScalarType::f32);
    cpu::linear_cpu(x, p, bias, out.y, ops::LinearActivation::int8_per_token);
    EXPECT_TRUE(out.pad_untouched());
    const int64_t ldq = 2 * cpu::num_k_pairs(k);
    std::vector<int16_t> xq(m * ldq);
    std::vector<float> sx(m);
    cpu::quantize_rows_s8(x.data<float>(), k, m, k, xq.data(), ldq, sx.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < n; ++r) {
        int64_t acc = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          acc += int64_t(xq[i * ldq + kk]) * (f == WeightFormat::w8 ? w.q.data<int8_t>()[r * k + kk] : s8_weight(w, r, kk));
        const double sw = f == WeightFormat::w8 ? w.scales.data<float>()[r] : w.channel_scales.data<float>()[r];
        const double ref = double(acc) * sx[i] * sw + bias.data<float>()[r];
        const double got = out.y.data<float>()[i * (n + 3) + r];
        EXPECT_NEAR(got, ref, 4e-7 * (std::fabs(double(acc) * sx[i] * sw) + std::fabs(ref)) + 1e-30)
            << name_of(f) << " row " << i << " col " << r;
      }
  }
}

TEST(PackCpu, RejectsBadWeightsWithClearErrors) {
  ErrorKind kind{};
  QuantizedWeight w = random_weight(WeightFormat::w4, 8, 64, 32);
  w.group = 5;
  std::string msg = error_of([&] { pack_cpu(w); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kValue);
  EXPECT_NE(msg.find("pack_cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of 2"), std::string::npos) << msg;

  QuantizedWeight v = random_weight(WeightFormat::w8, 8, 64, 0);
  v.scales = Tensor::zeros({8}, ScalarType::f16);
  msg = error_of([&] { pack_cpu(v); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kType);
  EXPECT_NE(msg.find("scales"), std::string::npos) << msg;

  QuantizedWeight q = random_weight(WeightFormat::qoq, 8, 64, 32);
  q.channel_scales = Tensor::zeros({7}, ScalarType::f32);
  msg = error_of([&] { pack_cpu(q); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kValue);
  EXPECT_NE(msg.find("channel_scales"), std::string::npos) << msg;

  QuantizedWeight o = random_weight(WeightFormat::qoq, 9, 64, 32);
  o.scales.data<uint8_t>()[2 * 2 + 1] = 9;  // row 2, group 1: (q - z) * 9 leaves the s8 range for some q
  o.zeros.data<uint8_t>()[2 * 2 + 1] = 0;
  for (int c = 32; c < 64; ++c) set_u4(o.q, 2 * 64 + c, c == 40 ? 15 : 0);
  msg = error_of([&] { pack_cpu(o); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kValue);
  EXPECT_NE(msg.find("qoq weight (row 2, k 40) reconstructs to 135, outside the s8 range"), std::string::npos) << msg;

  QuantizedWeight l = random_weight(WeightFormat::liquid, 8, 64, 30);  // liquid groups are k quads
  msg = error_of([&] { pack_cpu(l); }, &kind);
  EXPECT_NE(msg.find("multiple of 4"), std::string::npos) << msg;

  QuantizedWeight s = random_weight(WeightFormat::f16, 8, 10, 0);
  s.k = 11;
  msg = error_of([&] { pack_cpu(s); }, &kind);
  EXPECT_NE(msg.find("'q'"), std::string::npos) << msg;
}

TEST(GemmCpu, FmpqBlocksAccumulateExactlyPerBlock) {
  // Blocks of 128 k with int4 ([-7, 7]) or int8 activations; groups of 32/64/128 inside the blocks.
  const Case cases[] = {{1, 13, 300, 64}, {3, 24, 128, 32}, {6, 9, 258, 128}, {2, 40, 70, 64}};
  for (WeightFormat f : {WeightFormat::w8, WeightFormat::qoq, WeightFormat::liquid})
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(name_of(f)) + " m=" + std::to_string(c.m) + " k=" + std::to_string(c.k));
      const QuantizedWeight w = random_weight(f, c.n, c.k, c.group);
      const PackedWeight p = pack_cpu(w);
      const int64_t ldx = 2 * cpu::num_k_pairs(c.k), blocks = (c.k + 127) / 128;
      std::vector<int16_t> xq(c.m * ldx, 0);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t kk = 0; kk < c.k; ++kk) xq[i * ldx + kk] = static_cast<int16_t>((kk / 128) % 2 ? randint(-7, 7) : randint(-127, 127));
      std::vector<int32_t> acc(c.m * blocks * c.n);
      std::memset(acc.data(), 0xA5, acc.size() * 4);
      cpu::gemm_s8act_blocked_cpu(xq.data(), ldx, c.m, p, 128, acc.data());
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t b = 0; b < blocks; ++b)
          for (int64_t r = 0; r < c.n; ++r) {
            int64_t ref = 0;
            for (int64_t kk = b * 128; kk < std::min<int64_t>(c.k, (b + 1) * 128); ++kk)
              ref += int64_t(xq[i * ldx + kk]) * (f == WeightFormat::w8 ? w.q.data<int8_t>()[r * c.k + kk] : s8_weight(w, r, kk));
            ASSERT_EQ(acc[(i * blocks + b) * c.n + r], ref) << "row " << i << " block " << b << " col " << r;
          }
    }
}

TEST(GemmCpu, FmpqLinearScalesEachBlock) {
  const int64_t m = 3, n = 19, k = 300, blocks = 3;
  const QuantizedWeight w = random_weight(WeightFormat::qoq, n, k, 128);
  const PackedWeight p = pack_cpu(w);
  FmpqActivation x;
  x.q = Tensor::empty({m, k}, ScalarType::s8);
  x.scales = random_f32({m, blocks}, 0.001f, 0.1f);
  for (int64_t i = 0; i < m * k; ++i) x.q.data<int8_t>()[i] = static_cast<int8_t>(randint(-127, 127));
  const Tensor bias = random_f32({n}, -1, 1);
  PoisonedOutput out(m, n, ScalarType::f32);
  cpu::linear_fmpq_cpu(x, p, bias, out.y);
  EXPECT_TRUE(out.pad_untouched());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < n; ++r) {
      double ref = 0, mag = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t acc = 0;
        for (int64_t kk = b * 128; kk < std::min<int64_t>(k, (b + 1) * 128); ++kk)
          acc += int64_t(x.q.data<int8_t>()[i * k + kk]) * s8_weight(w, r, kk);
        ref += double(acc) * x.scales.data<float>()[i * blocks + b];
        mag += std::fabs(double(acc) * x.scales.data<float>()[i * blocks + b]);
      }
      ref = ref * w.channel_scales.data<float>()[r] + bias.data<float>()[r];
      mag = mag * w.channel_scales.data<float>()[r] + std::fabs(bias.data<float>()[r]);
      EXPECT_NEAR(out.y.data<float>()[i * (n + 3) + r], ref, 1e-6 * mag) << "row " << i << " col " << r;
    }
}
