// QuantizedWeight slices for tensor parallelism (quant/shard.h).
#include "lowbit/quant/shard.h"

#include <cstring>

namespace lowbit {
namespace {

// An owned copy of t[dim: a..b] for a host tensor of 1 or 2 dims: whole rows are one copy, a column range
// one copy per row. Sub-byte codes cut between bytes (u4 with even bounds and an even row) are copied as
// bytes; other cuts go through one value per byte.
Tensor cut(const Tensor& t, int64_t dim, int64_t a, int64_t b) {
  if (!t.defined()) return t;
  LOWBIT_CHECK(t.device().is_cpu() && t.dim() <= 2 && dim < t.dim(), "slice_weight: expected a host tensor of 1 or 2 ",
               "dims, got ", t.str());
  const Tensor src = t.contiguous();
  const int64_t rows = src.dim() == 2 ? src.size(0) : 1, cols = src.dim() == 2 ? src.size(1) : src.size(0);
  const bool packed = is_sub_byte(src.dtype());
  if (packed && (cols % 2 != 0 || (dim == src.dim() - 1 && (a % 2 != 0 || b % 2 != 0)))) {
    LOWBIT_CHECK(src.dtype() == ScalarType::u4, "slice_weight: unexpected sub-byte type ", name_of(src.dtype()));
    return pack_u4_values(unpack_u4_values(src).slice(dim, a, b).contiguous(), "slice_weight", "q");
  }
  Shape shape = src.shape();
  shape[size_t(dim)] = b - a;
  Tensor out = Tensor::empty(shape, src.dtype());
  const int64_t row_bytes = bytes_for(src.dtype(), cols);
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  if (dim == 0 && src.dim() == 2) {
    std::memcpy(to, from + a * row_bytes, size_t((b - a) * row_bytes));
  } else {
    const int64_t offset = bytes_for(src.dtype(), a), width = bytes_for(src.dtype(), b - a);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(to + r * width, from + r * row_bytes + offset, size_t(width));
  }
  return out;
}

// Whether a field is per (row, group) rather than per row.
bool per_group(const QuantizedWeight& w, const Tensor& field) {
  return field.defined() && field.dim() == 2 && w.group > 0;
}

}  // namespace

QuantizedWeight slice_weight_rows(const QuantizedWeight& w, int64_t r0, int64_t r1, const std::string& what) {
  LOWBIT_CHECK(0 <= r0 && r0 < r1 && r1 <= w.n, "slice_weight_rows: '", what, "': rows [", r0, ", ", r1,
               ") are not inside [0, ", w.n, ")");
  QuantizedWeight out = w;
  out.n = r1 - r0;
  out.q = cut(w.q, 0, r0, r1);
  out.scales = cut(w.scales, 0, r0, r1);
  out.zeros = cut(w.zeros, 0, r0, r1);
  out.channel_scales = cut(w.channel_scales, 0, r0, r1);
  out.mins = cut(w.mins, 0, r0, r1);
  return out;
}

QuantizedWeight slice_weight_cols(const QuantizedWeight& w, int64_t k0, int64_t k1, const std::string& what) {
  LOWBIT_CHECK(0 <= k0 && k0 < k1 && k1 <= w.k, "slice_weight_cols: '", what, "': input channels [", k0, ", ", k1,
               ") are not inside [0, ", w.k, ")");
  if (w.group > 0)
    LOWBIT_CHECK(k0 % w.group == 0 && (k1 % w.group == 0 || k1 == w.k), "tensor parallel: '", what, "' (",
                 name_of(w.format), ", groups of ", w.group, " input channels) cannot be split at input channels [",
                 k0, ", ", k1, "): a shard must hold whole groups, so each rank's share of the input (", k1 - k0,
                 ") must be a multiple of ", w.group,
                 ". Use fewer ranks, or quantize with a group that divides the shard (e.g. 32 or 64)");
  QuantizedWeight out = w;
  out.k = k1 - k0;
  out.q = cut(w.q, 1, k0, k1);
  const int64_t g0 = w.group > 0 ? k0 / w.group : 0, g1 = w.group > 0 ? (k1 + w.group - 1) / w.group : 0;
  for (Tensor* f : {&out.scales, &out.zeros, &out.mins})
    if (per_group(w, *f)) *f = cut(*f, 1, g0, g1);
  return out;
}

}  // namespace lowbit
