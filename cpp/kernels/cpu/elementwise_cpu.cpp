// Row-wise kernels: each row is read into f32, computed, and written back in the output dtype.
#include "kernels/cpu/elementwise_cpu.h"

#include <cmath>
#include <vector>

namespace lowbit::cpu {
namespace {

// Parallelize only when there is enough work to pay for waking the thread team.
constexpr int64_t kParallelElems = 1 << 15;

void load_row(const RowView& v, int64_t r, float* dst) {
  const int64_t n = v.cols, off = r * v.stride;
  switch (v.dtype) {
    case ScalarType::f16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(v.base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_f32(s[i]);
      break;
    }
    case ScalarType::bf16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(v.base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(s[i]);
      break;
    }
    default: {
      const float* s = reinterpret_cast<const float*>(v.base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
    }
  }
}

void store_row(const RowView& v, int64_t r, const float* src) {
  const int64_t n = v.cols, off = r * v.stride;
  switch (v.dtype) {
    case ScalarType::f16: {
      uint16_t* d = reinterpret_cast<uint16_t*>(v.base) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16_bits(src[i]);
      break;
    }
    case ScalarType::bf16: {
      uint16_t* d = reinterpret_cast<uint16_t*>(v.base) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16_bits(src[i]);
      break;
    }
    default: {
      float* d = reinterpret_cast<float*>(v.base) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
    }
  }
}

// Runs fn(row, scratch) over all rows; scratch holds `scratch_floats` per thread.
template <typename Fn>
void for_each_row(int64_t rows, int64_t work, int64_t scratch_floats, Fn fn) {
#pragma omp parallel if (work >= kParallelElems)
  {
    std::vector<float> scratch(scratch_floats);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) fn(r, scratch.data());
  }
}

void normalize_in_place(float* v, const float* w, int64_t h, float eps) {
  double ss = 0;  // sum of squares in double: exact enough for any hidden size
  for (int64_t i = 0; i < h; ++i) ss += double(v[i]) * v[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(h) + double(eps)));
  for (int64_t i = 0; i < h; ++i) v[i] = v[i] * inv * w[i];
}

}  // namespace

void rms_norm_cpu(const RowView& x, const RowView& weight, float eps, const RowView& out) {
  const int64_t h = x.cols;
  std::vector<float> w(h);
  load_row(weight, 0, w.data());
  for_each_row(x.rows, x.rows * h, h, [&](int64_t r, float* v) {
    load_row(x, r, v);
    normalize_in_place(v, w.data(), h, eps);
    store_row(out, r, v);
  });
}

void add_rms_norm_cpu(const RowView& residual, const RowView& x, const RowView& weight, float eps, const RowView& out) {
  const int64_t h = x.cols;
  std::vector<float> w(h);
  load_row(weight, 0, w.data());
  for_each_row(x.rows, x.rows * h, 2 * h, [&](int64_t r, float* v) {
    float* add = v + h;
    load_row(residual, r, v);
    load_row(x, r, add);
    for (int64_t i = 0; i < h; ++i) v[i] += add[i];
    store_row(residual, r, v);
    load_row(residual, r, v);  // normalize what the residual stream now holds (rounded to its dtype)
    normalize_in_place(v, w.data(), h, eps);
    store_row(out, r, v);
  });
}

void silu_mul_cpu(const RowView& gate_up, const RowView& out) {
  const int64_t inter = out.cols;
  for_each_row(out.rows, gate_up.rows * gate_up.cols, gate_up.cols, [&](int64_t r, float* v) {
    load_row(gate_up, r, v);
    for (int64_t i = 0; i < inter; ++i) {
      const float g = v[i];
      v[i] = g / (1.f + std::exp(-g)) * v[inter + i];
    }
    store_row(out, r, v);
  });
}

void embedding_cpu(const int32_t* ids, const RowView& table, const RowView& out) {
  for_each_row(out.rows, out.rows * out.cols, out.cols, [&](int64_t r, float* v) {
    load_row(table, ids[r], v);
    store_row(out, r, v);
  });
}

void softmax_cpu(const RowView& x, const RowView& out) {
  const int64_t n = x.cols;
  for_each_row(x.rows, x.rows * n, n, [&](int64_t r, float* v) {
    load_row(x, r, v);
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::fmax(mx, v[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      v[i] = std::exp(v[i] - mx);
      sum += v[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) v[i] *= inv;
    store_row(out, r, v);
  });
}

}  // namespace lowbit::cpu
