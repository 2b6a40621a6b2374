// Shard layout and weight cuts of a tensor-parallel rank (model/tensor_parallel.h).
#include "lowbit/model/tensor_parallel.h"

#include <algorithm>

#include "lowbit/quant/shard.h"

namespace lowbit {

ShardLayout ShardLayout::make(const ModelConfig& c, int rank, int world) {
  constexpr const char* op = "tensor parallel";
  LOWBIT_CHECK(world >= 1 && rank >= 0 && rank < world, op, ": rank ", rank, " is outside [0, ", world, ")");
  LOWBIT_CHECK(c.num_heads % world == 0, op, ": the model's ", c.num_heads, " attention heads (num_attention_heads) ",
               "do not divide among ", world, " ranks; use a tensor_parallel size that divides ", c.num_heads);
  const bool replicate_kv = c.num_kv_heads < world;
  if (replicate_kv)
    LOWBIT_CHECK(world % c.num_kv_heads == 0, op, ": the model's ", c.num_kv_heads, " KV heads (num_key_value_heads) ",
                 "can neither be split among nor replicated over ", world, " ranks (", world, " must be a multiple of ",
                 c.num_kv_heads, ")");
  else
    LOWBIT_CHECK(c.num_kv_heads % world == 0, op, ": the model's ", c.num_kv_heads, " KV heads (num_key_value_heads) ",
                 "do not divide among ", world, " ranks; use a tensor_parallel size that divides ", c.num_kv_heads);
  LOWBIT_CHECK(c.intermediate_size % world == 0, op, ": intermediate_size ", c.intermediate_size,
               " does not divide among ", world, " ranks");
  ShardLayout s;
  s.rank = rank;
  s.world = world;
  s.heads = c.num_heads / world;
  s.q_head0 = rank * s.heads;
  s.kv_heads = replicate_kv ? 1 : c.num_kv_heads / world;
  // With replication, rank r's query heads all read KV head r / (world / num_kv_heads).
  s.kv_head0 = replicate_kv ? rank / (world / c.num_kv_heads) : rank * s.kv_heads;
  s.inter = c.intermediate_size / world;
  s.inter0 = rank * s.inter;
  s.vocab_stride = (c.vocab_size + world - 1) / world;
  s.vocab0 = std::min<int64_t>(c.vocab_size, rank * s.vocab_stride);
  s.vocab = std::min<int64_t>(c.vocab_size, s.vocab0 + s.vocab_stride) - s.vocab0;
  LOWBIT_CHECK(s.vocab > 0, op, ": vocab_size ", c.vocab_size, " leaves rank ", rank, " of ", world,
               " without a vocabulary slice");
  return s;
}

ModelConfig ShardLayout::local(const ModelConfig& full) const {
  ModelConfig c = full;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.intermediate_size = inter;
  return c;
}

ShardCut shard_cut(const ShardLayout& s, const ModelConfig& c, const std::string& suffix) {
  if (!s.sharded()) return {};
  const int64_t D = c.head_dim;
  const bool q = suffix.rfind("self_attn.q_proj.", 0) == 0;
  const bool kv = suffix.rfind("self_attn.k_proj.", 0) == 0 || suffix.rfind("self_attn.v_proj.", 0) == 0;
  if (q) return {ShardKind::rows, s.q_head0 * D, (s.q_head0 + s.heads) * D};
  if (kv) return {ShardKind::rows, s.kv_head0 * D, (s.kv_head0 + s.kv_heads) * D};
  if (suffix == "mlp.gate_proj.weight" || suffix == "mlp.up_proj.weight")
    return {ShardKind::rows, s.inter0, s.inter0 + s.inter};
  if (suffix == "self_attn.o_proj.weight") return {ShardKind::cols, s.q_head0 * D, (s.q_head0 + s.heads) * D};
  if (suffix == "mlp.down_proj.weight") return {ShardKind::cols, s.inter0, s.inter0 + s.inter};
  if (suffix == "lm_head.weight") return {ShardKind::rows, s.vocab0, s.vocab0 + s.vocab};
  return {};  // embedding, norms: whole on every rank
}

Tensor shard_float(const Tensor& full, const ShardCut& cut) {
  if (cut.kind == ShardKind::whole) return full;
  return full.slice(cut.kind == ShardKind::rows ? 0 : 1, cut.begin, cut.end).clone();
}

QuantizedWeight shard_quantized(const QuantizedWeight& full, const ShardCut& cut, const std::string& name) {
  switch (cut.kind) {
    case ShardKind::rows: return slice_weight_rows(full, cut.begin, cut.end, name);
    case ShardKind::cols: return slice_weight_cols(full, cut.begin, cut.end, name);
    default: return full;
  }
}

}  // namespace lowbit
