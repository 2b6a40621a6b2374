// Model: the packed weights of a Llama-family decoder and its batched forward pass built from ops.
//
// Lifecycle: construct with a config and a recipe -> set_weight()/set_quantized_weight() for every
// HF tensor name -> finalize() (checks completeness, fuses q/k/v and gate/up so a layer runs four
// linears, packs for the device, frees staging memory) -> forward() any number of times.
// Weights use HF names: model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.self_attn.{q,k,v}_proj.bias
// (attention_bias), model.layers.{i}.post_attention_layernorm.weight,
// model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight (untied).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/dist/communicator.h"
#include "lowbit/kernels/options.h"
#include "lowbit/kernels/plan.h"
#include "lowbit/kv/kv_cache.h"
#include "lowbit/model/config.h"
#include "lowbit/model/tensor_parallel.h"
#include "lowbit/ops/ops.h"
#include "lowbit/quant/format.h"
#include "lowbit/quant/pack.h"
#include "lowbit/quant/recipe.h"

namespace lowbit {

struct DecodeGraphs;
struct DeviceSampler;

// One forward step's tokens (host side). Tokens of sequence i are rows
// [attn.q_start[i], attn.q_start[i] + attn.q_len[i]). attn.block_tables / attn.slot_mapping are
// filled by the caller (on the model's device); logit_rows lists the rows whose logits are wanted.
struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [T]
  std::vector<int32_t> positions;  // [T]
  ops::AttentionMeta attn;
  std::vector<int32_t> logit_rows;
};

// How decode_step samples one row on the device (ops::SamplingParams without penalties, and the
// request's U[0, 1) draw); temperature 0 = greedy.
struct RowSampling {
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f, min_p = 0.f;
  double uniform = 0.0;
};

// Device time of the replayed decode graphs (CUDA events around each replay): with the wall time of the
// same steps it says how long the GPU waits on the host per step (what overlapping steps could hide).
struct DecodeGraphTiming {
  int64_t steps = 0;       // replayed graph steps timed (capturing steps are not)
  double upload_ms = 0;    // from the step's first upload until its graph launch was reached on the stream
  double graph_ms = 0;     // from there to the end of the graph (sampling included)
  double host_ms = 0;      // the same steps' decode_step calls on the host, entry to return (this rank's wall)
};

// Where another rank's queued decode step finds the tokens rank 0 sampled (tensor parallelism): rank 0's device
// buffer, its device index, and the event recorded after the sampling of rank 0's latest launched step.
struct DecodeFeedSource {
  const int32_t* tokens = nullptr;
  int device = -1;
  void* sampled = nullptr;  // cudaEvent_t
};

// Scratch activations for up to max_tokens tokens and max_logit_rows logit rows, allocated once
// (Model::make_workspace) and reused by every forward so that the hot path never allocates.
struct ModelWorkspace {
  int64_t max_tokens = 0, max_logit_rows = 0;
  Tensor ids_host, positions_host;  // s32 [max_tokens] on the host
  Tensor ids, positions;            // s32 on the model device (aliases of the host ones on cpu)
  // CUDA only: the step's s32 metadata (ids | positions | q_start | q_len | kv_len | logit rows) is
  // staged in step_host and uploaded with one copy to step_device; logits_device holds the f32 logits
  // before the step's one synchronizing download; attn is the step's meta with seq_info set.
  Tensor step_host, step_device, logits_device;
  ops::AttentionMeta attn;
  // CUDA only: the captured decode steps, their memory and metadata buffers (model/decode_graphs.h).
  std::shared_ptr<DecodeGraphs> decode_graphs;
  // CUDA only: samples the logit rows of eager steps on the device (forward_sampled), made on first use.
  std::shared_ptr<DeviceSampler> sampler;
  Tensor residual, normed, hidden;  // [max_tokens, hidden]
  Tensor qkv;                       // [max_tokens, q + 2 kv]; rope rotates q and k in place
  Tensor attn_out;                  // [max_tokens, q]
  Tensor gate_up;                   // [max_tokens, 2 * intermediate]
  Tensor act;                       // [max_tokens, intermediate]
  Tensor final_rows;                // [max_logit_rows, hidden]
  Tensor logits_compute;            // [max_logit_rows, vocab] in the compute dtype (device)
  Tensor logits;                    // f32 [max_logit_rows, vocab] on the host
  // Tensor parallel only: this rank's lm_head output [max_logit_rows * vocab_stride] and every rank's,
  // gathered [world * max_logit_rows * vocab_stride], before they are laid side by side in logits_compute.
  Tensor logits_shard, logits_gathered;
  // Only for models with input permutations or FMPQ activations (flat, viewed as [tokens, k] per linear):
  Tensor permuted;                  // [max_tokens * max k] compute dtype: x[:, perm]
  FmpqActivation fmpq;              // q s8 [max_tokens * max k], scales f32 [max_tokens * max k/128 blocks]
};

class Model {
 public:
  // recipe: e.g. "w16a16", "w4a16kv8" (parse_recipe); device "cpu" | "cuda[:N]"; dtype: compute
  // dtype "f32" | "f16" | "bf16" (activations, 16-bit weights, kv16 cache, embedding table).
  Model(const ModelConfig& config, const std::string& recipe, const std::string& device = "cpu",
        const std::string& dtype = "f32");

  // Any float tensor (f32/f16/bf16, any device, any strides). Linear weights are quantized
  // round-to-nearest per the recipe; the shape is checked against the config.
  void set_weight(const std::string& name, const Tensor& tensor);
  // A linear weight already quantized (e.g. by AWQ/GPTQ in Python); its format must match the recipe.
  void set_quantized_weight(const std::string& name, const QuantizedWeight& weight);
  // lm_head's weight format instead of the recipe's rule (float-activation recipes: the recipe's weight format;
  // activation-quantized ones: f16): f32, f16, bf16, w8 or w4. Before lm_head.weight is given. A GGUF file run
  // as stored keeps its 8-bit output layer 8-bit this way (the kernel registry must have a kernel for it).
  void set_head_format(const std::string& format);
  // An act-order GPTQ checkpoint (g_idx) or FMPQ (COMET §3.2, outlier input channels moved into the first
  // 128-channel blocks) reordered this linear's input channels: the forward feeds x[:, perm] to it
  // (ops::gather_columns, on the model's device). perm: s32/s64 [k] on the host, a permutation of 0..k-1.
  // q/k/v and gate/up read one input, so their permutations must be equal (checked by finalize).
  void set_input_permutation(const std::string& name, const Tensor& perm);
  // a4 (fmpq_mixed) recipes: the activation precision of each 128-channel block of this linear's
  // (permuted) input, u8 [ceil(k / 128)] of 4 or 8 (quantize_fmpq). Shared inputs must share the map.
  // A forward without maps fails with NotSupported (round-to-nearest weights carry none).
  void set_fmpq_block_bits(const std::string& name, const Tensor& block_bits);
  // Tensor parallelism: this model becomes rank comm->rank() of comm->world_size() (model/tensor_parallel.h
  // says what a rank holds). Call it right after construction, before any weight: the weights are then given
  // whole, in their HF shapes, and each rank keeps its shard. The ranks of one group run their forwards at the
  // same time, one host thread each (Engine does this); the o and down projections all-reduce their outputs
  // and the logits are gathered, so every rank's forward returns the full logits.
  void set_tensor_parallel(std::shared_ptr<Communicator> comm);
  int tp_rank() const { return shard_.rank; }
  int tp_world() const { return shard_.world; }
  const std::shared_ptr<Communicator>& communicator() const { return comm_; }
  // Kernel overrides and strict mode (kernels/options.h), before finalize(): validated here, applied
  // when finalize() resolves the plans. A forced kernel that cannot run fails finalize() with the
  // reason; with strict, so does a plan that would take a slow fallback kernel.
  void set_kernel_options(const kernels::KernelOptions& options);
  // Throws listing every missing weight; fuses and packs; resolves the execution plans (one kernel per
  // linear role and token bucket, one attention kernel per phase). No set_weight afterwards.
  void finalize();
  bool finalized() const { return finalized_; }

  const ModelConfig& config() const { return cfg_; }
  const Recipe& recipe() const { return recipe_; }
  const Device& device() const { return device_; }
  ScalarType compute_dtype() const { return dtype_; }
  ScalarType k_cache_type() const;
  ScalarType v_cache_type() const;
  KVCacheConfig kv_cache_config(int64_t num_blocks, int block_size) const;
  // The KV block size the engine must use: the recipe's K group for per-channel K (a group is one
  // block, kv_cache.h), else `requested`.
  int kv_block_size(int requested) const;
  int64_t kv_bytes_per_token() const;

  // Summary for users: recipe, dtype, device, parameter bytes per weight group, kv bytes per token,
  // kernels (the linear/attention paths the forward takes).
  struct Info {
    std::string recipe, dtype, device;
    std::map<std::string, int64_t> parameter_bytes;  // embedding, attention, mlp, norms, lm_head
    int64_t kv_bytes_per_token = 0;
    std::vector<std::string> kernels;
  };
  Info info() const;
  // The execution plan, one line per (linear role, token bucket) and attention phase: descriptor,
  // kernel, and why (`lowbit info --plan`). Empty before finalize().
  const std::vector<kernels::PlanLine>& plan() const { return plan_lines_; }

  ModelWorkspace make_workspace(int64_t max_tokens, int64_t max_logit_rows) const;
  // Runs the batch; KV of the new tokens is written into `cache` at attn.slot_mapping. Returns a
  // view of ws.logits: f32 [logit_rows.size(), vocab] on the host. On GPUs with tensor parallelism only
  // rank 0 downloads them (the engine samples there); the other ranks return the view unfilled.
  Tensor forward(const ForwardBatch& batch, KVCache& cache, ModelWorkspace& ws) const;
  // GPU: forward() with the logit rows sampled on the device (sampling[i] for row i, as decode_step does):
  // tokens / logprobs get each row's token and its log-softmax, on rank 0 (other ranks: cleared). The f32
  // logits are downloaded too only with `download_logits` (rows the device cannot sample); otherwise the
  // returned tensor is undefined. Saves the [rows, vocab] f32 download and the host sampling of a mixed step.
  Tensor forward_sampled(const ForwardBatch& batch, const std::vector<RowSampling>& sampling, bool download_logits,
                         KVCache& cache, ModelWorkspace& ws, std::vector<int32_t>& tokens,
                         std::vector<float>& logprobs) const;

  // GPU decode step: every sequence of `batch` adds one token (q_start[i] = i, q_len[i] = 1, one
  // logit row per sequence) and attn.block_tables / attn.slot_mapping are HOST s32 tensors. The step
  // runs as a CUDA graph captured per (batch size, context length) bucket on first use (the first
  // step of a bucket runs eagerly, then is captured), sampling included, with one metadata upload
  // and one small download: tokens / logprobs get each row's token, sampled per sampling[i], and its
  // log-softmax. The logits stay on the device until decode_logits() fetches them.
  void decode_step(const ForwardBatch& batch, const std::vector<RowSampling>& sampling, KVCache& cache,
                   ModelWorkspace& ws, std::vector<int32_t>& tokens, std::vector<float>& logprobs) const;
  // decode_step in two halves, so that the engine can queue the next step before it takes this one's tokens:
  // decode_launch checks, stages, uploads and launches the step, then returns; decode_wait waits for the oldest
  // launched step and returns its tokens (rank 0; cleared elsewhere). At most two steps are in flight. feed (empty,
  // or one entry per sequence): feed[i] >= 0 takes row i's token id from row feed[i] of the previous launched
  // step's sampled tokens on the device (batch.token_ids[i] is not read); other ranks copy rank 0's from `source`.
  void decode_launch(const ForwardBatch& batch, const std::vector<RowSampling>& sampling,
                     const std::vector<int32_t>& feed, const DecodeFeedSource& source, KVCache& cache,
                     ModelWorkspace& ws) const;
  void decode_wait(ModelWorkspace& ws, std::vector<int32_t>& tokens, std::vector<float>& logprobs) const;
  // Rank 0's tokens of its latest launched step, for the other ranks' next decode_launch.
  DecodeFeedSource decode_feed_source(const ModelWorkspace& ws) const;
  // f32 [n, vocab] logits of the last decode_step's first n rows: a view of ws.logits (host).
  Tensor decode_logits(ModelWorkspace& ws, int64_t n) const;
  // Rows one decode graph can hold for this workspace (0 on the CPU: no graphs there).
  int64_t max_decode_rows(const ModelWorkspace& ws) const;
  // Totals over this workspace's replayed decode steps (zeros before any, and on the CPU).
  DecodeGraphTiming decode_graph_timing(const ModelWorkspace& ws) const;

 private:
  // forward_sampled's request: the rows' sampling, whether the logits are downloaded too, where tokens go.
  struct EagerSampling {
    const std::vector<RowSampling>* sampling;
    bool download_logits;
    std::vector<int32_t>* tokens;
    std::vector<float>* logprobs;
  };
  Tensor run_forward(const ForwardBatch& batch, KVCache& cache, ModelWorkspace& ws, const EagerSampling* s) const;
  // What a (fused) linear's input goes through before the GEMM; both undefined for most models.
  struct LinearInput {
    Tensor perm;        // s32 [k] on the model's device: feed x[:, perm]
    Tensor block_bits;  // u8 [ceil(k / 128)] host: FMPQ activation precision per block (a4 recipes)
  };
  struct Layer {
    Tensor input_norm, post_norm;  // [hidden] compute dtype
    PackedWeight qkv, o, gate_up, down;
    Tensor qkv_bias;               // [q + 2 kv] compute dtype, undefined without attention_bias
    LinearInput qkv_in, o_in, gate_up_in, down_in;
  };
  enum class Slot { q, k, v, o, gate, up, down };
  void stage_linear(const std::string& name, QuantizedWeight w);
  int group_for(WeightFormat f) const;  // the group quantize_weight gets for format f under this recipe
  void check_not_finalized(const char* op) const;
  Tensor to_compute(const Tensor& host_f32) const;  // host f32 -> compute dtype on the device
  PackedWeight pack(const QuantizedWeight& w) const;
  // The common input of the linears `suffixes` of layer l (their staged perms / block maps must agree).
  LinearInput shared_input(int l, const std::vector<const char*>& suffixes, const char* what) const;
  // The workspace's FMPQ codes and block scales for T tokens of the linear whose input is `in` (k channels);
  // throws NotSupported where the linear has no block map.
  FmpqActivation fmpq_codes(const LinearInput& in, int64_t T, int64_t k, ModelWorkspace& ws) const;
  // y = linear(x[:, perm]) by `plan` (FMPQ: quantize_fmpq by the block map first).
  void run_linear(const Tensor& x, const LinearInput& in, const PackedWeight& w, const Tensor& bias, Tensor& y,
                  const kernels::LinearPlan& plan, ModelWorkspace& ws) const;
  // The layers and the final norm for T tokens whose ids/positions/metadata are on the model's
  // device (host for the CPU): leaves the normed final hidden states in ws.normed[0, T).
  void forward_layers(const Tensor& ids, const Tensor& positions, const ops::AttentionMeta& attn, int64_t T,
                      KVCache& cache, ModelWorkspace& ws) const;
  // Planning (model/plan.cpp): called by finalize().
  void resolve_plans();
  kernels::LinearPlan plan_linear(const std::string& role, const PackedWeight& w, ActivationMode act,
                                  bool codes_input);
  kernels::AttentionPlan plan_attention();
  // One decode graph's body: ws.decode_graphs' device metadata for `rows` sequences -> logits and
  // sampled tokens on the device (model/decode_graphs.cpp).
  void decode_body(int64_t rows, int64_t kv_bucket, KVCache& cache, ModelWorkspace& ws) const;

  // o / down outputs: the ranks' partial sums added up (nothing to do on one rank).
  void reduce_partial_sums(Tensor& y) const;
  // residual += the ranks' partial sums (or `partial` itself on one rank), then out = rms_norm(residual) * weight:
  // one kernel where the group fuses the all-reduce with the norm, else the all-reduce and ops::add_rms_norm.
  void reduce_add_rms_norm(Tensor& partial, Tensor& residual, const Tensor& weight, float eps, Tensor& out) const;
  // Whether the group did all of that (into out, or into q / scales when out is undefined) in one kernel.
  bool fused_reduce_norm(Tensor& partial, Tensor& residual, const Tensor& weight, float eps, Tensor& out, Tensor& q,
                         Tensor& scales) const;
  // rows (the final normed hidden states of the logit rows) -> logits [R, vocab] in the compute dtype: lm_head,
  // and with tensor parallelism the gather of every rank's vocabulary slice.
  void lm_head_logits(const Tensor& rows, Tensor& logits, ModelWorkspace& ws) const;

  ModelConfig cfg_;    // the whole model's config (what callers see)
  ModelConfig local_;  // this rank's share of it (cfg_ without tensor parallelism): the forward's shapes
  ShardLayout shard_;
  std::shared_ptr<Communicator> comm_;
  Recipe recipe_;
  Device device_;
  ScalarType dtype_;
  WeightFormat weight_format_;
  WeightFormat head_format_;  // lm_head: weight_format_ under float-activation recipes, else f16 (bf16 for bf16)
  PackTarget pack_target_;
  bool finalized_ = false;

  // Staging until finalize(): quantized linears by HF name, float tensors by HF name.
  std::map<std::string, QuantizedWeight> staged_linear_;
  std::map<std::string, Tensor> staged_float_;  // host f32
  std::map<std::string, Tensor> staged_perm_, staged_block_bits_;  // by linear name, host s32 / u8
  bool has_input_transforms_ = false;  // any perm or block map: the workspace needs its buffers

  Tensor embed_table_;  // [vocab, hidden] compute dtype on the device
  Tensor final_norm_;
  PackedWeight lm_head_;
  std::vector<Layer> layers_;
  std::map<std::string, int64_t> parameter_bytes_;

  // Kernel options (set_kernel_options) and the plans finalize() resolves from them.
  kernels::ParsedKernelOptions kernel_options_;
  struct Plans {
    kernels::LinearPlan qkv, o, gate_up, down, lm_head;
    kernels::AttentionPlan attention;
  } plans_;
  std::vector<kernels::PlanLine> plan_lines_;
};

}  // namespace lowbit
