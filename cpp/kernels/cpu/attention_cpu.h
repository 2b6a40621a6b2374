// Paged attention on the CPU over any K/V cache format (f32/f16/bf16, u8/u4/u2 per token, u4/u2 per-channel K
// with its f16 residual window), q/out f32/f16/bf16.
#pragma once
#include "lowbit/core/tensor.h"
#include "lowbit/kv/kv_cache.h"
#include "lowbit/kv/attention_meta.h"

namespace lowbit::cpu {

// out[T, Hq, D] = softmax(q kᵀ * scale, causal) v for every sequence of `meta` (see ops.h), with
// query heads h*G .. h*G+G-1 sharing KV head h (G = Hq / Hkv). Arguments are validated by
// ops::paged_attention. max_keys_per_item > 0 forces split-KV parts of at most that many keys
// (rounded up to whole blocks; tests use it); 0 splits only when there are too few items for the threads.
void paged_attention_cpu(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                         Tensor& out, int64_t max_keys_per_item = 0);

}  // namespace lowbit::cpu
