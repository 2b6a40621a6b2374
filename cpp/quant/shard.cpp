// QuantizedWeight slices for tensor parallelism (quant/shard.h).
#include "lowbit/quant/shard.h"

namespace lowbit {
namespace {

// An owned copy of t[dim: a..b] (sub-byte codes go through one value per byte).
Tensor cut(const Tensor& t, int64_t dim, int64_t a, int64_t b) {
  if (!t.defined()) return t;
  if (t.dtype() == ScalarType::u4) {
    const Tensor values = unpack_u4_values(t).slice(dim, a, b).contiguous();
    return pack_u4_values(values, "slice_weight", "q");
  }
  return t.slice(dim, a, b).clone();
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
