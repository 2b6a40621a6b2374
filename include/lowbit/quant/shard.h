// Slices of a QuantizedWeight for tensor parallelism: every field (codes, scales, zeros, mins,
// per-channel terms) is cut with the weight, so a shard is again a valid QuantizedWeight that the
// packers take as they take a whole one.
#pragma once
#include <string>

#include "lowbit/quant/format.h"

namespace lowbit {

// Output channels [r0, r1) (a column-parallel shard: q/k/v, gate/up, a vocabulary slice of lm_head).
QuantizedWeight slice_weight_rows(const QuantizedWeight& w, int64_t r0, int64_t r1, const std::string& what);
// Input channels [k0, k1) (a row-parallel shard: o_proj, down_proj). Group-wise weights (w4, qoq,
// liquid, grouped w8) need k0 and k1 on group boundaries (k1 may be k); otherwise this throws
// naming `what`, the group and the shard, since a group cut in two has no single scale.
// Per-output-channel terms (w8/e4m3 scales, qoq/liquid channel scales) are kept whole.
QuantizedWeight slice_weight_cols(const QuantizedWeight& w, int64_t k0, int64_t k1, const std::string& what);

}  // namespace lowbit
