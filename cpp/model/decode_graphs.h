// CUDA-graph decode steps (Model::decode_step). A decode step's launches depend only on the batch
// size, the longest context (it sizes the split-KV attention grid) and buffer addresses, so the
// step is captured once per (batch bucket, context bucket) and replayed: the host then issues one
// metadata upload, one graph launch and one small download per step instead of ~10 launches per
// layer. Padding rows of a bucket have kv_len 0 (attention writes zeros) and slot -1 (no KV write).
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
  // ids [rows] | positions [rows] | (q_start, q_len, kv_len) [3, rows] | slots [rows] | tables [rows, width].
  static int64_t meta_elems(int64_t rows, int64_t width) { return rows * (6 + width); }

  const KVCache* cache;       // the graphs bake in this cache's tensors
  int64_t max_rows, longest;  // bucket caps
  int block_size;
  Tensor meta_host, meta_device;  // s32, meta_elems(max_rows, max width)
  DeviceSampler sampler;          // the graphs bake in its buffers
  int64_t last_rows = 0;  // rows (bucket) of the last step, whose logits ws.logits_compute holds
  DecodeGraphTiming timing;  // replayed steps so far
#ifdef LOWBIT_WITH_CUDA
  cudaStream_t stream = nullptr;  // graphs are captured and replayed here (not the legacy stream)
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Entry>> graphs;
  // A replayed step's marks on `stream`: before its uploads, before its graph launch, after the graph.
  cudaEvent_t marks[3] = {};
  void mark(int i, const char* op) const;
  void add_timing(const char* op, double host_ms);  // after the step's sync; host_ms: decode_step's wall so far
#endif
};

}  // namespace lowbit
