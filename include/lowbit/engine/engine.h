// Engine: requests -> Scheduler (continuous batching) -> Model::forward -> per-request Sampler ->
// TokenEvents. Owns the paged KV cache and every per-step buffer (sized once at construction).
// Not thread-safe: one caller drives step(); the Python binding releases the GIL inside it.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/engine/request.h"
#include "lowbit/engine/sampler.h"
#include "lowbit/engine/scheduler.h"
#include "lowbit/kv/kv_cache.h"
#include "lowbit/model/model.h"

namespace lowbit {

class RankThreads;

struct EngineConfig {
  int64_t max_batch_tokens = 2048;  // tokens per step (prefill chunks + decodes)
  int max_seqs = 64;                // sequences per step
  int block_size = 16;              // tokens per KV block (per-channel K recipes use their K group instead)
  // KV pool bytes. 0: 512 MiB on the host; on a GPU what gpu_memory_fraction leaves after the weights
  // and workspace. Either way at most max_seqs full-length sequences.
  int64_t kv_cache_bytes = 0;
  // GPU: the share of the device's total memory this process may fill (weights, workspace, KV pool
  // and whatever else already holds memory); the KV pool takes what is left of it, minus a reserve
  // for per-step scratch and graph memory.
  double gpu_memory_fraction = 0.9;
  bool cuda_graphs = true;          // GPU: decode-only steps replay CUDA graphs (Model::decode_step)
  // GPU, CUDA graphs: while a decode step runs, the next one is queued behind it with its token ids taken from this
  // step's sampled tokens on the device, so the host's work (this step's tokens and events, the caller's loop, the
  // next step's staging) overlaps the GPU's instead of leaving it idle. step() still returns one step's events. A
  // sequence that samples a stop token computes one more row, which is dropped. Steps are not overlapped while a
  // waiting request could be admitted, a row is sampled on the host (penalties, logprobs, min_tokens with stop ids)
  // or K is quantized per channel.
  bool overlap_steps = true;
  int num_threads = 0;              // CPU threads for the kernels (0: leave the OpenMP default)
  // Automatic prefix caching: full KV blocks stay cached (keyed by their tokens' chained hash, the
  // model, recipe and K/V formats) and a request whose prompt starts with cached blocks computes only
  // the rest. Outputs are the same either way; false frees a block's KV as soon as no request holds it.
  bool prefix_caching = true;
};

struct EngineStats {
  int64_t num_free_blocks = 0, num_blocks = 0;
  int block_size = 0;
  int64_t running = 0, waiting = 0, preemptions = 0;
  int64_t sessions = 0;          // sessions holding KV
  int64_t prefill_tokens = 0;    // prompt positions computed so far (KV reused by a session or the prefix cache is not)
  int64_t generated_tokens = 0;  // tokens sampled so far
  // Prefix caching (all 0 when it is off). num_free_blocks counts the evictable cached blocks.
  bool prefix_caching = false;
  int64_t prefix_cache_query_tokens = 0;  // tokens of the requests admitted so far (re-admissions too)
  int64_t prefix_cache_hit_tokens = 0;    // of those, tokens whose KV came from the cache
  int64_t prefix_cache_blocks = 0;        // blocks cached now (held by requests or evictable)
  int64_t prefix_cache_evictions = 0;     // cached blocks reused for other tokens so far
  // Replayed CUDA-graph decode steps (rank 0): their count and device time (Model::decode_graph_timing); the
  // wall time of the same steps minus these is the time the GPU waited on the host.
  int64_t decode_graph_steps = 0;
  double decode_graph_ms = 0, decode_upload_ms = 0;
  // The same steps' host walls, nested: step() as a whole, the ranks' decode_step calls (from the hand-off until
  // every rank returned) and rank 0's decode_step alone (entry to return). Their differences place the host time:
  // the engine's own bookkeeping, waiting for the other ranks, rank 0's staging and its wait for the GPU.
  double decode_step_wall_ms = 0, decode_ranks_wall_ms = 0, decode_rank0_wall_ms = 0;
  // Decode steps queued behind the step before them (EngineConfig::overlap_steps), and rows they computed for
  // sequences that had stopped meanwhile (dropped).
  int64_t overlapped_steps = 0, dropped_rows = 0;
};

class Engine {
 public:
  // `model` must be finalized and outlive the engine.
  Engine(const Model& model, const EngineConfig& config = {});
  // Tensor parallelism: ranks[r] is rank r of one group (Model::set_tensor_parallel), all finalized,
  // each on its own device (NCCL) or on shared ones (the thread communicator). One scheduler, block
  // allocator and sampler serve all ranks: each rank holds its KV heads of the same blocks, runs the
  // same batch on its own host thread (engine/rank_threads.h says why threads), and rank 0's sampled
  // tokens feed every rank's next step. A forward that fails on one rank aborts the group: that step's
  // error propagates, and later calls raise naming it (the communicators cannot be trusted after it).
  Engine(const std::vector<const Model*>& ranks, const EngineConfig& config = {});
  ~Engine();

  // Validates everything (ValueError naming the parameter) before queueing; nothing changes on error.
  void add_request(int64_t request_id, const std::vector<int32_t>& prompt_ids, const RequestOptions& opts = {});
  // One scheduler step; returns the tokens sampled (and abort/finish events). When the forward
  // throws, the scheduled requests are re-queued with their KV freed and the error propagates.
  std::vector<TokenEvent> step();
  // Frees the request's KV; its "abort" event comes with the next step(). Unknown ids are ignored.
  void abort(int64_t request_id);
  void end_session(int64_t session_id);
  bool has_unfinished() const;
  // f32 [T, vocab] logits of every position of `prompt_ids` (a scratch sequence, freed afterwards).
  Tensor logits(const std::vector<int32_t>& prompt_ids);
  EngineStats stats() const;

  const EngineConfig& config() const { return cfg_; }
  const KVCache& kv_cache() const { return *ranks_[0].cache; }  // rank 0's
  int tensor_parallel() const { return int(ranks_.size()); }

 private:
  struct Session {
    std::vector<int32_t> history;  // tokens of the finished request (prompt + generated)
    SeqId kv = -1;                 // holds KV of history[0, num_computed)
    int64_t num_computed = 0;
    int64_t last_used = 0;
    int64_t in_use_by = -1;        // request id currently continuing the session
  };
  void validate_request(int64_t request_id, const std::vector<int32_t>& prompt_ids, const RequestOptions& opts) const;
  bool evict_idle_session();  // frees the least recently used idle session's KV
  void finish(std::unique_ptr<Sequence> seq);
  int64_t blocks_for_tokens(int64_t tokens) const;
  // Fills batch_ (host tables in block_tables_host_ / slot_mapping_host_) for `chunks`.
  void fill_batch(const std::vector<ScheduledChunk>& chunks, bool all_rows);
  // sampled: GPU, the logit rows sampled on the device (row_sampling_, set by device_row_sampling); the
  // returned logits are then those of the rows it cannot sample, or undefined when there are none.
  Tensor forward_chunks(const std::vector<ScheduledChunk>& chunks, bool all_rows, bool sampled = false);
  // row_sampling_ for the chunks that sample, in order (greedy placeholders for rows the device's sampler
  // cannot answer); returns whether there are such rows.
  bool device_row_sampling(const std::vector<ScheduledChunk>& chunks);
  bool graph_decode_step(const std::vector<ScheduledChunk>& chunks) const;  // decode_step applies
  // A decode-only GPU step: graph replay, sampling on the device into device_tokens_/_logprobs_;
  // returns the step's host logits when some row is sampled on the host (undefined otherwise).
  Tensor graph_decode(const std::vector<ScheduledChunk>& chunks);
  // Overlapped decode steps (EngineConfig::overlap_steps): a graph step launched and not yet taken.
  struct InFlight {
    std::vector<ScheduledChunk> chunks;  // one decode row per chunk, in row order
  };
  // Whether `chunks` (a graph decode step) may be launched without waiting, and continued behind itself.
  bool can_overlap(const std::vector<ScheduledChunk>& chunks) const;
  // The scheduler's copy-on-write block copies (src, dst), on every rank's cache.
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& copies);
  // Launches a decode step on every rank without waiting; feed as Model::decode_launch.
  void launch_decode(const std::vector<ScheduledChunk>& chunks, const std::vector<int32_t>& feed);
  // The step after `step`, queued behind it (its rows: step's sequences that go on, their tokens fed on the
  // device); nullptr when it cannot be planned now (step() then takes `step` and schedules afresh).
  std::unique_ptr<InFlight> launch_continuation(const InFlight& step);
  // Waits for `step` and hands its tokens to its sequences (events, finishes).
  void take_step(const InFlight& step, std::vector<TokenEvent>& events);
  // Waits for the queued step when its results are not wanted (another step failed), ignoring its errors.
  void drain_queued_step();
  // After a failed overlapped step: every sequence of `steps` recomputes from scratch later (placeholders dropped).
  void abandon(const std::vector<const InFlight*>& steps);
  // Appends each sampled token (results[i] to seqs[i], filling a placeholder if one waits) and makes its event;
  // finished sequences end.
  void append_tokens(const std::vector<Sequence*>& seqs, std::vector<SampleResult>& results,
                     std::vector<TokenEvent>& events);
  void retire(std::unique_ptr<Sequence> seq);  // ends seq's life after the queued step that holds it
  // One step scheduled by the scheduler, run to completion (eager, or a graph step that is not overlapped).
  void run_step(const std::vector<ScheduledChunk>& chunks, std::vector<TokenEvent>& events);
  // Adds step()'s wall to the graph-step walls when it took a replayed (timed) graph step.
  void note_graph_wall(std::chrono::steady_clock::time_point started, int64_t timed_before);
  int64_t gpu_kv_budget(const Model& model, int64_t block_bytes) const;
  int64_t window_slots() const;                  // per-channel K on a GPU: f16 window slots per rank (else 0)
  int64_t window_bytes(int64_t slots) const;     // their bytes per rank
  // Whether a sequence holds a KV block (window slots of the others may be taken back).
  std::function<bool(int32_t)> block_live() const {
    return [this](int32_t b) { return alloc_->ref_count(b) > 0; };
  }
  // Runs fn(rank) on every rank at once (inline with one rank); see the constructor's note on failures.
  void run_ranks(const std::function<void(int)>& fn);

  // One tensor-parallel rank: its model, KV cache (its KV heads of the engine's blocks), workspace,
  // and the step's batch with device copies of the block tables and slots.
  struct Rank {
    const Model* model = nullptr;
    std::unique_ptr<KVCache> cache;
    ModelWorkspace ws;
    Tensor block_tables_dev, slot_mapping_dev;
    ForwardBatch batch;
    std::vector<int32_t> tokens;  // sampled on the device (rank 0 only)
    std::vector<float> logprobs;
  };

  const Model& model_;  // rank 0: the whole model's config, device kind, recipe
  EngineConfig cfg_;
  std::vector<Rank> ranks_;
  std::unique_ptr<RankThreads> rank_threads_;
  std::string tp_failure_;  // set when a tensor-parallel forward failed (the group is aborted)
  std::unique_ptr<BlockAllocator> alloc_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<Sampler> samplers_;            // one per thread: rows are sampled in parallel
  int sample_team_ = 1;                      // threads that sample rows on the host (<= samplers_.size())
  ForwardBatch batch_;                       // reused every step (host tables)
  Tensor block_tables_host_, slot_mapping_host_;  // s32, max sizes
  int64_t max_blocks_per_seq_ = 0;
  std::map<int64_t, Session> sessions_;
  std::vector<TokenEvent> pending_events_;   // abort events for the next step
  std::vector<RowSampling> row_sampling_;    // per logit row of a step sampled on the device
  std::unique_ptr<InFlight> in_flight_;      // overlap_steps: the step launched and not yet taken
  std::vector<std::unique_ptr<Sequence>> retired_;  // ended while in_flight_ holds their rows
  int64_t overlapped_steps_ = 0, dropped_rows_ = 0;
  int64_t clock_ = 0;
  int64_t prefill_tokens_ = 0, generated_tokens_ = 0;
  // Host walls of replayed graph steps (EngineStats::decode_step_wall_ms, decode_ranks_wall_ms).
  double graph_step_wall_ms_ = 0, graph_ranks_wall_ms_ = 0, last_ranks_wall_ms_ = 0;
};

}  // namespace lowbit
