// Model::decode_step and its CUDA graphs (model/decode_graphs.h).
#include "model/decode_graphs.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "lowbit/model/model.h"
#include "model/device_support.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/stream.h"
#endif

namespace lowbit {

int64_t decode_batch_bucket(int64_t n, int64_t max_rows) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return std::min(b, max_rows);
}

int64_t decode_kv_bucket(int64_t max_kv, int64_t longest) {
  int64_t b = 256;
  while (b < max_kv) b *= 2;
  return std::min(b, longest);
}

#ifdef LOWBIT_WITH_CUDA

PinnedBuffer::PinnedBuffer(int64_t bytes, const char* op) {
  LOWBIT_CUDA_CHECK(op, cudaHostAlloc(&ptr_, size_t(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault));
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

DecodeGraphs::DecodeGraphs(const KVCache& c, int64_t rows, int64_t longest_tokens, const Device& device)
    : cache(&c), max_rows(rows), longest(longest_tokens), block_size(c.config().block_size) {
  constexpr const char* op = "Model.decode_step";
  const int64_t width = (longest + block_size - 1) / block_size;
  meta_device = Tensor::empty({meta_elems(max_rows, width)}, ScalarType::s32, device);
  feed_tokens = Tensor::empty({max_rows}, ScalarType::s32, device);
  sampler = DeviceSampler(max_rows, device);
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(device.index));
  // A blocking stream: it stays ordered with eager steps on the legacy default stream.
  LOWBIT_CUDA_CHECK(op, cudaStreamCreate(&stream));
  for (Slot& s : slots) {
    s.meta = PinnedBuffer(meta_elems(max_rows, width) * 4, op);
    s.params = PinnedBuffer(max_rows * 5 * 8, op);
    s.tokens = PinnedBuffer(max_rows * 4, op);
    s.logprobs = PinnedBuffer(max_rows * 4, op);
    for (cudaEvent_t& e : s.marks) LOWBIT_CUDA_CHECK(op, cudaEventCreate(&e));
  }
}

DecodeGraphs::~DecodeGraphs() {
  if (stream) cudaStreamSynchronize(stream);
  graphs.clear();  // graphs (then their pools) before the stream
  for (Slot& s : slots)
    for (cudaEvent_t e : s.marks)
      if (e) cudaEventDestroy(e);
  if (stream) cudaStreamDestroy(stream);
}

void DecodeGraphs::mark(Slot& s, int i, const char* op) const {
  LOWBIT_CUDA_CHECK(op, cudaEventRecord(s.marks[i], stream));
}

void DecodeGraphs::add_timing(const Slot& s, const char* op, double host_ms) {
  float upload = 0.f, graph = 0.f;
  LOWBIT_CUDA_CHECK(op, cudaEventElapsedTime(&upload, s.marks[0], s.marks[1]));
  LOWBIT_CUDA_CHECK(op, cudaEventElapsedTime(&graph, s.marks[1], s.marks[2]));
  ++timing.steps;
  timing.upload_ms += upload;
  timing.graph_ms += graph;
  timing.host_ms += host_ms;
}

#else

DecodeGraphs::DecodeGraphs(const KVCache& c, int64_t rows, int64_t longest_tokens, const Device&)
    : cache(&c), max_rows(rows), longest(longest_tokens), block_size(c.config().block_size) {}
DecodeGraphs::~DecodeGraphs() = default;

#endif

int64_t Model::max_decode_rows(const ModelWorkspace& ws) const {
  return device_.is_cpu() ? 0 : std::min(ws.max_tokens, ws.max_logit_rows);
}

namespace {

// The host checks of a decode batch: one token per sequence in order, host tables and slots
// that point into the cache (they are read by the GPU without further checks).
void check_decode_batch(const ForwardBatch& b, const std::vector<int32_t>& feed, const ModelConfig& cfg,
                        const KVCacheConfig& kv, int64_t max_rows, int64_t longest) {
  const int64_t n = int64_t(b.token_ids.size());
  const ops::AttentionMeta& m = b.attn;
  LOWBIT_CHECK(n >= 1 && n <= max_rows, "Model.decode_step: ", n, " sequences, a decode graph holds 1..", max_rows);
  LOWBIT_CHECK(int64_t(b.positions.size()) == n && int64_t(m.q_start.size()) == n && int64_t(m.q_len.size()) == n &&
                   int64_t(m.kv_len.size()) == n && int64_t(b.logit_rows.size()) == n,
               "Model.decode_step: token_ids, positions, q_start, q_len, kv_len and logit_rows need one entry per "
               "sequence (", n, ")");
  const Tensor& bt = m.block_tables;
  LOWBIT_CHECK(bt.defined() && bt.device().is_cpu() && bt.dtype() == ScalarType::s32 && bt.dim() == 2 &&
                   bt.size(0) == n && bt.is_contiguous(),
               "Model.decode_step: attn.block_tables must be a contiguous host s32 [", n, ", width] tensor, got ",
               bt.defined() ? bt.str() : std::string("undefined"));
  const Tensor& sm = m.slot_mapping;
  LOWBIT_CHECK(sm.defined() && sm.device().is_cpu() && sm.dtype() == ScalarType::s32 && sm.numel() == n &&
                   sm.is_contiguous(),
               "Model.decode_step: attn.slot_mapping must be a contiguous host s32 [", n, "] tensor, got ",
               sm.defined() ? sm.str() : std::string("undefined"));
  LOWBIT_CHECK(feed.empty() || int64_t(feed.size()) == n, "Model.decode_step: feed has ", feed.size(),
               " entries for ", n, " sequences (give none, or one per sequence)");
  const int32_t* slots = sm.data<int32_t>();
  const int64_t num_slots = kv.num_blocks * kv.block_size;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = b.token_ids[size_t(i)], kl = m.kv_len[size_t(i)];
    const int32_t fed = feed.empty() ? -1 : feed[size_t(i)];
    LOWBIT_CHECK(fed >= -1 && fed < max_rows, "Model.decode_step: feed[", i, "] = ", fed,
                 " is neither -1 nor a row of the previous step [0, ", max_rows, ")");
    LOWBIT_CHECK(fed >= 0 || (id >= 0 && id < cfg.vocab_size), "Model.decode_step: token id ", id,
                 " is outside [0, ", cfg.vocab_size, ")");
    LOWBIT_CHECK(m.q_start[size_t(i)] == i && m.q_len[size_t(i)] == 1 && b.logit_rows[size_t(i)] == i,
                 "Model.decode_step: sequence ", i, " must be row ", i, " with one query token and a logit row");
    LOWBIT_CHECK(kl >= 1 && kl <= longest, "Model.decode_step: sequence ", i, " has kv_len ", kl, ", outside [1, ",
                 longest, "]");
    const int64_t blocks = (kl + kv.block_size - 1) / kv.block_size;
    LOWBIT_CHECK(blocks <= bt.size(1), "Model.decode_step: sequence ", i, " needs ", blocks,
                 " blocks but attn.block_tables has ", bt.size(1), " columns");
    const int32_t* row = bt.data<int32_t>() + i * bt.size(1);
    for (int64_t j = 0; j < blocks; ++j)
      LOWBIT_CHECK_KIND(ErrorKind::kIndex, row[j] >= 0 && row[j] < kv.num_blocks, "Model.decode_step: ",
                        "attn.block_tables[", i, ", ", j, "] = ", row[j], " is not a block of the cache [0, ",
                        kv.num_blocks, ")");
    LOWBIT_CHECK_KIND(ErrorKind::kIndex, slots[i] >= 0 && slots[i] < num_slots, "Model.decode_step: ",
                      "attn.slot_mapping[", i, "] = ", slots[i], " is not a slot of the cache [0, ", num_slots, ")");
  }
}

}  // namespace

#ifdef LOWBIT_WITH_CUDA

void Model::decode_body(int64_t rows, int64_t kv_bucket, KVCache& cache, ModelWorkspace& ws) const {
  DecodeGraphs& g = *ws.decode_graphs;
  const int64_t width = (kv_bucket + g.block_size - 1) / g.block_size;
  const Tensor& m = g.meta_device;
  const Tensor ids = m.slice(0, 0, rows), positions = m.slice(0, rows, 2 * rows);
  ops::AttentionMeta attn;
  for (int32_t i = 0; i < int32_t(rows); ++i) {
    attn.q_start.push_back(i);
    attn.q_len.push_back(1);
    attn.kv_len.push_back(int32_t(kv_bucket));  // host bound; the device row holds the true lengths
  }
  attn.max_q_len = 1;
  attn.max_kv_len = int32_t(kv_bucket);
  attn.seq_info = m.slice(0, 2 * rows, 5 * rows).view({3, rows});
  attn.slot_mapping = m.slice(0, 5 * rows, 6 * rows);
  attn.block_tables = m.slice(0, 7 * rows, 7 * rows + rows * width).view({rows, width});  // after the feed row
  forward_layers(ids, positions, attn, rows, cache, ws);
  Tensor logits = ws.logits_compute.slice(0, 0, rows);
  lm_head_logits(ws.normed.slice(0, 0, rows), logits, ws);
  if (shard_.rank != 0) return;  // rank 0 samples; the engine hands its tokens to every rank's next step
  g.sampler.sample(logits);
}

void Model::decode_step(const ForwardBatch& b, const std::vector<RowSampling>& sampling, KVCache& cache,
                        ModelWorkspace& ws, std::vector<int32_t>& tokens, std::vector<float>& logprobs) const {
  decode_launch(b, sampling, {}, DecodeFeedSource{}, cache, ws);
  decode_wait(ws, tokens, logprobs);
}

void Model::decode_launch(const ForwardBatch& b, const std::vector<RowSampling>& sampling,
                          const std::vector<int32_t>& feed, const DecodeFeedSource& source, KVCache& cache,
                          ModelWorkspace& ws) const {
  constexpr const char* op = "Model.decode_step";
  const auto entered = std::chrono::steady_clock::now();
  LOWBIT_CHECK(finalized_, op, ": call finalize() after setting the weights");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, !device_.is_cpu(), op, ": decode graphs need a CUDA model, this one is on ",
                    device_.str());
  const KVCacheConfig& kv = cache.config();
  const int64_t longest = std::min<int64_t>(cfg_.max_position_embeddings, kv.num_blocks * kv.block_size);
  if (!ws.decode_graphs) ws.decode_graphs = std::make_shared<DecodeGraphs>(cache, max_decode_rows(ws), longest, device_);
  DecodeGraphs& g = *ws.decode_graphs;
  LOWBIT_CHECK(g.cache == &cache, op, ": this workspace's decode graphs belong to another KV cache");
  check_decode_batch(b, feed, cfg_, kv, g.max_rows, g.longest);
  const int64_t n = int64_t(b.token_ids.size());
  LOWBIT_CHECK(int64_t(sampling.size()) == n, op, ": ", sampling.size(), " sampling entries for ", n, " sequences");
  DecodeGraphs::Slot& slot = g.slots[g.next_slot];
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, !slot.busy, op, ": two decode steps are in flight already (call ",
                    "decode_wait first)");
  const bool fed = std::any_of(feed.begin(), feed.end(), [](int32_t f) { return f >= 0; });
  LOWBIT_CHECK(!fed || g.launches > 0, op, ": feed names the previous step's tokens, but no step ran before");
  LOWBIT_CHECK(!fed || shard_.rank == 0 || source.tokens != nullptr, op,
               ": feed on rank ", shard_.rank, " needs rank 0's tokens (decode_feed_source)");

  const int64_t rows = decode_batch_bucket(n, g.max_rows);
  const int64_t kv_bucket = decode_kv_bucket(*std::max_element(b.attn.kv_len.begin(), b.attn.kv_len.end()), g.longest);
  const int64_t width = (kv_bucket + g.block_size - 1) / g.block_size;
  // Stage the metadata (padding rows: token 0 at position 0, kv_len 0, no slot, no feed, no blocks).
  int32_t* h = slot.meta.as<int32_t>();
  int32_t *ids = h, *pos = h + rows, *q_start = h + 2 * rows, *q_len = h + 3 * rows, *kv_len = h + 4 * rows;
  int32_t *slots = h + 5 * rows, *feeds = h + 6 * rows, *tables = h + 7 * rows;
  const Tensor& bt = b.attn.block_tables;
  const int64_t in_width = bt.size(1);
  for (int64_t i = 0; i < rows; ++i) {
    const bool real = i < n;
    feeds[i] = real && !feed.empty() ? feed[size_t(i)] : -1;
    ids[i] = real && feeds[i] < 0 ? b.token_ids[size_t(i)] : 0;
    pos[i] = real ? b.positions[size_t(i)] : 0;
    q_start[i] = int32_t(i);
    q_len[i] = 1;
    kv_len[i] = real ? b.attn.kv_len[size_t(i)] : 0;
    slots[i] = real ? b.attn.slot_mapping.data<int32_t>()[i] : -1;
    int32_t* row = tables + i * width;
    std::fill(row, row + width, -1);
    if (real) std::copy_n(bt.data<int32_t>() + i * in_width, std::min(in_width, width), row);
  }
  const int64_t used = DecodeGraphs::meta_elems(rows, width);
  cuda::StreamScope on_graph_stream(g.stream);
  auto& entry = g.graphs[{rows, kv_bucket}];
  slot.timed = entry != nullptr;  // a replay (a capturing step runs eagerly first: not timed)
  if (slot.timed) g.mark(slot, 0, op);
  LOWBIT_CUDA_CHECK(op, cudaMemcpyAsync(g.meta_device.data_ptr(), h, size_t(used) * 4, cudaMemcpyHostToDevice,
                                        g.stream));
  g.sampler.stage(sampling, rows, slot.params.as<double>(), op);
  if (fed) {
    // The previous step's tokens: rank 0 sampled them into its sampler's buffer (ordered before this on its
    // stream); another rank copies them from rank 0 once rank 0's event says they are there. Rank 0 overwrites that
    // buffer only in this step's sampling, after the collectives that need this rank's step, so the copy is first.
    const int32_t* sampled = g.sampler.tokens_device.data<int32_t>();
    if (shard_.rank != 0) {
      const int64_t count = *std::max_element(feed.begin(), feed.end()) + 1;
      LOWBIT_CUDA_CHECK(op, cudaStreamWaitEvent(g.stream, static_cast<cudaEvent_t>(source.sampled), 0));
      LOWBIT_CUDA_CHECK(op, cudaMemcpyPeerAsync(g.feed_tokens.data_ptr(), device_.index, source.tokens, source.device,
                                                size_t(count) * 4, g.stream));
      sampled = g.feed_tokens.data<int32_t>();
    }
    int32_t* dev = g.meta_device.data<int32_t>();
    cuda::feed_sampled_tokens(dev, dev + 6 * rows, sampled, n, g.stream);
  }

  if (!entry) {
    // First step of this bucket: run it eagerly (its real results, and the warm-up that fills the
    // graph's memory pool), then capture the same launches; later steps replay the graph.
    auto fresh = std::make_unique<DecodeGraphs::Entry>();
    {
      GraphPoolScope pool(fresh->pool);
      decode_body(rows, kv_bucket, cache, ws);
    }
    g.mark(slot, 2, op);  // tokens sampled (the capture below launches nothing)
    fresh->graph.capture(
        g.stream,
        [&] {
          GraphPoolScope pool(fresh->pool);
          decode_body(rows, kv_bucket, cache, ws);
        },
        op);
    entry = std::move(fresh);
  } else {
    g.mark(slot, 1, op);
    entry->graph.replay(g.stream, op);
    g.mark(slot, 2, op);
  }
  g.last_rows = rows;
  slot.n = shard_.rank == 0 ? n : 0;  // rank 0 samples (decode_body); the others only wait, for errors
  if (slot.n > 0) g.sampler.download_async(n, slot.tokens.as<int32_t>(), slot.logprobs.as<float>(), op);
  g.mark(slot, 3, op);
  slot.busy = true;
  ++g.launches;
  if (g.oldest_busy < 0) g.oldest_busy = g.next_slot;
  g.next_slot ^= 1;
  slot.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - entered).count();
}

void Model::decode_wait(ModelWorkspace& ws, std::vector<int32_t>& tokens, std::vector<float>& logprobs) const {
  constexpr const char* op = "Model.decode_step";
  const auto entered = std::chrono::steady_clock::now();
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, ws.decode_graphs && ws.decode_graphs->oldest_busy >= 0, op,
                    ": no decode step is in flight (decode_launch first)");
  DecodeGraphs& g = *ws.decode_graphs;
  const int k = g.oldest_busy;
  DecodeGraphs::Slot& slot = g.slots[k];
  slot.busy = false;  // whatever the wait says: an error below leaves the slot to the next launch
  g.oldest_busy = g.slots[k ^ 1].busy ? k ^ 1 : -1;
  LOWBIT_CUDA_CHECK(op, cudaEventSynchronize(slot.marks[3]));  // kernel faults surface here
  tokens.assign(slot.tokens.as<int32_t>(), slot.tokens.as<int32_t>() + slot.n);
  logprobs.assign(slot.logprobs.as<float>(), slot.logprobs.as<float>() + slot.n);
  if (slot.timed)
    g.add_timing(slot, op,
                 slot.host_ms + std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - entered)
                                    .count());
}

DecodeFeedSource Model::decode_feed_source(const ModelWorkspace& ws) const {
  DecodeFeedSource s;
  if (!ws.decode_graphs) return s;
  const DecodeGraphs& g = *ws.decode_graphs;
  s.tokens = g.sampler.tokens_device.data<int32_t>();
  s.device = device_.index;
  s.sampled = g.slots[g.next_slot ^ 1].marks[2];  // the latest launch's slot
  return s;
}

DecodeGraphTiming Model::decode_graph_timing(const ModelWorkspace& ws) const {
  return ws.decode_graphs ? ws.decode_graphs->timing : DecodeGraphTiming{};
}

Tensor Model::decode_logits(ModelWorkspace& ws, int64_t n) const {
  LOWBIT_CHECK(ws.decode_graphs && n >= 1 && n <= ws.decode_graphs->last_rows, "Model.decode_logits: ", n,
               " rows requested, the last decode step left ", ws.decode_graphs ? ws.decode_graphs->last_rows : 0);
  cuda::StreamScope on_graph_stream(ws.decode_graphs->stream);
  Tensor logits = ws.logits.slice(0, 0, n);
  model_detail::download_logits(ws.logits_compute.slice(0, 0, n), ws.logits_device.slice(0, 0, n), logits);
  return logits;
}

#else

void Model::decode_body(int64_t, int64_t, KVCache&, ModelWorkspace&) const {
  LOWBIT_NOT_SUPPORTED("Model.decode_step: CUDA graphs need a CUDA build of lowbit");
}

void Model::decode_step(const ForwardBatch& b, const std::vector<RowSampling>&, KVCache& cache, ModelWorkspace&,
                        std::vector<int32_t>&, std::vector<float>&) const {
  (void)b;
  (void)cache;
  (void)&check_decode_batch;
  LOWBIT_NOT_SUPPORTED("Model.decode_step: decode graphs need a CUDA model and a CUDA build of lowbit; this model is on ",
                       device_.str());
}

Tensor Model::decode_logits(ModelWorkspace&, int64_t) const {
  LOWBIT_NOT_SUPPORTED("Model.decode_logits: needs a CUDA build of lowbit");
}

void Model::decode_launch(const ForwardBatch& b, const std::vector<RowSampling>&, const std::vector<int32_t>&,
                          const DecodeFeedSource&, KVCache&, ModelWorkspace&) const {
  (void)b;
  LOWBIT_NOT_SUPPORTED("Model.decode_step: decode graphs need a CUDA model and a CUDA build of lowbit; this model is on ",
                       device_.str());
}

void Model::decode_wait(ModelWorkspace&, std::vector<int32_t>&, std::vector<float>&) const {
  LOWBIT_NOT_SUPPORTED("Model.decode_step: decode graphs need a CUDA build of lowbit");
}

DecodeFeedSource Model::decode_feed_source(const ModelWorkspace&) const { return DecodeFeedSource{}; }

DecodeGraphTiming Model::decode_graph_timing(const ModelWorkspace&) const { return {}; }

#endif

}  // namespace lowbit
