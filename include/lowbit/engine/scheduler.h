// Continuous-batching scheduler (no model inside: it decides which tokens run each step and
// reserves their KV blocks).
//
// Each step, within max_batch_tokens tokens and max_seqs sequences:
//   1. running decodes (one token each), oldest admission first;
//   2. running sequences still in a chunked prefill, as many tokens as the budget leaves;
//   3. waiting sequences in FIFO order (preempted ones first), prefills chunked to the budget,
//      admitted only while their first chunk's KV blocks are free. With prefix caching on in the
//      allocator, a sequence without KV first adopts the cached blocks of its prefix and its first
//      chunk starts after them (a recomputing, preempted sequence finds its own blocks if they
//      were not evicted meanwhile).
// When a running sequence cannot get a block, the scheduler first asks the owner to reclaim idle
// memory (idle sessions), then preempts the most recently admitted running sequence: its blocks are
// freed and it goes back to the front of the queue to recompute prompt + generated tokens later.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "lowbit/engine/request.h"
#include "lowbit/kv/kv_cache.h"

namespace lowbit {

struct Sequence {
  int64_t request_id = 0;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t prompt_len = 0;
  RequestOptions opts;
  SeqId kv = -1;               // allocator sequence, -1 while it holds no KV
  int64_t num_computed = 0;    // tokens whose K/V are in the cache (computed or adopted from the prefix cache)
  int64_t admit_order = -1;    // larger = admitted more recently
  // Overlapped decode steps (EngineConfig::overlap_steps): tokens[pending_token] is a placeholder for the token a
  // step still running samples (-1: none; when set, it is the last token); retired: finished or aborted while a
  // queued step still holds its row, which is then dropped.
  int64_t pending_token = -1;
  bool retired = false;
  int64_t num_generated() const { return int64_t(tokens.size()) - prompt_len; }
  int64_t remaining() const { return int64_t(tokens.size()) - num_computed; }
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0, len = 0;  // token range [start, start + len) of seq->tokens computed this step
  bool sample = false;         // the chunk reaches the last token: sample the next one
};

class Scheduler {
 public:
  // reclaim(): frees some idle KV (returns false when there is nothing left to free).
  Scheduler(BlockAllocator& allocator, int64_t max_batch_tokens, int max_seqs, std::function<bool()> reclaim);

  void add(std::unique_ptr<Sequence> seq);  // to the back of the waiting queue
  // Plans one step and reserves the KV of every scheduled token (copy-on-write copies, if any,
  // are appended to `copies`). Sequences stay owned by the scheduler.
  std::vector<ScheduledChunk> schedule(std::vector<std::pair<int32_t, int32_t>>* copies = nullptr);
  // Takes a running or waiting sequence out (finished or aborted); nullptr when unknown.
  // Its KV stays allocated: the caller frees it or keeps it for a session.
  std::unique_ptr<Sequence> remove(int64_t request_id);
  Sequence* find(int64_t request_id) const;
  // Frees a running sequence's KV and puts it back at the front of the queue to recompute
  // (used when a step fails after its KV was reserved, so no half-written state survives).
  void requeue(Sequence* seq);

  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_preemptions() const { return preemptions_; }
  bool empty() const { return running_.empty() && waiting_.empty(); }

 private:
  void preempt(Sequence* seq);
  bool reserve(Sequence* seq, int64_t len, std::vector<std::pair<int32_t, int32_t>>* copies);
  int64_t blocks_for(const Sequence& seq, int64_t len) const;

  BlockAllocator& alloc_;
  int64_t max_batch_tokens_;
  int max_seqs_;
  std::function<bool()> reclaim_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  std::deque<std::unique_ptr<Sequence>> waiting_;
  int64_t next_admit_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace lowbit
