// CUDA-graph decode steps (Model::decode_step). A decode step's launches depend only on the batch
// size, the longest context (it sizes the split-KV attention grid) and buffer addresses, so the
// step is captured once per (batch bucket, context bucket) and replayed: the host then issues one
// metadata upload, one graph launch and one small download per step instead of ~10 launches per
// layer. Padding rows of a bucket have kv_len 0 (attention writes zeros) and slot -1 (no KV write).
// A step can be queued while the previous one runs (Model::decode_launch, the engine's overlap_steps): its token ids
// then come from the previous step's sampled tokens on the device (the metadata's feed row).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "lowbit/core/allocator.h"
#include "lowbit/core/tensor.h"
#include "lowbit/kv/kv_cache.h"
#include "lowbit/model/model.h"  // DecodeGraphTiming
#include "model/device_sampler.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/graph.h"
#endif

namespace lowbit {

// Batch buckets: powers of two, and max_rows itself. n in [1, max_rows].
int64_t decode_batch_bucket(int64_t n, int64_t max_rows);
// Context buckets: powers of two from 256 tokens, capped at `longest` (the longest sequence the
// cache can hold). max_kv in [1, longest].
int64_t decode_kv_bucket(int64_t max_kv, int64_t longest);

// Page-locked host memory (cudaHostAlloc): copies between it and the device queue behind the stream's earlier
// work without blocking the host, which the decode steps' staging needs when a step is queued behind another.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(int64_t bytes, const char* op);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

struct DecodeGraphs {
#ifdef LOWBIT_WITH_CUDA
  struct Entry {
    GraphMemoryPool pool;  // declared first: destroyed after the graph that uses its memory
    cuda::CudaGraph graph;
  };
#endif
  DecodeGraphs(const KVCache& cache, int64_t max_rows, int64_t longest, const Device& device);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Metadata of one step, for `rows` sequences and block tables `width` wide:
  // ids [rows] | positions [rows] | (q_start, q_len, kv_len) [3, rows] | slots [rows] | feed [rows] |
  // tables [rows, width]. feed[i] >= 0: row i's token is row feed[i] of the previous step's sampled tokens.
  static int64_t meta_elems(int64_t rows, int64_t width) { return rows * (7 + width); }

  const KVCache* cache;       // the graphs bake in this cache's tensors
  int64_t max_rows, longest;  // bucket caps
  int block_size;
  Tensor meta_device;       // s32, meta_elems(max_rows, max width)
  Tensor feed_tokens;       // s32 [max_rows]: tensor parallelism, rank 0's sampled tokens copied here (other ranks)
  DeviceSampler sampler;    // the graphs bake in its buffers
  int64_t last_rows = 0;    // rows (bucket) of the last step, whose logits ws.logits_compute holds
  DecodeGraphTiming timing;  // replayed steps so far
#ifdef LOWBIT_WITH_CUDA
  // A step's host side: its staged metadata and sampling parameters, the tokens it brings back, its events. Two
  // are used in turn, so one step can be queued while the one before it still runs (decode_launch / decode_wait).
  struct Slot {
    PinnedBuffer meta, params, tokens, logprobs;
    // On `stream`: before the step's uploads, before its graph launch, after the graph (its tokens are sampled),
    // after the tokens' download.
    cudaEvent_t marks[4] = {};
    bool busy = false;   // launched, not yet waited for
    bool timed = false;  // a replay (the capturing step runs eagerly first and is not timed)
    int64_t n = 0;       // sequences (rank 0 downloads their tokens)
    double host_ms = 0;  // decode_launch's wall, for timing
  };
  cudaStream_t stream = nullptr;  // graphs are captured and replayed here (not the legacy stream)
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Entry>> graphs;
  Slot slots[2];
  int64_t launches = 0;
  int next_slot = 0;     // the slot the next launch stages into
  int oldest_busy = -1;  // the slot decode_wait takes next (steps are waited for in launch order)
  void mark(Slot& s, int i, const char* op) const;
  void add_timing(const Slot& s, const char* op, double host_ms);  // after the step's wait
#endif
};

}  // namespace lowbit
