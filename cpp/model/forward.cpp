// The batched Llama-family forward pass (pre-norm decoder, GQA, SwiGLU MLP) built from ops:
//   embedding -> per layer: rms_norm, qkv linear (+bias), rope and kv_write (one fused op on the
//   GPU), paged_attention, o linear, add_rms_norm, gate_up linear, silu_mul, down linear -> final
//   add_rms_norm -> lm_head on the rows that need logits. Residual adds are fused into the next norm
//   (add_rms_norm); with W8A8 / FP8 / FMPQ on the GPU the norm (and SiLU·mul) also quantizes the next linear's
//   input. Under tensor parallelism the o / down partial sums are all-reduced there too, in the same kernel on the
//   one-shot group (FMPQ: all-reduced first, then the norm that writes the codes).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "lowbit/model/model.h"
#include "model/device_sampler.h"
#include "model/device_support.h"
#include "model/host_convert.h"

namespace lowbit {

ModelWorkspace Model::make_workspace(int64_t max_tokens, int64_t max_logit_rows) const {
  LOWBIT_CHECK(max_tokens > 0, "Model.make_workspace: max_tokens must be positive, got ", max_tokens);
  LOWBIT_CHECK(max_logit_rows > 0, "Model.make_workspace: max_logit_rows must be positive, got ", max_logit_rows);
  // This rank's shapes (the whole model's without tensor parallelism); the hidden size is never split.
  const int64_t T = max_tokens, H = local_.hidden_size, I = local_.intermediate_size;
  ModelWorkspace ws;
  ws.max_tokens = T;
  ws.max_logit_rows = max_logit_rows;
  ws.ids_host = Tensor::empty({T}, ScalarType::s32);
  ws.positions_host = Tensor::empty({T}, ScalarType::s32);
  ws.ids = device_.is_cpu() ? ws.ids_host : Tensor::empty({T}, ScalarType::s32, device_);
  ws.positions = device_.is_cpu() ? ws.positions_host : Tensor::empty({T}, ScalarType::s32, device_);
  if (!device_.is_cpu()) {
    // One s32 upload per step: ids, positions (T each), (q_start, q_len, kv_len) of <= T sequences,
    // logit rows, and the same sequence rows split at a mixed step's decode prefix.
    ws.step_host = Tensor::empty({8 * T + max_logit_rows}, ScalarType::s32);
    ws.step_device = Tensor::empty({8 * T + max_logit_rows}, ScalarType::s32, device_);
    ws.logits_device = Tensor::empty({max_logit_rows, cfg_.vocab_size}, ScalarType::f32, device_);
  }
  ws.residual = Tensor::empty({T, H}, dtype_, device_);
  ws.normed = Tensor::empty({T, H}, dtype_, device_);
  ws.hidden = Tensor::empty({T, H}, dtype_, device_);
  ws.qkv = Tensor::empty({T, local_.qkv_size()}, dtype_, device_);
  ws.attn_out = Tensor::empty({T, local_.q_size()}, dtype_, device_);
  ws.gate_up = Tensor::empty({T, 2 * I}, dtype_, device_);
  ws.act = Tensor::empty({T, I}, dtype_, device_);
  ws.final_rows = Tensor::empty({max_logit_rows, H}, dtype_, device_);
  ws.logits = Tensor::empty({max_logit_rows, cfg_.vocab_size}, ScalarType::f32);
  // f32 on the host: the lm_head writes the final logits directly.
  ws.logits_compute = dtype_ == ScalarType::f32 && device_.is_cpu()
                          ? ws.logits
                          : Tensor::empty({max_logit_rows, cfg_.vocab_size}, dtype_, device_);
  if (shard_.sharded()) {
    ws.logits_shard = Tensor::empty({max_logit_rows * shard_.vocab_stride}, dtype_, device_);
    ws.logits_gathered = Tensor::empty({shard_.world * max_logit_rows * shard_.vocab_stride}, dtype_, device_);
  }
  if (has_input_transforms_) {
    const int64_t max_k = std::max({H, I, int64_t(local_.q_size())});
    const int64_t max_blocks = (H + kFmpqBlock - 1) / kFmpqBlock + (I + kFmpqBlock - 1) / kFmpqBlock +
                               (local_.q_size() + kFmpqBlock - 1) / kFmpqBlock;  // >= the blocks of any one k
    ws.permuted = Tensor::empty({T * max_k}, dtype_, device_);
    ws.fmpq.q = Tensor::empty({T * max_k}, ScalarType::s8, device_);
    ws.fmpq.scales = Tensor::empty({T * max_blocks}, ScalarType::f32, device_);
  }
  return ws;
}

FmpqActivation Model::fmpq_codes(const LinearInput& in, int64_t T, int64_t k, ModelWorkspace& ws) const {
  if (!in.block_bits.defined())
    LOWBIT_NOT_SUPPORTED("Model.forward: recipe ", recipe_.text, " (FMPQ activations) needs a block map per linear ",
                         "(Model.set_fmpq_block_bits, written by `lowbit quantize --algo fmpq`); weights quantized ",
                         "round-to-nearest by set_weight carry none");
  FmpqActivation a;
  a.q = ws.fmpq.q.slice(0, 0, T * k).view({T, k});
  a.scales = ws.fmpq.scales.slice(0, 0, T * in.block_bits.numel()).view({T, in.block_bits.numel()});
  return a;
}

void Model::run_linear(const Tensor& x, const LinearInput& in, const PackedWeight& w, const Tensor& bias, Tensor& y,
                       const kernels::LinearPlan& plan, ModelWorkspace& ws) const {
  const int64_t T = x.size(0), k = x.size(1);
  if (recipe_.activation == ActivationMode::fmpq_mixed && !device_.is_cpu()) {
    // The GPU quantizer reads x[:, perm] itself and writes the codes and block scales in one kernel.
    FmpqActivation a = fmpq_codes(in, T, k, ws);
    ops::quantize_fmpq(x, in.block_bits, in.perm, a);
    ops::linear_fmpq(a, w, bias, y, plan);
    return;
  }
  if (recipe_.activation == ActivationMode::fmpq_mixed && !in.block_bits.defined())
    (void)fmpq_codes(in, T, k, ws);  // throws: no block map
  Tensor input = x;
  if (in.perm.defined()) {
    input = ws.permuted.slice(0, 0, T * k).view({T, k});
    ops::gather_columns(x, in.perm, input);
  }
  if (recipe_.activation != ActivationMode::fmpq_mixed) {
    ops::linear(input, w, bias, y, plan);
    return;
  }
  FmpqActivation a = fmpq_codes(in, T, k, ws);
  quantize_fmpq(input, in.block_bits, a);
  ops::linear_fmpq(a, w, bias, y, plan);
}

void Model::forward_layers(const Tensor& ids, const Tensor& positions, const ops::AttentionMeta& attn, int64_t T,
                           KVCache& cache, ModelWorkspace& ws) const {
  const int64_t D = local_.head_dim;
  const int Hq = local_.num_heads, Hkv = local_.num_kv_heads;  // this rank's heads
  Tensor residual = ws.residual.slice(0, 0, T), normed = ws.normed.slice(0, 0, T), hidden = ws.hidden.slice(0, 0, T);
  Tensor qkv = ws.qkv.slice(0, 0, T), attn_out = ws.attn_out.slice(0, 0, T);
  Tensor gate_up = ws.gate_up.slice(0, 0, T), act = ws.act.slice(0, 0, T);
  Tensor qkv_heads = qkv.view({T, Hq + 2 * Hkv, D});
  // Per-head strided views into the fused qkv output (the ops accept rows with a stride).
  Tensor q = qkv_heads.slice(1, 0, Hq), k = qkv_heads.slice(1, Hq, Hq + Hkv);
  const Tensor v = qkv_heads.slice(1, Hq + Hkv, Hq + 2 * Hkv);
  Tensor attn_heads = attn_out.view({T, Hq, D});
  const ops::RopeConfig rope = cfg_.rope_config();
  const float eps = cfg_.rms_norm_eps;
  const float scale = 1.f / std::sqrt(float(D));
  const Tensor no_bias;
  const ScalarType code_type = recipe_.activation == ActivationMode::fp8_per_token ? ScalarType::e4m3 : ScalarType::s8;
  // residual (+= added, when defined) -> norm -> linear into y. A plan with fused_norm_quant (W8A8 /
  // FP8 on the GPU) has the norm emit the linear's per-token codes (one kernel, the same bytes).
  // `added` is a row-parallel linear's output: under tensor parallelism this rank's partial sum, summed over the
  // ranks here, in the norm's kernel when the group fuses them (Communicator::all_reduce_add_rms_norm).
  auto norm_then_linear = [&](Tensor& added, const Tensor& norm_w, const LinearInput& in, const PackedWeight& w,
                              const Tensor& bias, const kernels::LinearPlan& plan, Tensor& y) {
    if (plan.fused_norm_quant) {
      Tensor codes = Tensor::empty({T, residual.size(1)}, code_type, device_);
      Tensor scales = Tensor::empty({T}, ScalarType::f32, device_);
      Tensor no_out;
      if (!added.defined() || !fused_reduce_norm(added, residual, norm_w, eps, no_out, codes, scales)) {
        if (added.defined()) reduce_partial_sums(added);
        ops::rms_norm_quantize(residual, added, norm_w, eps, codes, scales);
      }
      ops::linear_quantized(codes, scales, w, bias, y, plan);
      return;
    }
    if (plan.fused_fmpq_quant) {  // FMPQ: the norm writes the block codes of normed[:, perm] (one kernel, same bytes)
      if (added.defined()) reduce_partial_sums(added);
      FmpqActivation a = fmpq_codes(in, T, residual.size(1), ws);
      ops::rms_norm_quantize_fmpq(residual, added, norm_w, eps, in.block_bits, in.perm, a);
      ops::linear_fmpq(a, w, bias, y, plan);
      return;
    }
    if (!added.defined())
      ops::rms_norm(residual, norm_w, eps, normed);
    else
      reduce_add_rms_norm(added, residual, norm_w, eps, normed);
    run_linear(normed, in, w, bias, y, plan, ws);
  };
  ops::embedding(ids, embed_table_, residual);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    Tensor added = l == 0 ? Tensor() : hidden;
    norm_then_linear(added, L.input_norm, L.qkv_in, L.qkv, L.qkv_bias, plans_.qkv, qkv);
    if (device_.is_cuda()) {
      ops::rope_kv_write(q, k, v, positions, rope, cache, l, attn);  // one kernel, same bytes as the two below
    } else {
      ops::rope(q, k, positions, rope);
      ops::kv_write(cache, l, k, v, attn);
    }
    ops::paged_attention(q, cache, l, attn, scale, attn_heads, plans_.attention);
    run_linear(attn_out, L.o_in, L.o, no_bias, hidden, plans_.o, ws);
    norm_then_linear(hidden, L.post_norm, L.gate_up_in, L.gate_up, no_bias, plans_.gate_up, gate_up);
    if (plans_.down.fused_norm_quant) {  // SiLU·mul hands the down linear its per-token codes
      Tensor codes = Tensor::empty({T, act.size(1)}, code_type, device_);
      Tensor scales = Tensor::empty({T}, ScalarType::f32, device_);
      ops::silu_mul_quantize(gate_up, codes, scales, plans_.down.tuning.pdl);
      ops::linear_quantized(codes, scales, L.down, no_bias, hidden, plans_.down);
    } else if (plans_.down.fused_fmpq_quant) {  // FMPQ: SiLU·mul writes the down linear's block codes
      FmpqActivation a = fmpq_codes(L.down_in, T, act.size(1), ws);
      ops::silu_mul_quantize_fmpq(gate_up, L.down_in.block_bits, L.down_in.perm, a);
      ops::linear_fmpq(a, L.down, no_bias, hidden, plans_.down);
    } else {
      ops::silu_mul(gate_up, act);
      run_linear(act, L.down_in, L.down, no_bias, hidden, plans_.down, ws);
    }
  }
  reduce_add_rms_norm(hidden, residual, final_norm_, eps, normed);
}

void Model::reduce_partial_sums(Tensor& y) const {
  if (shard_.sharded()) comm_->all_reduce_sum(y);
}

bool Model::fused_reduce_norm(Tensor& partial, Tensor& residual, const Tensor& weight, float eps, Tensor& out,
                              Tensor& q, Tensor& scales) const {
  return shard_.sharded() && comm_->all_reduce_add_rms_norm(partial, residual, weight, eps, out, q, scales);
}

void Model::reduce_add_rms_norm(Tensor& partial, Tensor& residual, const Tensor& weight, float eps, Tensor& out) const {
  Tensor no_q, no_scales;
  if (fused_reduce_norm(partial, residual, weight, eps, out, no_q, no_scales)) return;
  reduce_partial_sums(partial);
  ops::add_rms_norm(residual, partial, weight, eps, out);
}

void Model::lm_head_logits(const Tensor& rows, Tensor& logits, ModelWorkspace& ws) const {
  // lm_head always takes float activations (see head_format_ in the constructor).
  if (!shard_.sharded()) {
    ops::linear(rows, lm_head_, Tensor(), logits, plans_.lm_head);
    return;
  }
  // Each rank computes its vocabulary slice into a slot of vocab_stride columns per row; the gather
  // brings every rank's slot, and the slots are laid side by side.
  const int64_t R = rows.size(0), stride = shard_.vocab_stride;
  Tensor mine = ws.logits_shard.slice(0, 0, R * shard_.vocab).view({R, shard_.vocab});
  ops::linear(rows, lm_head_, Tensor(), mine, plans_.lm_head);
  Tensor all = ws.logits_gathered.slice(0, 0, shard_.world * R * stride);
  comm_->all_gather(ws.logits_shard.slice(0, 0, R * stride), all);
  model_detail::place_vocab_slices(all, shard_.world, R, stride, logits);
}

Tensor Model::forward(const ForwardBatch& b, KVCache& cache, ModelWorkspace& ws) const {
  return run_forward(b, cache, ws, nullptr);
}

Tensor Model::forward_sampled(const ForwardBatch& b, const std::vector<RowSampling>& sampling, bool download_logits,
                              KVCache& cache, ModelWorkspace& ws, std::vector<int32_t>& tokens,
                              std::vector<float>& logprobs) const {
  constexpr const char* op = "Model.forward_sampled";
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, !device_.is_cpu(), op, ": sampling on the device needs a CUDA model, ",
                    "this one is on ", device_.str());
  LOWBIT_CHECK(sampling.size() == b.logit_rows.size(), op, ": ", sampling.size(), " sampling entries for ",
               b.logit_rows.size(), " logit rows");
  EagerSampling s{&sampling, download_logits, &tokens, &logprobs};
  return run_forward(b, cache, ws, &s);
}

Tensor Model::run_forward(const ForwardBatch& b, KVCache& cache, ModelWorkspace& ws, const EagerSampling* s) const {
  LOWBIT_CHECK(finalized_, "Model.forward: call finalize() after setting the weights");
  const int64_t T = int64_t(b.token_ids.size());
  const int64_t R = int64_t(b.logit_rows.size());
  LOWBIT_CHECK(T > 0 && T <= ws.max_tokens, "Model.forward: batch has ", T, " tokens, workspace holds 1..",
               ws.max_tokens);
  LOWBIT_CHECK(int64_t(b.positions.size()) == T, "Model.forward: positions has ", b.positions.size(),
               " entries, expected ", T);
  LOWBIT_CHECK(R <= ws.max_logit_rows, "Model.forward: ", R, " logit rows, workspace holds ", ws.max_logit_rows);
  for (int32_t id : b.token_ids)
    LOWBIT_CHECK(id >= 0 && id < cfg_.vocab_size, "Model.forward: token id ", id, " is outside [0, ", cfg_.vocab_size,
                 ")");
  for (int32_t r : b.logit_rows)
    LOWBIT_CHECK(r >= 0 && r < T, "Model.forward: logit row ", r, " is outside [0, ", T, ")");

  if (s && shard_.rank == 0) {  // parameters checked (and uploaded) before any kernel runs
    if (!ws.sampler) ws.sampler = std::make_shared<DeviceSampler>(ws.max_logit_rows, device_);
    ws.sampler->stage(*s->sampling, R, "Model.forward_sampled");
  }
  if (s) s->tokens->clear(), s->logprobs->clear();
  std::copy(b.token_ids.begin(), b.token_ids.end(), ws.ids_host.data<int32_t>());
  std::copy(b.positions.begin(), b.positions.end(), ws.positions_host.data<int32_t>());
  Tensor ids = ws.ids_host.slice(0, 0, T), positions = ws.positions_host.slice(0, 0, T);
  const ops::AttentionMeta* attn = &b.attn;
  Tensor logit_row_ids;  // s32 [R] on the device (GPU: the logit rows are gathered there)
  if (!device_.is_cpu()) {
    model_detail::upload_step(b, ws, ids, positions, logit_row_ids);
    attn = &ws.attn;
  }
  forward_layers(ids, positions, *attn, T, cache, ws);
  const Tensor normed = ws.normed.slice(0, 0, T), no_bias;
  Tensor logits = ws.logits.slice(0, 0, R);
  if (R == 0) return logits;
  Tensor rows = ws.final_rows.slice(0, 0, R);
  if (device_.is_cpu())
    for (int64_t r = 0; r < R; ++r) rows.select(0, r).copy_(normed.select(0, b.logit_rows[size_t(r)]));
  else
    ops::embedding(logit_row_ids, normed, rows);  // a row gather
  Tensor logits_c = ws.logits_compute.slice(0, 0, R);
  lm_head_logits(rows, logits_c, ws);
  if (!device_.is_cpu() && shard_.rank != 0) {
    model_detail::sync_stream("Model.forward");  // only rank 0's logits are read (the engine samples there)
  } else if (s) {
    ws.sampler->sample(logits_c);
    if (!s->download_logits) logits = Tensor();
    else model_detail::download_logits(logits_c, ws.logits_device.slice(0, 0, R), logits);
    ws.sampler->fetch(R, *s->tokens, *s->logprobs, "Model.forward_sampled");  // the step's sync
  } else if (!device_.is_cpu()) {
    model_detail::download_logits(logits_c, ws.logits_device.slice(0, 0, R), logits);  // the step's one sync
  } else if (logits_c.data_ptr() != logits.data_ptr()) {
    Tensor host = device_.is_cpu() ? logits_c : logits_c.to(Device::cpu());
    model_detail::dtype_to_f32_host(host, logits.data<float>());
  }
  return logits;
}

}  // namespace lowbit
