// What one rank of a tensor-parallel model holds (Megatron-style): query heads and KV heads split
// across ranks (KV heads replicated when there are fewer of them than ranks), the MLP's intermediate
// channels split, the vocabulary of lm_head split. q/k/v and gate/up are column-parallel (rows cut),
// o and down row-parallel (input channels cut; their partial sums are all-reduced), the embedding
// table and the norms are whole on every rank.
#pragma once
#include <cstdint>
#include <string>

#include "lowbit/core/tensor.h"
#include "lowbit/model/config.h"
#include "lowbit/quant/format.h"

namespace lowbit {

struct ShardLayout {
  int rank = 0, world = 1;
  int q_head0 = 0, heads = 0;       // query heads [q_head0, q_head0 + heads)
  int kv_head0 = 0, kv_heads = 0;   // KV heads [kv_head0, kv_head0 + kv_heads)
  int64_t inter0 = 0, inter = 0;    // intermediate channels [inter0, inter0 + inter)
  int64_t vocab0 = 0, vocab = 0;    // lm_head rows [vocab0, vocab0 + vocab)
  int64_t vocab_stride = 0;         // ceil(vocab_size / world): every rank's logits slot in the gather

  // Throws ValueError naming the config field that does not divide among `world` ranks.
  static ShardLayout make(const ModelConfig& full, int rank, int world);
  // The config this rank's forward runs: its heads, KV heads and intermediate size.
  ModelConfig local(const ModelConfig& full) const;
  bool sharded() const { return world > 1; }
};

// How a weight name is cut: rows (column-parallel), input channels (row-parallel) or not at all.
enum class ShardKind { whole, rows, cols };
struct ShardCut {
  ShardKind kind = ShardKind::whole;
  int64_t begin = 0, end = 0;  // rows or input channels of the full tensor
};
// The cut of HF weight `suffix` (after "model.layers.{i}.", or a model-level name) on this rank.
ShardCut shard_cut(const ShardLayout& s, const ModelConfig& full, const std::string& suffix);

// A float tensor's shard (host f32 in, host f32 out).
Tensor shard_float(const Tensor& full, const ShardCut& cut);
// A quantized weight's shard; `name` appears in errors (a group that the cut would split).
QuantizedWeight shard_quantized(const QuantizedWeight& full, const ShardCut& cut, const std::string& name);

}  // namespace lowbit
