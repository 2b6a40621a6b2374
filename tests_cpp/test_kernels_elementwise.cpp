// Row-wise CPU kernels (rms_norm, add_rms_norm, silu_mul, embedding, softmax) against float64
// references on random data, every float dtype, odd widths, strided rows, poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/elementwise_cpu.h"

using namespace lowbit;
using cpu::RowView;

namespace {

std::mt19937 g_rng(77);
float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_rng); }

const ScalarType kTypes[] = {ScalarType::f32, ScalarType::f16, ScalarType::bf16};

// Half a unit in the last place, relative, of each dtype: the rounding of one f32 -> dtype store.
double half_ulp(ScalarType t) { return t == ScalarType::f32 ? std::ldexp(1.0, -24) : t == ScalarType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8); }

// A [rows, cols] matrix stored with `pad` extra (poisoned) elements per row.
struct Mat {
  ScalarType dt;
  int64_t rows, cols, stride;
  std::vector<uint8_t> bytes;
  Mat(ScalarType t, int64_t r, int64_t c, int64_t pad = 0) : dt(t), rows(r), cols(c), stride(c + pad) {
    bytes.assign(r * stride * bytes_for(t, 1), 0xFF);  // NaN everywhere
  }
  RowView view() { return RowView{reinterpret_cast<char*>(bytes.data()), dt, rows, cols, stride}; }
  double get(int64_t r, int64_t c) const {
    const int64_t i = r * stride + c;
    if (dt == ScalarType::f32) return reinterpret_cast<const float*>(bytes.data())[i];
    const uint16_t b = reinterpret_cast<const uint16_t*>(bytes.data())[i];
    return dt == ScalarType::f16 ? f16_bits_to_f32(b) : bf16_bits_to_f32(b);
  }
  void set(int64_t r, int64_t c, float v) {
    const int64_t i = r * stride + c;
    if (dt == ScalarType::f32) reinterpret_cast<float*>(bytes.data())[i] = v;
    else reinterpret_cast<uint16_t*>(bytes.data())[i] = dt == ScalarType::f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
  }
  void randomize(float lo, float hi) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) set(r, c, uniform(lo, hi));
  }
  bool padding_poisoned() const {
    const int64_t es = bytes_for(dt, 1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = cols * es; b < stride * es; ++b)
        if (bytes[r * stride * es + b] != 0xFF) return false;
    return true;
  }
};

// |got - want| <= rel * |want| + abs: one rounding to the output dtype plus f32 math (~1e-6).
void expect_close(double got, double want, ScalarType out, double scale, const std::string& where) {
  const double tol = (half_ulp(out) + 2e-6) * std::fabs(want) + 2e-6 * scale + 1e-30;
  ASSERT_LE(std::fabs(got - want), tol) << where << ": got " << got << " want " << want;
}

}  // namespace

TEST(ElementwiseCpu, RmsNormMatchesFloat64) {
  for (ScalarType xt : kTypes)
    for (ScalarType wt : kTypes)
      for (int64_t h : {1, 7, 64, 577}) {
        const int64_t rows = 5;
        Mat x(xt, rows, h, 3), w(wt, 1, h), out(xt, rows, h, 2);
        x.randomize(-3, 3);
        w.randomize(0.5, 1.5);
        cpu::rms_norm_cpu(x.view(), w.view(), 1e-5f, out.view());
        EXPECT_TRUE(out.padding_poisoned());
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t c = 0; c < h; ++c) ss += x.get(r, c) * x.get(r, c);
          const double inv = 1.0 / std::sqrt(ss / h + 1e-5);
          for (int64_t c = 0; c < h; ++c)
            expect_close(out.get(r, c), x.get(r, c) * inv * w.get(0, c), xt, 0, "rms_norm " + std::string(name_of(xt)));
        }
      }
}

TEST(ElementwiseCpu, AddRmsNormUpdatesResidualThenNormalizes) {
  for (ScalarType t : kTypes) {
    const int64_t rows = 4, h = 131;
    Mat res(t, rows, h, 1), x(t, rows, h), w(ScalarType::f32, 1, h), out(t, rows, h, 1);
    res.randomize(-2, 2);
    x.randomize(-2, 2);
    w.randomize(0.5, 1.5);
    const Mat before = res;
    cpu::add_rms_norm_cpu(res.view(), x.view(), w.view(), 1e-6f, out.view());
    EXPECT_TRUE(out.padding_poisoned());
    EXPECT_TRUE(res.padding_poisoned());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < h; ++c) {
        const double sum = before.get(r, c) + x.get(r, c);
        expect_close(res.get(r, c), sum, t, 0, "residual");
        ss += res.get(r, c) * res.get(r, c);
      }
      const double inv = 1.0 / std::sqrt(ss / h + 1e-6);
      for (int64_t c = 0; c < h; ++c) expect_close(out.get(r, c), res.get(r, c) * inv * w.get(0, c), t, 0, "out");
    }
  }
}

TEST(ElementwiseCpu, SiluMulMatchesFloat64) {
  for (ScalarType t : kTypes) {
    const int64_t rows = 3, inter = 37;
    Mat gu(t, rows, 2 * inter, 5), out(t, rows, inter, 3);
    gu.randomize(-6, 6);
    cpu::silu_mul_cpu(gu.view(), out.view());
    EXPECT_TRUE(out.padding_poisoned());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < inter; ++i) {
        const double g = gu.get(r, i), u = gu.get(r, inter + i);
        expect_close(out.get(r, i), g / (1 + std::exp(-g)) * u, t, 0, "silu_mul");
      }
  }
}

TEST(ElementwiseCpu, EmbeddingGathersRowsAndConverts) {
  for (ScalarType tt : kTypes)
    for (ScalarType ot : kTypes) {
      const int64_t vocab = 50, h = 19;
      Mat table(tt, vocab, h), out(ot, 6, h, 2);
      table.randomize(-1, 1);
      const std::vector<int32_t> ids = {0, 49, 7, 7, 23, 1};
      cpu::embedding_cpu(ids.data(), table.view(), out.view());
      EXPECT_TRUE(out.padding_poisoned());
      for (int64_t t = 0; t < 6; ++t)
        for (int64_t c = 0; c < h; ++c) {
          const double want = table.get(ids[t], c);
          if (tt == ot || ot == ScalarType::f32) ASSERT_EQ(out.get(t, c), want);  // exact copy / widening
          else expect_close(out.get(t, c), want, ot, 0, "embedding");
        }
    }
}

TEST(ElementwiseCpu, SoftmaxMatchesFloat64) {
  for (ScalarType t : kTypes)
    for (int64_t n : {1, 10, 1000}) {
      Mat x(t, 3, n, 1), out(ScalarType::f32, 3, n, 1);
      x.randomize(-20, 20);
      cpu::softmax_cpu(x.view(), out.view());
      EXPECT_TRUE(out.padding_poisoned());
      for (int64_t r = 0; r < 3; ++r) {
        double mx = -1e300, sum = 0;
        for (int64_t c = 0; c < n; ++c) mx = std::max(mx, x.get(r, c));
        for (int64_t c = 0; c < n; ++c) sum += std::exp(x.get(r, c) - mx);
        for (int64_t c = 0; c < n; ++c)
          ASSERT_NEAR(out.get(r, c), std::exp(x.get(r, c) - mx) / sum, 1e-6 * std::exp(x.get(r, c) - mx) / sum + 1e-12);
      }
    }
}
