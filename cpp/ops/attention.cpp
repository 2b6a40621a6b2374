// ops::kv_write and ops::paged_attention: argument checks, then the kernel: for attention the plan's
// for the step's phase, or (unplanned calls) the registry's choice for the call's descriptor.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/kv_quant_cpu.h"
#include "kernels/cpu/rope_cpu.h"
#include "lowbit/kernels/registry.h"
#include "lowbit/ops/ops.h"
#include "ops/op_checks.h"
#include "ops/op_device.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/stream.h"
#include "lowbit/cuda/kernels.h"
#endif

namespace lowbit::ops {

namespace {

void check_float_activation(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  LOWBIT_CHECK_TYPE(t.dtype() == ScalarType::f32 || t.dtype() == ScalarType::f16 || t.dtype() == ScalarType::bf16,
                    op, ": argument '", arg, "' must be f32, f16 or bf16, got ", name_of(t.dtype()));
  check_dim(t, 3, op, arg);
  LOWBIT_CHECK(t.stride(2) == 1 || t.size(2) <= 1, op, ": argument '", arg,
               "' must be contiguous in its last dimension, got strides ", shape_str(t.strides()));
}

// The cache's tensors count as one more operand: its device must match the activations'.
void check_cache_device(const Device& dev, const KVCacheConfig& cfg, const char* op) {
  LOWBIT_CHECK_TYPE(cfg.device == dev, op, ": the KV cache is on ", cfg.device.str(), " but the other operands are on ",
                    dev.str(), "; all operands must be on one device");
}

void check_layer(const KVCache& cache, int layer, const char* op) {
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, layer >= 0 && layer < cache.config().num_layers, op, ": argument 'layer' = ",
                    layer, " out of range [0, ", cache.config().num_layers, ")");
}

void check_s32_vector(const Tensor& t, int64_t n, const char* op, const char* arg) {
  check_defined(t, op, arg);
  check_dtype(t, ScalarType::s32, op, arg);
  check_shape(t, {n}, op, arg);
  check_contiguous(t, op, arg);
}

// Sequences' token ranges and lengths, and the block-table entries the kernel will read.
void check_meta(const AttentionMeta& meta, int64_t num_tokens, const KVCacheConfig& cfg, const char* op) {
  const size_t n = meta.q_len.size();
  LOWBIT_CHECK(meta.q_start.size() == n && meta.kv_len.size() == n, op,
               ": meta.q_start, meta.q_len and meta.kv_len must have one entry per sequence, got sizes ",
               meta.q_start.size(), ", ", meta.q_len.size(), ", ", meta.kv_len.size());
  const Tensor& bt = meta.block_tables;
  check_defined(bt, op, "meta.block_tables");
  check_dtype(bt, ScalarType::s32, op, "meta.block_tables");
  check_dim(bt, 2, op, "meta.block_tables");
  LOWBIT_CHECK(bt.size(0) == static_cast<int64_t>(n), op, ": meta.block_tables must have one row per sequence (",
               n, "), got shape ", shape_str(bt.shape()));
  LOWBIT_CHECK(bt.stride(1) == 1 || bt.size(1) <= 1, op, ": meta.block_tables must be contiguous in its last dim");
  for (size_t s = 0; s < n; ++s) {
    const int64_t qs = meta.q_start[s], ql = meta.q_len[s], kl = meta.kv_len[s];
    LOWBIT_CHECK(ql >= 0 && qs >= 0 && qs + ql <= num_tokens, op, ": sequence ", s, " has q_start ", qs, ", q_len ",
                 ql, " outside the ", num_tokens, " query tokens");
    LOWBIT_CHECK(kl >= ql, op, ": sequence ", s, " has kv_len ", kl, " < q_len ", ql,
                 " (kv_len counts the new tokens too)");
    if (ql == 0 || !bt.device().is_cpu()) continue;  // a device table is not read back (no sync)
    const int64_t blocks = (kl + cfg.block_size - 1) / cfg.block_size;
    LOWBIT_CHECK(blocks <= bt.size(1), op, ": sequence ", s, " needs ", blocks, " blocks for kv_len ", kl,
                 " but meta.block_tables has ", bt.size(1), " columns");
    const int32_t* row = bt.data<int32_t>() + s * bt.stride(0);
    for (int64_t b = 0; b < blocks; ++b)
      LOWBIT_CHECK_KIND(ErrorKind::kIndex, row[b] >= 0 && row[b] < cfg.num_blocks, op, ": meta.block_tables[", s,
                        ", ", b, "] = ", row[b], " is not a block of the cache [0, ", cfg.num_blocks, ")");
  }
}

#ifdef LOWBIT_WITH_CUDA
// (q_start, q_len, kv_len) rows on the device: the caller's meta.seq_info, or uploaded here.
Tensor device_seq_info(const AttentionMeta& meta, const Device& dev, const char* op) {
  const int64_t n = int64_t(meta.q_len.size());
  if (meta.seq_info.defined()) {
    check_dtype(meta.seq_info, ScalarType::s32, op, "meta.seq_info");
    check_shape(meta.seq_info, {3, n}, op, "meta.seq_info");
    check_contiguous(meta.seq_info, op, "meta.seq_info");
    LOWBIT_CHECK_TYPE(meta.seq_info.device() == dev, op, ": meta.seq_info is on ", meta.seq_info.device().str(),
                      " but the other operands are on ", dev.str());
    return meta.seq_info;
  }
  Tensor host = Tensor::empty({3, n}, ScalarType::s32);
  int32_t* h = host.data<int32_t>();
  std::copy(meta.q_start.begin(), meta.q_start.end(), h);
  std::copy(meta.q_len.begin(), meta.q_len.end(), h + n);
  std::copy(meta.kv_len.begin(), meta.kv_len.end(), h + 2 * n);
  return host.to(dev);
}

#endif

// What a step's attention looks like: its longest query run and context, and whether it is a decode
// step (every sequence one query, rows in sequence order), which picks the plan's decode kernel.
struct StepShape {
  int32_t max_q = 0, max_kv = 0;
  bool decode = true;
};
StepShape step_shape(const AttentionMeta& meta) {
  StepShape s;
  for (size_t i = 0; i < meta.q_len.size(); ++i) {
    s.max_q = std::max(s.max_q, meta.q_len[i]);
    s.max_kv = std::max(s.max_kv, meta.kv_len[i]);
    s.decode = s.decode && meta.q_start[i] == int32_t(i) && meta.q_len[i] == 1;
  }
  return s;
}

// Runs `kernel` (the plan's, or the registry's choice) on checked arguments.
void run_attention(const kernels::AttnKernel* kernel, const Tensor& q, const KVCache& cache, int layer,
                   const AttentionMeta& meta, float scale, Tensor& out, const Device& dev, const StepShape& shape,
                   const kernels::KernelTuning& tuning) {
  constexpr const char* op = "paged_attention";
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, kernel != nullptr && kernel->launch != nullptr, op, ": kernel ",
                    kernel ? kernel->name : "(none)", " is not built into this library");
  Tensor seq_info;
  if (dev.is_cuda()) {
    LOWBIT_CHECK(meta.block_tables.is_contiguous(), op, ": meta.block_tables must be contiguous on the GPU");
    if (meta.q_len.empty()) return;
#ifdef LOWBIT_WITH_CUDA
    seq_info = device_seq_info(meta, dev, op);
#endif
  }
  kernel->launch(kernels::AttnArgs{q, cache, layer, meta, seq_info, shape.max_q, shape.max_kv, scale, out, tuning});
}

}  // namespace

kernels::AttnDesc describe_attention(const Tensor& q, const Tensor& out, const KVCache& cache, bool decode) {
  const KVCacheConfig& cfg = cache.config();
  kernels::AttnDesc d;
  d.device = q.device().kind;
  d.sm = kernels::compute_capability(q.device());
  d.phase = decode ? kernels::AttnPhase::decode : kernels::AttnPhase::prefill;
  d.head_dim = int(cfg.head_dim);
  d.q_type = q.dtype();
  d.out_type = out.dtype();
  d.k_type = cfg.k_type;
  d.v_type = cfg.v_type;
  d.kv_granularity = cfg.k_per_channel ? kernels::KvGranularity::per_channel_k : kernels::KvGranularity::per_token_head;
  d.gqa_group = int(q.size(1) / cfg.num_kv_heads);
  d.block_size = cfg.block_size;
  const auto bytes = [&](int64_t elems) { return bytes_for(q.dtype(), elems); };
  d.q_rows_aligned16 = q.dim() == 3 && q.stride(2) == 1 && bytes(q.stride(0)) % 16 == 0 &&
                       bytes(q.stride(1)) % 16 == 0 && reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0;
  return d;
}

Device check_kv_write_args(const char* op, const KVCache& cache, int layer, const Tensor& k, const Tensor& v,
                           const AttentionMeta& meta) {
  const KVCacheConfig& cfg = cache.config();
  check_layer(cache, layer, op);
  check_float_activation(k, op, "k");
  check_float_activation(v, op, "v");
  const int64_t T = k.size(0);
  check_shape(k, {T, cfg.num_kv_heads, cfg.head_dim}, op, "k");
  check_shape(v, {T, cfg.num_kv_heads, cfg.head_dim}, op, "v");
  check_s32_vector(meta.slot_mapping, T, op, "meta.slot_mapping");
  const Device dev = op_device(op, {{"k", &k}, {"v", &v}, {"meta.slot_mapping", &meta.slot_mapping}});
  check_cache_device(dev, cfg, op);
  if (dev.is_cpu()) {  // host slots can be range-checked; device ones would need a sync (see ops.h)
    const int32_t* slots = meta.slot_mapping.data<int32_t>();
    const int64_t num_slots = cfg.num_blocks * cfg.block_size;
    for (int64_t t = 0; t < T; ++t)
      LOWBIT_CHECK_KIND(ErrorKind::kIndex, slots[t] < num_slots, op, ": meta.slot_mapping[", t, "] = ", slots[t],
                        " is past the cache's ", num_slots, " slots (negative slots skip a token)");
  }
  return dev;
}

#ifdef LOWBIT_WITH_CUDA
namespace {
// Whether the current stream is capturing a CUDA graph (its launches repeat an eager step's).
bool capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(cuda::current_stream(), &status) == cudaSuccess &&
         status == cudaStreamCaptureStatusActive;
}
}  // namespace
#endif

void prepare_k_window(KVCache& cache, const Tensor& slot_mapping, const std::function<bool(int32_t)>& live) {
  constexpr const char* op = "prepare_k_window";
  if (!cache.has_k_window()) return;
  LOWBIT_CHECK(slot_mapping.device().is_cpu() && slot_mapping.dtype() == ScalarType::s32 && slot_mapping.dim() == 1 &&
                   slot_mapping.is_contiguous(),
               op, ": argument 'slot_mapping' must be a contiguous host s32 vector, got ", slot_mapping.str());
  KWindowSlots& slots = cache.k_window_slots();
  slots.prepare(slot_mapping.data<int32_t>(), slot_mapping.numel(), cache.config().block_size, live);
  const auto [lo, hi] = slots.take_changed();
  if (lo >= hi) return;
#ifdef LOWBIT_WITH_CUDA
  // A pageable source: the call returns once the bytes are staged, so the host table may change after.
  LOWBIT_CUDA_CHECK(op, cudaMemcpyAsync(cache.k_window_map().data<int32_t>() + lo, slots.map().data() + lo,
                                        size_t(hi - lo) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                        cuda::current_stream()));
#endif
}

void kv_write(KVCache& cache, int layer, const Tensor& k, const Tensor& v, const AttentionMeta& meta) {
  const Device dev = check_kv_write_args("kv_write", cache, layer, k, v, meta);
  if (dev.is_cuda()) {
#ifdef LOWBIT_WITH_CUDA
    if (cache.has_k_window() && !capturing()) cache.check_k_window_prepared(layer, k.size(0));
    Tensor kd = cache.k_data(layer), vd = cache.v_data(layer), kp = cache.k_params(layer), vp = cache.v_params(layer);
    return cuda::kv_write(k, v, kd, vd, kp, vp, meta.slot_mapping, cuda::current_stream(),
                          cuda::k_window_of(cache, layer));
#endif
  }
  cpu::kv_write_cpu(cache, layer, k, v, meta.slot_mapping);
}

void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const RopeConfig& rope,
                   KVCache& cache, int layer, const AttentionMeta& meta) {
  constexpr const char* op = "rope_kv_write";
  // Every check of both ops first, so bad input changes nothing (not even q and k).
  check_defined(k, op, "k");
  const Device dev = check_rope_args(op, q, k, positions, rope);
  const Device kv_dev = check_kv_write_args(op, cache, layer, k, v, meta);
  LOWBIT_CHECK_TYPE(kv_dev == dev, op, ": arguments 'q'/'positions' are on ", dev.str(), " but 'k'/'v' are on ",
                    kv_dev.str(), "; all operands must be on one device");
  if (dev.is_cpu()) {
    cpu::rope_cpu(q, k, positions, rope);
    return cpu::kv_write_cpu(cache, layer, k, v, meta.slot_mapping);
  }
#ifdef LOWBIT_WITH_CUDA
  const int rd = rope.rotary_dim > 0 ? rope.rotary_dim : static_cast<int>(k.size(2));
  if (cache.has_k_window() && !capturing()) cache.check_k_window_prepared(layer, k.size(0));
  Tensor kd = cache.k_data(layer), vd = cache.v_data(layer), kp = cache.k_params(layer), vp = cache.v_params(layer);
  cuda::rope_kv_write(q, k, v, positions, cpu::rope_inv_freq(rope, rd), rope.neox, kd, vd, kp, vp, meta.slot_mapping,
                      cuda::current_stream(), cuda::k_window_of(cache, layer));
#endif
}

namespace {

// Every check of paged_attention; returns the operands' device.
Device check_attention_args(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                            Tensor& out) {
  constexpr const char* op = "paged_attention";
  const KVCacheConfig& cfg = cache.config();
  check_layer(cache, layer, op);
  check_float_activation(q, op, "q");
  check_float_activation(out, op, "out");
  check_shape(out, q.shape(), op, "out");
  LOWBIT_CHECK(q.size(2) == cfg.head_dim, op, ": argument 'q' has head_dim ", q.size(2), " but the cache has ",
               cfg.head_dim);
  LOWBIT_CHECK(q.size(1) > 0 && q.size(1) % cfg.num_kv_heads == 0, op, ": argument 'q' has ", q.size(1),
               " heads, which must be a positive multiple of the cache's ", cfg.num_kv_heads, " KV heads");
  LOWBIT_CHECK(std::isfinite(scale), op, ": argument 'scale' must be finite, got ", scale);
  const Device dev = op_device(op, {{"q", &q}, {"out", &out}, {"meta.block_tables", &meta.block_tables}});
  check_cache_device(dev, cfg, op);
  check_meta(meta, q.size(0), cfg, op);
  return dev;
}

}  // namespace

namespace {

// A mixed step (decode rows first, then prefill chunks) on two kernels: `decode` over the leading decode
// sequences, `prefill` over the rest. Returns false (nothing run) when the step is not mixed, or when one
// kernel serves both phases anyway.
bool run_mixed_step(const kernels::AttnKernel* decode, const kernels::AttnKernel* prefill, const Tensor& q,
                    const KVCache& cache, int layer, const AttentionMeta& meta, float scale, Tensor& out,
                    const Device& dev, const kernels::KernelTuning& tuning) {
  const size_t n = meta.q_len.size(), d = decode_prefix(meta);
  if (d == 0 || d == n || decode == prefill || decode == nullptr || prefill == nullptr) return false;
  const AttentionMeta head = meta_part(meta, 0, d, meta.decode_seq_info);
  const AttentionMeta tail = meta_part(meta, d, n - d, meta.prefill_seq_info);
  run_attention(decode, q, cache, layer, head, scale, out, dev, step_shape(head), tuning);
  run_attention(prefill, q, cache, layer, tail, scale, out, dev, step_shape(tail), tuning);
  return true;
}

}  // namespace

void paged_attention(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                     Tensor& out, const std::string& kernel, const kernels::KernelTuning& tuning) {
  const Device dev = check_attention_args(q, cache, layer, meta, scale, out);
  const StepShape shape = step_shape(meta);
  const kernels::AttnKernel* chosen =
      kernels::select_attention(describe_attention(q, out, cache, shape.decode), kernel, false, "paged_attention")
          .kernel;
  // A kernel forced by name serves every row; the registry's choice splits a mixed step by phase.
  if (!shape.decode && kernel.empty() && tuning.split_mixed_attention && decode_prefix(meta) > 0) {
    const kernels::AttnKernel* decode = kernels::try_select_attention(describe_attention(q, out, cache, true)).kernel;
    if (run_mixed_step(decode, chosen, q, cache, layer, meta, scale, out, dev, tuning)) return;
  }
  run_attention(chosen, q, cache, layer, meta, scale, out, dev, shape, tuning);
}

void paged_attention(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                     Tensor& out, const kernels::AttentionPlan& plan) {
  const Device dev = check_attention_args(q, cache, layer, meta, scale, out);
  const StepShape shape = step_shape(meta);
  if (!shape.decode && plan.tuning.split_mixed_attention &&
      run_mixed_step(plan.decode, plan.prefill, q, cache, layer, meta, scale, out, dev, plan.tuning))
    return;
  run_attention(shape.decode ? plan.decode : plan.prefill, q, cache, layer, meta, scale, out, dev, shape, plan.tuning);
}

}  // namespace lowbit::ops
