// AttentionMeta: one forward step's sequences as the attention kernels see them (query rows, KV
// lengths, block tables, slots). It lives with the KV cache so that the kernels (which read it) and
// the ops (which check it) both point down to it.
#pragma once
#include <cstdint>
#include <vector>

#include "lowbit/core/tensor.h"

namespace lowbit {

// Tokens of sequence i are rows [q_start[i], q_start[i] + q_len[i]) of q; the sequence holds
// kv_len[i] tokens in the cache including these new ones, so query j of the sequence sits at
// position kv_len[i] - q_len[i] + j and attends causally to positions <= it.
// Decode is q_len = 1; prefill and chunked prefill are q_len > 1; one batch may mix both.
struct AttentionMeta {
  std::vector<int32_t> q_start, q_len, kv_len;  // host copies, one entry per sequence
  Tensor block_tables;  // s32 [num_seqs, max_blocks] (padded with -1), on the KV device
  Tensor slot_mapping;  // s32 [T]: cache slot of each new token, on the KV device
  int32_t max_q_len = 0, max_kv_len = 0;
  // GPU only, optional: s32 [3, num_seqs] = (q_start, q_len, kv_len) rows on the KV device, uploaded
  // once per step by the model; when undefined, paged_attention uploads them itself (one sync copy).
  Tensor seq_info;
};

}  // namespace lowbit
