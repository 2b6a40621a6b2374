// AttentionMeta: one forward step's sequences as the attention kernels see them (query rows, KV
// lengths, block tables, slots). It lives with the KV cache so that the kernels (which read it) and
// the ops (which check it) both point down to it.
#pragma once
#include <algorithm>
#include <cstddef>
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
  // GPU only, optional, for a mixed step (see decode_prefix): the same rows of its decode sequences
  // [3, d] and of the rest [3, num_seqs - d], each contiguous, uploaded with seq_info.
  Tensor decode_seq_info, prefill_seq_info;
};

// How many leading sequences of a step are decode rows (one query each, sequence i at row i). The
// scheduler puts running decodes before prefill chunks, so in a mixed step these run on the decode
// kernel and the rest on the prefill kernel: a prefill kernel would spend a whole query tile on each.
inline size_t decode_prefix(const AttentionMeta& m) {
  size_t d = 0;
  while (d < m.q_len.size() && m.q_start[d] == int32_t(d) && m.q_len[d] == 1) ++d;
  return d;
}

// Sequences [first, first + count) of `m` as a step of their own: the host vectors and block-table rows
// sliced, q_start left absolute (the same q and out serve every part), seq_info as given (may be undefined).
inline AttentionMeta meta_part(const AttentionMeta& m, size_t first, size_t count, const Tensor& seq_info) {
  AttentionMeta p;
  p.q_start.assign(m.q_start.begin() + long(first), m.q_start.begin() + long(first + count));
  p.q_len.assign(m.q_len.begin() + long(first), m.q_len.begin() + long(first + count));
  p.kv_len.assign(m.kv_len.begin() + long(first), m.kv_len.begin() + long(first + count));
  p.block_tables = m.block_tables.slice(0, int64_t(first), int64_t(first + count));
  p.slot_mapping = m.slot_mapping;
  for (size_t i = 0; i < count; ++i) {
    p.max_q_len = std::max(p.max_q_len, p.q_len[i]);
    p.max_kv_len = std::max(p.max_kv_len, p.kv_len[i]);
  }
  p.seq_info = seq_info;
  return p;
}

}  // namespace lowbit
