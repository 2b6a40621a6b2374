// Argument checks of ops::rope and ops::kv_write, shared with ops::rope_kv_write so that the fused
// op refuses bad input with the same messages (naming `op`) before it touches anything.
#pragma once
#include "lowbit/ops/ops.h"

namespace lowbit::ops {

// Checks rope's operands and config; returns their device (every defined operand on one device).
Device check_rope_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& positions,
                       const RopeConfig& cfg);
// Checks kv_write's operands against the cache (on the CPU also every slot); returns their device.
Device check_kv_write_args(const char* op, const KVCache& cache, int layer, const Tensor& k, const Tensor& v,
                           const AttentionMeta& meta);

}  // namespace lowbit::ops
