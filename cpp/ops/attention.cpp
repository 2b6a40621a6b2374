// ops::kv_write and ops::paged_attention: argument checks, then the kernel for the tensors' device.
#include <cmath>

#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/kv_quant_cpu.h"
#include "lowbit/ops/ops.h"

namespace lowbit::ops {

namespace {

void check_float_activation(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK_TYPE(t.dtype() == ScalarType::f32 || t.dtype() == ScalarType::f16 || t.dtype() == ScalarType::bf16,
                    op, ": argument '", arg, "' must be f32, f16 or bf16, got ", name_of(t.dtype()));
  check_dim(t, 3, op, arg);
  LOWBIT_CHECK(t.stride(2) == 1 || t.size(2) <= 1, op, ": argument '", arg,
               "' must be contiguous in its last dimension, got strides ", shape_str(t.strides()));
}

// The only kernels built so far run on the host.
void require_cpu(const Device& d, const char* op, const char* what) {
  if (!d.is_cpu())
    LOWBIT_NOT_SUPPORTED(op, ": ", what, " is on ", d.str(),
                         " but only the CPU kernel is available; GPU attention not built");
}

void check_layer(const KVCache& cache, int layer, const char* op) {
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, layer >= 0 && layer < cache.config().num_layers, op, ": argument 'layer' = ",
                    layer, " out of range [0, ", cache.config().num_layers, ")");
}

void check_s32_vector(const Tensor& t, int64_t n, const char* op, const char* arg) {
  check_defined(t, op, arg);
  check_dtype(t, ScalarType::s32, op, arg);
  check_shape(t, {n}, op, arg);
  check_contiguous(t, op, arg);
}

// Sequences' token ranges and lengths, and the block-table entries the kernel will read.
void check_meta(const AttentionMeta& meta, int64_t num_tokens, const KVCacheConfig& cfg, const char* op) {
  const size_t n = meta.q_len.size();
  LOWBIT_CHECK(meta.q_start.size() == n && meta.kv_len.size() == n, op,
               ": meta.q_start, meta.q_len and meta.kv_len must have one entry per sequence, got sizes ",
               meta.q_start.size(), ", ", meta.q_len.size(), ", ", meta.kv_len.size());
  const Tensor& bt = meta.block_tables;
  check_defined(bt, op, "meta.block_tables");
  check_dtype(bt, ScalarType::s32, op, "meta.block_tables");
  check_dim(bt, 2, op, "meta.block_tables");
  require_cpu(bt.device(), op, "meta.block_tables");
  LOWBIT_CHECK(bt.size(0) == static_cast<int64_t>(n), op, ": meta.block_tables must have one row per sequence (",
               n, "), got shape ", shape_str(bt.shape()));
  LOWBIT_CHECK(bt.stride(1) == 1 || bt.size(1) <= 1, op, ": meta.block_tables must be contiguous in its last dim");
  for (size_t s = 0; s < n; ++s) {
    const int64_t qs = meta.q_start[s], ql = meta.q_len[s], kl = meta.kv_len[s];
    LOWBIT_CHECK(ql >= 0 && qs >= 0 && qs + ql <= num_tokens, op, ": sequence ", s, " has q_start ", qs, ", q_len ",
                 ql, " outside the ", num_tokens, " query tokens");
    LOWBIT_CHECK(kl >= ql, op, ": sequence ", s, " has kv_len ", kl, " < q_len ", ql,
                 " (kv_len counts the new tokens too)");
    if (ql == 0) continue;
    const int64_t blocks = (kl + cfg.block_size - 1) / cfg.block_size;
    LOWBIT_CHECK(blocks <= bt.size(1), op, ": sequence ", s, " needs ", blocks, " blocks for kv_len ", kl,
                 " but meta.block_tables has ", bt.size(1), " columns");
    const int32_t* row = bt.data<int32_t>() + s * bt.stride(0);
    for (int64_t b = 0; b < blocks; ++b)
      LOWBIT_CHECK_KIND(ErrorKind::kIndex, row[b] >= 0 && row[b] < cfg.num_blocks, op, ": meta.block_tables[", s,
                        ", ", b, "] = ", row[b], " is not a block of the cache [0, ", cfg.num_blocks, ")");
  }
}

}  // namespace

void kv_write(KVCache& cache, int layer, const Tensor& k, const Tensor& v, const AttentionMeta& meta) {
  constexpr const char* op = "kv_write";
  const KVCacheConfig& cfg = cache.config();
  check_layer(cache, layer, op);
  check_float_activation(k, op, "k");
  check_float_activation(v, op, "v");
  const int64_t T = k.size(0);
  check_shape(k, {T, cfg.num_kv_heads, cfg.head_dim}, op, "k");
  check_shape(v, {T, cfg.num_kv_heads, cfg.head_dim}, op, "v");
  check_s32_vector(meta.slot_mapping, T, op, "meta.slot_mapping");
  require_cpu(cfg.device, op, "the KV cache");
  require_cpu(k.device(), op, "argument 'k'");
  require_cpu(v.device(), op, "argument 'v'");
  require_cpu(meta.slot_mapping.device(), op, "meta.slot_mapping");
  const int32_t* slots = meta.slot_mapping.data<int32_t>();
  const int64_t num_slots = cfg.num_blocks * cfg.block_size;
  for (int64_t t = 0; t < T; ++t)
    LOWBIT_CHECK_KIND(ErrorKind::kIndex, slots[t] < num_slots, op, ": meta.slot_mapping[", t, "] = ", slots[t],
                      " is past the cache's ", num_slots, " slots (negative slots skip a token)");
  cpu::kv_write_cpu(cache, layer, k, v, meta.slot_mapping);
}

void paged_attention(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                     Tensor& out) {
  constexpr const char* op = "paged_attention";
  const KVCacheConfig& cfg = cache.config();
  check_layer(cache, layer, op);
  check_float_activation(q, op, "q");
  check_float_activation(out, op, "out");
  check_shape(out, q.shape(), op, "out");
  LOWBIT_CHECK(q.size(2) == cfg.head_dim, op, ": argument 'q' has head_dim ", q.size(2), " but the cache has ",
               cfg.head_dim);
  LOWBIT_CHECK(q.size(1) > 0 && q.size(1) % cfg.num_kv_heads == 0, op, ": argument 'q' has ", q.size(1),
               " heads, which must be a positive multiple of the cache's ", cfg.num_kv_heads, " KV heads");
  LOWBIT_CHECK(std::isfinite(scale), op, ": argument 'scale' must be finite, got ", scale);
  require_cpu(q.device(), op, "argument 'q'");
  require_cpu(out.device(), op, "argument 'out'");
  require_cpu(cfg.device, op, "the KV cache");
  check_meta(meta, q.size(0), cfg, op);
  cpu::paged_attention_cpu(q, cache, layer, meta, scale, out);
}

}  // namespace lowbit::ops
