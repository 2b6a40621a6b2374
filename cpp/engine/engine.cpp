// The engine loop: validation, sessions, one scheduler step -> forward -> sampling -> events.
#include "lowbit/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/prefix_cache_seed.h"
#include "engine/rank_threads.h"
#include "lowbit/core/allocator.h"
#include "model/device_support.h"

namespace lowbit {

namespace {
constexpr int64_t kDefaultKVBytes = int64_t(512) << 20;
// GPU memory kept out of the KV pool for what a step allocates besides the workspace (split-K and
// split-KV scratch, the decode graphs' pools).
constexpr int64_t kGpuStepReserve = int64_t(512) << 20;
constexpr int64_t kMaxLogitsChunk = 256;  // rows per forward in Engine::logits (bounds the logits buffer)
}  // namespace

Engine::Engine(const Model& model, const EngineConfig& config) : Engine(std::vector<const Model*>{&model}, config) {}

namespace {
const Model& first_rank(const std::vector<const Model*>& ranks) {
  LOWBIT_CHECK(!ranks.empty() && ranks[0] != nullptr, "Engine: no model given");
  return *ranks[0];
}
}  // namespace

Engine::Engine(const std::vector<const Model*>& ranks, const EngineConfig& config)
    : model_(first_rank(ranks)), cfg_(config) {
  const int world = int(ranks.size());
  for (int r = 0; r < world; ++r) {
    LOWBIT_CHECK(ranks[size_t(r)] != nullptr, "Engine: rank ", r, "'s model is null");
    const Model& m = *ranks[size_t(r)];
    LOWBIT_CHECK(m.finalized(), "Engine: the model", world > 1 ? " of rank " + std::to_string(r) : std::string(),
                 " is not finalized (call Model.finalize() first)");
    LOWBIT_CHECK(m.tp_world() == world && m.tp_rank() == r, "Engine: ", world, " model(s) given, but model ", r,
                 " is rank ", m.tp_rank(), " of a tensor-parallel group of ", m.tp_world(),
                 " (pass the group's models in rank order)");
    LOWBIT_CHECK(m.recipe().text == model_.recipe().text && m.device().kind == model_.device().kind, "Engine: rank ",
                 r, " runs ", m.recipe().text, " on ", m.device().str(), ", rank 0 ", model_.recipe().text, " on ",
                 model_.device().str());
  }
  LOWBIT_CHECK(cfg_.max_batch_tokens > 0, "Engine: argument 'max_batch_tokens' must be positive, got ",
               cfg_.max_batch_tokens);
  LOWBIT_CHECK(cfg_.max_seqs > 0, "Engine: argument 'max_seqs' must be positive, got ", cfg_.max_seqs);
  LOWBIT_CHECK(cfg_.block_size > 0, "Engine: argument 'block_size' must be positive, got ", cfg_.block_size);
  // Per-channel K quantizes whole blocks: its block is the recipe's K group (engine.h, docs/recipes.md).
  cfg_.block_size = model_.kv_block_size(cfg_.block_size);
  LOWBIT_CHECK(cfg_.kv_cache_bytes >= 0, "Engine: argument 'kv_cache_bytes' must be >= 0, got ", cfg_.kv_cache_bytes);
  LOWBIT_CHECK(cfg_.num_threads >= 0, "Engine: argument 'num_threads' must be >= 0, got ", cfg_.num_threads);
  LOWBIT_CHECK(cfg_.gpu_memory_fraction > 0.0 && cfg_.gpu_memory_fraction <= 1.0,
               "Engine: argument 'gpu_memory_fraction' must be in (0, 1], got ", cfg_.gpu_memory_fraction);
#ifdef _OPENMP
  if (cfg_.num_threads > 0) omp_set_num_threads(cfg_.num_threads);
  const int omp_threads = omp_get_max_threads();
#else
  const int omp_threads = 1;
#endif
  const ModelConfig& mc = model_.config();
  samplers_.assign(size_t(std::max(1, omp_threads)), Sampler(mc.vocab_size));
  // GPU rank threads spin (yielding) between steps: leave them their cores, or the team's barrier waits on threads
  // that share a core with a spinner.
  sample_team_ = std::max(1, omp_threads - (world > 1 && !model_.device().is_cpu() ? world : 0));
  max_blocks_per_seq_ = blocks_for_tokens(mc.max_position_embeddings);
  // Each rank thread works on its rank's GPU and, on the CPU, on its share of the OpenMP threads.
  rank_threads_ = std::make_unique<RankThreads>(
      world,
      [ranks, world, omp_threads](int r) {
        model_detail::bind_thread_to_device(ranks[size_t(r)]->device());
#ifdef _OPENMP
        omp_set_num_threads(std::max(1, omp_threads / world));
#endif
        (void)omp_threads;
      },
      /*spin=*/!model_.device().is_cpu());
  ranks_.resize(size_t(world));
  for (int r = 0; r < world; ++r) ranks_[size_t(r)].model = ranks[size_t(r)];
  // The workspaces first: on a GPU the KV pool is sized from what is free after them.
  const int64_t logit_rows = std::max<int64_t>(cfg_.max_seqs, std::min(cfg_.max_batch_tokens, kMaxLogitsChunk));
  run_ranks([&](int r) {
    ranks_[size_t(r)].ws = ranks_[size_t(r)].model->make_workspace(cfg_.max_batch_tokens, logit_rows);
  });
  const int64_t block_bytes = model_.kv_bytes_per_token() * cfg_.block_size;  // per rank (each holds its KV heads)
  const int64_t most_blocks = int64_t(cfg_.max_seqs) * max_blocks_per_seq_;  // max_seqs full-length sequences
  int64_t num_blocks;
  if (cfg_.kv_cache_bytes == 0) {
    int64_t budget = kDefaultKVBytes;
    if (!model_.device().is_cpu()) {  // the smallest of the ranks' budgets, each measured on its rank's thread
      std::vector<int64_t> budgets(ranks_.size());
      run_ranks([&](int r) { budgets[size_t(r)] = gpu_kv_budget(*ranks_[size_t(r)].model, block_bytes); });
      budget = *std::min_element(budgets.begin(), budgets.end());
    }
    budget -= window_bytes(window_slots());  // per-channel K on a GPU: the f16 window slots come first
    num_blocks = std::max<int64_t>(1, std::min(budget / block_bytes, most_blocks));
  } else {
    num_blocks = cfg_.kv_cache_bytes / block_bytes;
    LOWBIT_CHECK(num_blocks >= 1, "Engine: argument 'kv_cache_bytes' (", cfg_.kv_cache_bytes,
                 ") is smaller than one KV block (", block_bytes, " bytes)");
  }
  const int64_t max_rows = std::max<int64_t>(cfg_.max_seqs, 1);
  block_tables_host_ = Tensor::empty({max_rows * max_blocks_per_seq_}, ScalarType::s32);
  slot_mapping_host_ = Tensor::empty({cfg_.max_batch_tokens}, ScalarType::s32);
  run_ranks([&](int r) {
    Rank& rank = ranks_[size_t(r)];
    KVCacheConfig kc = rank.model->kv_cache_config(num_blocks, cfg_.block_size);
    if (kc.k_per_channel && !kc.device.is_cpu()) kc.k_window_slots = std::min<int64_t>(window_slots(), num_blocks);
    rank.cache = std::make_unique<KVCache>(kc);
    const Device& dev = rank.model->device();
    rank.block_tables_dev =
        dev.is_cpu() ? block_tables_host_ : Tensor::empty(block_tables_host_.shape(), ScalarType::s32, dev);
    rank.slot_mapping_dev =
        dev.is_cpu() ? slot_mapping_host_ : Tensor::empty(slot_mapping_host_.shape(), ScalarType::s32, dev);
  });
  alloc_ = std::make_unique<BlockAllocator>(num_blocks, cfg_.block_size, cfg_.prefix_caching,
                                            engine_detail::prefix_cache_seed(model_, ranks_[0].cache->config()));
  scheduler_ = std::make_unique<Scheduler>(*alloc_, cfg_.max_batch_tokens, cfg_.max_seqs,
                                           [this] { return evict_idle_session(); });
  batch_.token_ids.reserve(size_t(cfg_.max_batch_tokens));
  batch_.positions.reserve(size_t(cfg_.max_batch_tokens));
  batch_.logit_rows.reserve(size_t(ranks_[0].ws.max_logit_rows));
}

Engine::~Engine() = default;

void Engine::run_ranks(const std::function<void(int)>& fn) {
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, tp_failure_.empty(), "Engine: the tensor-parallel group was aborted after ",
                    "an error (", tp_failure_, "); create a new engine");
  if (ranks_.size() == 1) {
    fn(0);
    return;
  }
  rank_threads_->run(fn, [this](const std::string& why) {
    tp_failure_ = why;
    for (Rank& rank : ranks_)
      if (rank.model->communicator()) rank.model->communicator()->abort(why);
  });
}

int64_t Engine::blocks_for_tokens(int64_t tokens) const { return (tokens + cfg_.block_size - 1) / cfg_.block_size; }

// Per-channel K on a GPU: a step holds a window slot for each sequence's partly filled last block (max_seqs),
// each block its tokens write (at most max_batch_tokens / block_size + max_seqs) and, until the next step,
// each block it seals; a fork adds one. 2 max_seqs + the step's blocks + 2 covers them.
int64_t Engine::window_slots() const {
  const KVCacheConfig c = model_.kv_cache_config(1, cfg_.block_size);
  if (!c.k_per_channel || model_.device().is_cpu()) return 0;
  return 2 * int64_t(cfg_.max_seqs) + (cfg_.max_batch_tokens + cfg_.block_size - 1) / cfg_.block_size + 2;
}

int64_t Engine::window_bytes(int64_t slots) const {
  const KVCacheConfig c = model_.kv_cache_config(1, cfg_.block_size);
  return slots * c.num_layers * c.num_kv_heads * c.block_size * c.head_dim * 2;
}

int64_t Engine::gpu_kv_budget(const Model& model, int64_t block_bytes) const {
  model_detail::DeviceMemory mem = model_detail::device_memory(model.device());
  // Blocks lowbit's allocator caches (e.g. a previous engine's pool) are free for this pool too.
  const AllocatorStats cached = allocator_for(model.device()).stats();
  mem.free_bytes += cached.reserved_bytes - cached.allocated_bytes;
  const int64_t keep_free = int64_t((1.0 - cfg_.gpu_memory_fraction) * double(mem.total_bytes)) + kGpuStepReserve;
  const int64_t budget = mem.free_bytes - keep_free;
  constexpr double MiB = 1 << 20;
  LOWBIT_CHECK_KIND(ErrorKind::kOutOfMemory, budget >= block_bytes, "Engine: no GPU memory left for the KV cache on ",
                    model.device().str(), ": ", int64_t(mem.free_bytes / MiB), " MiB of ",
                    int64_t(mem.total_bytes / MiB), " MiB are free after the weights and workspace, and ",
                    int64_t(keep_free / MiB), " MiB must stay free (gpu_memory_fraction ", cfg_.gpu_memory_fraction,
                    " plus ", int64_t(kGpuStepReserve / MiB), " MiB of step scratch); one block needs ", block_bytes,
                    " bytes. Raise gpu_memory_fraction, free GPU memory or pass kv_cache_bytes.");
  return budget;
}

void Engine::validate_request(int64_t id, const std::vector<int32_t>& prompt, const RequestOptions& o) const {
  const ModelConfig& mc = model_.config();
  LOWBIT_CHECK(!scheduler_->find(id), "add_request: argument 'request_id' ", id, " is already in use");
  for (const TokenEvent& e : pending_events_)
    LOWBIT_CHECK(e.request_id != id, "add_request: argument 'request_id' ", id, " is already in use (abort pending)");
  LOWBIT_CHECK(!prompt.empty(), "add_request: argument 'prompt_ids' is empty");
  for (size_t i = 0; i < prompt.size(); ++i)
    LOWBIT_CHECK(prompt[i] >= 0 && prompt[i] < mc.vocab_size, "add_request: argument 'prompt_ids'[", i, "] = ",
                 prompt[i], " is outside the vocabulary [0, ", mc.vocab_size, ")");
  LOWBIT_CHECK(o.max_tokens > 0, "add_request: argument 'max_tokens' must be positive, got ", o.max_tokens);
  LOWBIT_CHECK(int64_t(prompt.size()) + o.max_tokens <= mc.max_position_embeddings, "add_request: prompt length (",
               prompt.size(), ") + argument 'max_tokens' (", o.max_tokens, ") exceeds max_position_embeddings (",
               mc.max_position_embeddings, ")");
  const int64_t need = blocks_for_tokens(int64_t(prompt.size()) + o.max_tokens);
  LOWBIT_CHECK(need <= alloc_->num_blocks(), "add_request: prompt length (", prompt.size(), ") + max_tokens (",
               o.max_tokens, ") needs ", need, " KV blocks but the whole cache has ", alloc_->num_blocks(),
               " (raise kv_cache_bytes)");
  // Every value the sampler refuses is refused here: an error inside step() would hit the request at
  // every step, and the engine would serve nobody.
  LOWBIT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.f,
               "add_request: argument 'temperature' must be finite and >= 0, got ", o.temperature);
  LOWBIT_CHECK(o.top_p > 0.f && o.top_p <= 1.f, "add_request: argument 'top_p' must be in (0, 1], got ", o.top_p);
  LOWBIT_CHECK(o.top_k >= 0, "add_request: argument 'top_k' must be >= 0, got ", o.top_k);
  LOWBIT_CHECK(o.min_p >= 0.f && o.min_p <= 1.f, "add_request: argument 'min_p' must be in [0, 1], got ", o.min_p);
  LOWBIT_CHECK(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0.f,
               "add_request: argument 'repetition_penalty' must be finite and > 0, got ", o.repetition_penalty);
  LOWBIT_CHECK(std::isfinite(o.presence_penalty), "add_request: argument 'presence_penalty' must be finite, got ",
               o.presence_penalty);
  LOWBIT_CHECK(std::isfinite(o.frequency_penalty), "add_request: argument 'frequency_penalty' must be finite, got ",
               o.frequency_penalty);
  LOWBIT_CHECK(o.min_tokens >= 0, "add_request: argument 'min_tokens' must be >= 0, got ", o.min_tokens);
  LOWBIT_CHECK(o.logprobs >= 0 && o.logprobs <= mc.vocab_size, "add_request: argument 'logprobs' must be in [0, ",
               mc.vocab_size, "], got ", o.logprobs);
  for (int32_t t : o.stop_token_ids)
    LOWBIT_CHECK(t >= 0 && t < mc.vocab_size, "add_request: argument 'stop_token_ids' holds ", t,
                 ", outside the vocabulary [0, ", mc.vocab_size, ")");
  if (o.session_id >= 0) {
    auto s = sessions_.find(o.session_id);
    LOWBIT_CHECK(s == sessions_.end() || s->second.in_use_by < 0, "add_request: argument 'session_id' ", o.session_id,
                 " is in use by request ", s == sessions_.end() ? -1 : s->second.in_use_by);
  }
}

void Engine::add_request(int64_t id, const std::vector<int32_t>& prompt, const RequestOptions& opts) {
  validate_request(id, prompt, opts);
  auto seq = std::make_unique<Sequence>();
  seq->request_id = id;
  seq->tokens = prompt;
  seq->prompt_len = int64_t(prompt.size());
  seq->opts = opts;
  if (opts.session_id >= 0) {
    Session& s = sessions_[opts.session_id];
    const bool continues = s.kv >= 0 && prompt.size() >= s.history.size() && s.num_computed < int64_t(prompt.size()) &&
                           std::equal(s.history.begin(), s.history.end(), prompt.begin());
    if (continues) {
      seq->kv = s.kv;
      seq->num_computed = s.num_computed;
    } else if (s.kv >= 0) {
      alloc_->free_sequence(s.kv);  // the conversation diverged: start over
    }
    s.kv = -1;
    s.num_computed = 0;
    s.history.clear();
    s.in_use_by = id;
  }
  scheduler_->add(std::move(seq));
}

bool Engine::evict_idle_session() {
  auto victim = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
    if (it->second.in_use_by < 0 && it->second.kv >= 0 &&
        (victim == sessions_.end() || it->second.last_used < victim->second.last_used))
      victim = it;
  if (victim == sessions_.end()) return false;
  alloc_->free_sequence(victim->second.kv);
  sessions_.erase(victim);
  return true;
}

void Engine::finish(std::unique_ptr<Sequence> seq) {
  auto s = seq->opts.session_id >= 0 ? sessions_.find(seq->opts.session_id) : sessions_.end();
  if (s != sessions_.end() && s->second.in_use_by == seq->request_id && seq->kv >= 0) {
    s->second.history = seq->tokens;
    s->second.kv = seq->kv;
    s->second.num_computed = seq->num_computed;
    s->second.in_use_by = -1;
    s->second.last_used = ++clock_;
    retire(std::move(seq));
    return;
  }
  if (s != sessions_.end() && s->second.in_use_by == seq->request_id) sessions_.erase(s);
  if (seq->kv >= 0) alloc_->free_sequence(seq->kv);
  retire(std::move(seq));
}

void Engine::retire(std::unique_ptr<Sequence> seq) {
  if (!in_flight_) return;  // no queued step holds it
  seq->retired = true;
  retired_.push_back(std::move(seq));
}

void Engine::abort(int64_t request_id) {
  std::unique_ptr<Sequence> seq = scheduler_->remove(request_id);
  if (!seq) return;
  auto s = seq->opts.session_id >= 0 ? sessions_.find(seq->opts.session_id) : sessions_.end();
  if (s != sessions_.end() && s->second.in_use_by == request_id) sessions_.erase(s);
  if (seq->kv >= 0) alloc_->free_sequence(seq->kv);  // a queued step's writes into it come before any reuse (stream order)
  retire(std::move(seq));
  TokenEvent e;
  e.request_id = request_id;
  e.finished = true;
  e.finish_reason = "abort";
  pending_events_.push_back(std::move(e));
}

void Engine::end_session(int64_t session_id) {
  auto s = sessions_.find(session_id);
  if (s == sessions_.end()) return;
  if (s->second.kv >= 0) alloc_->free_sequence(s->second.kv);
  sessions_.erase(s);  // a request still continuing it frees its KV when it ends
}

bool Engine::has_unfinished() const { return !scheduler_->empty() || !pending_events_.empty() || in_flight_; }

// Fills batch_ for `chunks` (KV already reserved). all_rows: logits of every token (Engine::logits),
// otherwise of the last token of each chunk that samples.
void Engine::fill_batch(const std::vector<ScheduledChunk>& chunks, bool all_rows) {
  ForwardBatch& b = batch_;
  ops::AttentionMeta& m = b.attn;
  b.token_ids.clear();
  b.positions.clear();
  b.logit_rows.clear();
  m.q_start.clear();
  m.q_len.clear();
  m.kv_len.clear();
  m.max_q_len = m.max_kv_len = 0;
  int64_t width = 1;
  for (const ScheduledChunk& c : chunks)
    width = std::max<int64_t>(width, int64_t(alloc_->block_table(c.seq->kv).size()));
  const int64_t n = int64_t(chunks.size());
  int32_t* tables = block_tables_host_.data<int32_t>();
  int32_t* slots = slot_mapping_host_.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const ScheduledChunk& c = chunks[size_t(i)];
    const int32_t row0 = int32_t(b.token_ids.size());
    m.q_start.push_back(row0);
    m.q_len.push_back(int32_t(c.len));
    m.kv_len.push_back(int32_t(c.start + c.len));
    m.max_q_len = std::max(m.max_q_len, int32_t(c.len));
    m.max_kv_len = std::max(m.max_kv_len, int32_t(c.start + c.len));
    for (int64_t j = c.start; j < c.start + c.len; ++j) {
      slots[b.token_ids.size()] = int32_t(alloc_->slot_of(c.seq->kv, j));
      b.token_ids.push_back(c.seq->tokens[size_t(j)]);
      b.positions.push_back(int32_t(j));
    }
    if (all_rows)
      for (int64_t j = 0; j < c.len; ++j) b.logit_rows.push_back(row0 + int32_t(j));
    else if (c.sample)
      b.logit_rows.push_back(row0 + int32_t(c.len) - 1);
    const std::vector<int32_t>& table = alloc_->block_table(c.seq->kv);
    int32_t* row = tables + i * width;
    std::fill(row, row + width, -1);
    std::copy(table.begin(), table.end(), row);
  }
  const int64_t T = int64_t(b.token_ids.size());
  m.block_tables = block_tables_host_.slice(0, 0, n * width).view({n, width});
  m.slot_mapping = slot_mapping_host_.slice(0, 0, T);
}

// Runs the model on `chunks` (fill_batch, then each rank's copy with the tables on its device);
// returns rank 0's logits.
Tensor Engine::forward_chunks(const std::vector<ScheduledChunk>& chunks, bool all_rows, bool sampled) {
  fill_batch(chunks, all_rows);
  const bool host_rows = sampled && device_row_sampling(chunks);
  Tensor logits;
  run_ranks([&](int r) {
    Rank& rank = ranks_[size_t(r)];
    rank.batch = batch_;
    ops::AttentionMeta& m = rank.batch.attn;
    ops::prepare_k_window(*rank.cache, m.slot_mapping, block_live());
    if (!rank.model->device().is_cpu()) {
      const Tensor host_tables = m.block_tables, host_slots = m.slot_mapping;
      m.block_tables = rank.block_tables_dev.slice(0, 0, host_tables.numel()).view(host_tables.shape());
      m.slot_mapping = rank.slot_mapping_dev.slice(0, 0, host_slots.numel());
      model_detail::upload_async(m.block_tables, host_tables);
      model_detail::upload_async(m.slot_mapping, host_slots);
    }
    Tensor out = sampled ? rank.model->forward_sampled(rank.batch, row_sampling_, host_rows, *rank.cache, rank.ws,
                                                       rank.tokens, rank.logprobs)
                         : rank.model->forward(rank.batch, *rank.cache, rank.ws);
    if (r == 0) logits = out;
  });
  return logits;
}

// Decode-only steps on a GPU (one new token per sequence, every one sampling) replay CUDA graphs;
// with tensor parallelism only when the collectives can be captured (NCCL).
bool Engine::graph_decode_step(const std::vector<ScheduledChunk>& chunks) const {
  if (!cfg_.cuda_graphs || model_.device().is_cpu() || int64_t(chunks.size()) > model_.max_decode_rows(ranks_[0].ws))
    return false;
  for (const Rank& rank : ranks_)
    if (rank.model->communicator() && !rank.model->communicator()->capturable()) return false;
  for (const ScheduledChunk& c : chunks)
    if (c.len != 1 || !c.sample) return false;
  return true;
}

namespace {
// A row the device's sampler can answer: nothing edits its logits (penalties, stop ids held back
// below min_tokens) and no top logprobs are asked for; the others are sampled on the host.
bool device_sampled(const Sequence& seq, int64_t generated) {
  const RequestOptions& o = seq.opts;
  const bool suppress_stops = generated < o.min_tokens && !o.stop_token_ids.empty();
  return o.repetition_penalty == 1.f && o.presence_penalty == 0.f && o.frequency_penalty == 0.f && o.logprobs == 0 &&
         !suppress_stops;
}
bool device_sampled(const Sequence& seq) { return device_sampled(seq, seq.num_generated()); }
}  // namespace

bool Engine::device_row_sampling(const std::vector<ScheduledChunk>& chunks) {
  row_sampling_.clear();
  bool host_rows = false;
  for (const ScheduledChunk& c : chunks) {
    if (!c.sample) continue;
    const Sequence& seq = *c.seq;
    if (!device_sampled(seq)) {
      host_rows = true;
      row_sampling_.push_back(RowSampling{});  // a greedy placeholder; the host samples this row
      continue;
    }
    const RequestOptions& o = seq.opts;
    row_sampling_.push_back(RowSampling{o.temperature, o.top_k, o.top_p, o.min_p,
                                        counter_uniform(o.seed, uint64_t(seq.num_generated()))});
  }
  return host_rows;
}

Tensor Engine::graph_decode(const std::vector<ScheduledChunk>& chunks) {
  fill_batch(chunks, false);
  const bool host_rows = device_row_sampling(chunks);  // every chunk of a graph step samples
  const auto handed = std::chrono::steady_clock::now();
  run_ranks([&](int r) {
    Rank& rank = ranks_[size_t(r)];
    ops::prepare_k_window(*rank.cache, batch_.attn.slot_mapping, block_live());
    rank.model->decode_step(batch_, row_sampling_, *rank.cache, rank.ws, rank.tokens, rank.logprobs);
  });
  last_ranks_wall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - handed).count();
  if (!host_rows) return Tensor();
  Tensor logits;  // on rank 0's thread: its GPU is current there
  run_ranks([&](int r) {
    if (r == 0) logits = model_.decode_logits(ranks_[0].ws, int64_t(chunks.size()));
  });
  return logits;
}

bool Engine::can_overlap(const std::vector<ScheduledChunk>& chunks) const {
  if (!cfg_.overlap_steps || ranks_[0].cache->config().k_per_channel) return false;  // kc: host window bookkeeping
  for (const ScheduledChunk& c : chunks)
    if (!device_sampled(*c.seq)) return false;
  return true;
}

void Engine::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& copies) {
  if (copies.empty()) return;
  run_ranks([&](int r) {
    for (const auto& c : copies) ranks_[size_t(r)].cache->copy_block(c.first, c.second);
  });
}

void Engine::launch_decode(const std::vector<ScheduledChunk>& chunks, const std::vector<int32_t>& feed) {
  fill_batch(chunks, false);
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !device_row_sampling(chunks),
                    "Engine: a queued decode step has a row the device cannot sample");
  // Rank 0's latest launch, read before any rank launches this step (rank 0 moves on to this step's slot).
  const DecodeFeedSource source = feed.empty() ? DecodeFeedSource{} : model_.decode_feed_source(ranks_[0].ws);
  const auto handed = std::chrono::steady_clock::now();
  run_ranks([&](int r) {
    Rank& rank = ranks_[size_t(r)];
    rank.model->decode_launch(batch_, row_sampling_, feed, source, *rank.cache, rank.ws);
  });
  last_ranks_wall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - handed).count();
}

std::unique_ptr<Engine::InFlight> Engine::launch_continuation(const InFlight& step) {
  // A request that could join must be admitted by the scheduler first (a prefill chunk is not a graph step).
  if (scheduler_->num_waiting() > 0 && scheduler_->num_running() < cfg_.max_seqs) return nullptr;
  const int64_t max_pos = model_.config().max_position_embeddings;
  auto next = std::make_unique<InFlight>();
  std::vector<int32_t> feed;
  int64_t live = 0, blocks = 0;
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    Sequence* s = step.chunks[i].seq;
    if (s->retired) continue;
    ++live;
    // Once `step` is taken, s holds one more token: it may end there by length, or need the host's sampler next.
    const int64_t generated = s->num_generated() + 1, length = int64_t(s->tokens.size()) + 1;
    if (generated >= s->opts.max_tokens || length >= max_pos) continue;
    if (!device_sampled(*s, generated)) return nullptr;
    blocks += alloc_->blocks_needed(s->kv, 1);
    next->chunks.push_back({s, s->num_computed + 1, 1, true});
    feed.push_back(int32_t(i));
  }
  // Every running sequence must be a row here (none may starve), and the KV of one more token must fit.
  if (next->chunks.empty() || live != scheduler_->num_running() || blocks > alloc_->num_free_blocks()) return nullptr;
  std::vector<std::pair<int32_t, int32_t>> copies;
  for (const ScheduledChunk& c : next->chunks)
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, alloc_->append_tokens(c.seq->kv, 1, &copies),
                      "Engine: KV reservation failed after the free-block check");
  copy_blocks(copies);  // copy-on-write of a shared last block: after `step` and before the next on the GPU
  for (const ScheduledChunk& c : next->chunks) {
    c.seq->pending_token = int64_t(c.seq->tokens.size());
    c.seq->tokens.push_back(-1);  // `step` samples it; the device feeds it to the next step
  }
  launch_decode(next->chunks, feed);
  ++overlapped_steps_;
  return next;
}

void Engine::take_step(const InFlight& step, std::vector<TokenEvent>& events) {
  const auto handed = std::chrono::steady_clock::now();
  run_ranks([&](int r) {
    Rank& rank = ranks_[size_t(r)];
    rank.model->decode_wait(rank.ws, rank.tokens, rank.logprobs);
  });
  last_ranks_wall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - handed).count();
  std::vector<Sequence*> seqs;
  std::vector<SampleResult> results;
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    Sequence* s = step.chunks[i].seq;
    if (s->retired) {  // it stopped (or was aborted) after this step was queued: its row is dropped
      ++dropped_rows_;
      continue;
    }
    s->num_computed += step.chunks[i].len;
    alloc_->cache_computed_blocks(s->kv, s->tokens, s->num_computed);
    seqs.push_back(s);
    SampleResult r;
    r.token = ranks_[0].tokens[i];
    r.logprob = ranks_[0].logprobs[i];
    results.push_back(std::move(r));
  }
  append_tokens(seqs, results, events);
}

void Engine::drain_queued_step() {
  try {  // the step's slot is free again whatever the wait says; the error being raised is the earlier one
    run_ranks([&](int r) {
      Rank& rank = ranks_[size_t(r)];
      rank.model->decode_wait(rank.ws, rank.tokens, rank.logprobs);
    });
  } catch (...) {
  }
}

void Engine::abandon(const std::vector<const InFlight*>& steps) {
  std::vector<Sequence*> seqs;
  for (const InFlight* f : steps)
    if (f)
      for (const ScheduledChunk& c : f->chunks)
        if (!c.seq->retired && std::find(seqs.begin(), seqs.end(), c.seq) == seqs.end()) seqs.push_back(c.seq);
  for (auto it = seqs.rbegin(); it != seqs.rend(); ++it) {
    Sequence* s = *it;
    if (s->pending_token >= 0) s->tokens.resize(size_t(s->pending_token));  // the placeholder is the last token
    s->pending_token = -1;
    if (scheduler_->find(s->request_id) == s) scheduler_->requeue(s);
  }
}

void Engine::append_tokens(const std::vector<Sequence*>& seqs, std::vector<SampleResult>& results,
                           std::vector<TokenEvent>& events) {
  const int64_t max_pos = model_.config().max_position_embeddings;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence* seq = seqs[i];
    SampleResult& r = results[i];
    if (seq->pending_token >= 0) {  // a queued step already holds a placeholder for this token
      seq->tokens[size_t(seq->pending_token)] = r.token;
      seq->pending_token = -1;
    } else {
      seq->tokens.push_back(r.token);
    }
    ++generated_tokens_;
    TokenEvent e;
    e.request_id = seq->request_id;
    e.token = r.token;
    e.logprob = r.logprob;
    e.top_logprobs = std::move(r.top_logprobs);
    const std::vector<int32_t>& stops = seq->opts.stop_token_ids;
    if (std::find(stops.begin(), stops.end(), r.token) != stops.end())
      e.finish_reason = "stop";
    else if (seq->num_generated() >= seq->opts.max_tokens || int64_t(seq->tokens.size()) >= max_pos)
      e.finish_reason = "length";
    e.finished = !e.finish_reason.empty();
    if (e.finished) finish(scheduler_->remove(seq->request_id));
    events.push_back(std::move(e));
  }
}

std::vector<TokenEvent> Engine::step() {
  const auto started = std::chrono::steady_clock::now();
  const int64_t timed_before = model_.decode_graph_timing(ranks_[0].ws).steps;
  std::vector<TokenEvent> events = std::move(pending_events_);
  pending_events_.clear();
  last_ranks_wall_ms_ = 0;
  if (!in_flight_) {
    std::vector<std::pair<int32_t, int32_t>> copies;
    std::vector<ScheduledChunk> chunks = scheduler_->schedule(&copies);
    copy_blocks(copies);
    if (chunks.empty()) return events;
    if (!graph_decode_step(chunks) || !can_overlap(chunks)) {
      run_step(chunks, events);
      note_graph_wall(started, timed_before);
      return events;
    }
    try {
      launch_decode(chunks, {});
    } catch (...) {
      for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) scheduler_->requeue(it->seq);
      pending_events_ = std::move(events);
      throw;
    }
    in_flight_ = std::make_unique<InFlight>(InFlight{std::move(chunks)});
  }
  // Queue the next step behind the one in flight, then take that one: the GPU runs the next step while the host
  // hands out this one's tokens and returns to the caller.
  std::unique_ptr<InFlight> current = std::move(in_flight_);
  std::vector<std::unique_ptr<Sequence>> ended = std::move(retired_);  // rows of `current` at most: freed below
  retired_.clear();
  try {
    in_flight_ = launch_continuation(*current);
    take_step(*current, events);
  } catch (...) {
    // Nothing of the failed steps counts (as in run_step): their sequences recompute from scratch later.
    std::unique_ptr<InFlight> queued = std::move(in_flight_);
    if (queued) drain_queued_step();
    abandon({current.get(), queued.get()});
    retired_.clear();
    pending_events_ = std::move(events);
    throw;
  }
  note_graph_wall(started, timed_before);
  return events;
}

void Engine::note_graph_wall(std::chrono::steady_clock::time_point started, int64_t timed_before) {
  if (model_.decode_graph_timing(ranks_[0].ws).steps <= timed_before) return;  // no replayed (timed) step taken
  graph_step_wall_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  graph_ranks_wall_ms_ += last_ranks_wall_ms_;
}

void Engine::run_step(const std::vector<ScheduledChunk>& chunks, std::vector<TokenEvent>& events) {
  Tensor logits;
  const bool graph_step = graph_decode_step(chunks);
  // Eager GPU steps sample on the device too: a mixed step would otherwise download [rows, vocab] f32 logits.
  const bool device_step = graph_step || !model_.device().is_cpu();
  try {
    logits = graph_step ? graph_decode(chunks) : forward_chunks(chunks, false, device_step);
  } catch (...) {
    // Nothing of this step counts: every scheduled sequence recomputes from scratch later, so a
    // failing step (e.g. a kernel missing for the recipe) never leaves a half-written cache behind.
    for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) scheduler_->requeue(it->seq);
    pending_events_ = std::move(events);
    events.clear();
    throw;
  }
  const int64_t vocab = model_.config().vocab_size;
  std::vector<Sequence*> to_sample;
  for (const ScheduledChunk& c : chunks) {
    Sequence* seq = c.seq;
    seq->num_computed += c.len;
    alloc_->cache_computed_blocks(seq->kv, seq->tokens, seq->num_computed);  // blocks this step filled
    prefill_tokens_ += std::max<int64_t>(0, std::min(c.start + c.len, seq->prompt_len) - c.start);
    if (c.sample) to_sample.push_back(seq);  // logits row i belongs to to_sample[i]
  }
  // Rows are independent (each request has its own RNG stream), so they are sampled in parallel;
  // top-p over a large vocabulary sorts, which would otherwise serialise big decode batches. When the device
  // sampled every row, a row only takes its token: no parallel region (waking the team for those copies cost
  // 3.5 ms per step at 1536 rows beside two spinning rank threads, 2x H200).
  const int64_t n = int64_t(to_sample.size());
  const bool host_sampling = !device_step || logits.defined();
  std::vector<SampleResult> results(static_cast<size_t>(n));
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic) num_threads(sample_team_) if (n > 1 && host_sampling)
  for (int64_t i = 0; i < n; ++i) {
    try {
#ifdef _OPENMP
      Sampler& sampler = samplers_[size_t(omp_get_thread_num())];
#else
      Sampler& sampler = samplers_[0];
#endif
      const Sequence* seq = to_sample[size_t(i)];
      if (device_step && device_sampled(*seq)) {
        results[size_t(i)].token = ranks_[0].tokens[size_t(i)];
        results[size_t(i)].logprob = ranks_[0].logprobs[size_t(i)];
      } else {
        results[size_t(i)] = sampler.sample(logits.data<float>() + i * vocab, seq->tokens, seq->num_generated(),
                                            seq->opts);
      }
    } catch (...) {
#pragma omp critical(lowbit_engine_sample_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  append_tokens(to_sample, results, events);
}

Tensor Engine::logits(const std::vector<int32_t>& prompt) {
  const ModelConfig& mc = model_.config();
  LOWBIT_CHECK(!prompt.empty(), "logits: argument 'prompt_ids' is empty");
  LOWBIT_CHECK(int64_t(prompt.size()) <= mc.max_position_embeddings, "logits: argument 'prompt_ids' has ",
               prompt.size(), " tokens, more than max_position_embeddings (", mc.max_position_embeddings, ")");
  for (size_t i = 0; i < prompt.size(); ++i)
    LOWBIT_CHECK(prompt[i] >= 0 && prompt[i] < mc.vocab_size, "logits: argument 'prompt_ids'[", i, "] = ", prompt[i],
                 " is outside the vocabulary [0, ", mc.vocab_size, ")");
  const int64_t T = int64_t(prompt.size());
  const int64_t need = blocks_for_tokens(T);
  while (need > alloc_->num_free_blocks() && evict_idle_session()) {
  }
  LOWBIT_CHECK_KIND(ErrorKind::kOutOfMemory, need <= alloc_->num_free_blocks(), "logits: ", T, " tokens need ", need,
                    " KV blocks but only ", alloc_->num_free_blocks(), " of ", alloc_->num_blocks(),
                    " are free (running requests hold the rest; raise kv_cache_bytes)");
  Sequence scratch;
  scratch.tokens = prompt;
  scratch.prompt_len = T;
  scratch.kv = alloc_->create_sequence();
  Tensor out = Tensor::empty({T, mc.vocab_size}, ScalarType::f32);
  const int64_t chunk = std::min(cfg_.max_batch_tokens, ranks_[0].ws.max_logit_rows);
  try {
    for (int64_t start = 0; start < T; start += chunk) {
      const int64_t len = std::min(chunk, T - start);
      std::vector<std::pair<int32_t, int32_t>> copies;
      LOWBIT_CHECK_KIND(ErrorKind::kRuntime, alloc_->append_tokens(scratch.kv, len, &copies),
                        "logits: KV reservation failed after the free-block check");
      const Tensor rows = forward_chunks({ScheduledChunk{&scratch, start, len, true}}, true);
      std::memcpy(out.data<float>() + start * mc.vocab_size, rows.data<float>(), size_t(rows.nbytes()));
      scratch.num_computed += len;
    }
  } catch (...) {
    alloc_->free_sequence(scratch.kv);
    throw;
  }
  alloc_->free_sequence(scratch.kv);
  return out;
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.num_free_blocks = alloc_->num_free_blocks();
  s.num_blocks = alloc_->num_blocks();
  s.block_size = cfg_.block_size;
  s.running = scheduler_->num_running();
  s.waiting = scheduler_->num_waiting();
  s.preemptions = scheduler_->num_preemptions();
  for (const auto& kv : sessions_) s.sessions += kv.second.kv >= 0;
  s.prefill_tokens = prefill_tokens_;
  s.generated_tokens = generated_tokens_;
  const PrefixCacheStats pc = alloc_->prefix_cache_stats();
  s.prefix_caching = alloc_->prefix_caching();
  s.prefix_cache_query_tokens = pc.query_tokens;
  s.prefix_cache_hit_tokens = pc.hit_tokens;
  s.prefix_cache_blocks = pc.cached_blocks;
  s.prefix_cache_evictions = pc.evictions;
  const DecodeGraphTiming t = model_.decode_graph_timing(ranks_[0].ws);
  s.decode_graph_steps = t.steps;
  s.decode_graph_ms = t.graph_ms;
  s.decode_upload_ms = t.upload_ms;
  s.decode_step_wall_ms = graph_step_wall_ms_;
  s.decode_ranks_wall_ms = graph_ranks_wall_ms_;
  s.decode_rank0_wall_ms = t.host_ms;
  s.overlapped_steps = overlapped_steps_;
  s.dropped_rows = dropped_rows_;
  return s;
}

}  // namespace lowbit
