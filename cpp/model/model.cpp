// Model construction and weights: name/shape checks, round-to-nearest quantization per recipe,
// q|k|v and gate|up fusion and packing at finalize().
#include "lowbit/model/model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "model/device_support.h"
#include "model/host_convert.h"

namespace lowbit {
namespace {

using model_detail::concat_rows;
using model_detail::f32_to_dtype_host;
using model_detail::to_f32_host;

// A parsed HF tensor name: layer index (-1 for model-level tensors) and the suffix after it.
struct WeightName {
  int layer = -1;
  std::string suffix;  // e.g. "self_attn.q_proj.weight", or the full name for model-level tensors
};

WeightName parse_name(const std::string& name, int num_layers) {
  static const std::string prefix = "model.layers.";
  WeightName out;
  if (name.compare(0, prefix.size(), prefix) != 0) {
    out.suffix = name;
    return out;
  }
  const size_t dot = name.find('.', prefix.size());
  const std::string index = name.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
  char* end = nullptr;
  const long layer = std::strtol(index.c_str(), &end, 10);
  LOWBIT_CHECK(!index.empty() && *end == '\0' && dot != std::string::npos, "Model.set_weight: cannot parse the layer ",
               "index of '", name, "'");
  LOWBIT_CHECK_KIND(ErrorKind::kIndex, layer >= 0 && layer < num_layers, "Model.set_weight: '", name, "': layer ", layer,
                    " is outside [0, ", num_layers, ")");
  out.layer = int(layer);
  out.suffix = name.substr(dot + 1);
  return out;
}

bool is_linear_suffix(const std::string& s) {
  return s == "self_attn.q_proj.weight" || s == "self_attn.k_proj.weight" || s == "self_attn.v_proj.weight" ||
         s == "self_attn.o_proj.weight" || s == "mlp.gate_proj.weight" || s == "mlp.up_proj.weight" ||
         s == "mlp.down_proj.weight";
}

std::string layer_name(int layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

int64_t packed_bytes(const PackedWeight& w) {
  int64_t b = 0;
  for (const Tensor* t : {&w.data, &w.scales, &w.zeros, &w.channel_scales, &w.mins, &w.aux})
    if (t->defined()) b += t->nbytes();
  return b;
}

QuantizedWeight fuse(const std::vector<const QuantizedWeight*>& parts, const char* what) {
  const QuantizedWeight& first = *parts[0];
  QuantizedWeight out;
  out.format = first.format;
  out.k = first.k;
  out.group = first.group;
  out.symmetric = first.symmetric;
  std::vector<Tensor> q, s, z, c, mn;
  for (const QuantizedWeight* p : parts) {
    LOWBIT_CHECK(p->format == first.format && p->group == first.group && p->symmetric == first.symmetric &&
                     p->k == first.k && p->mins.defined() == first.mins.defined(),
                 "Model.finalize: cannot fuse ", what, ": parts differ in format/group/symmetry/k (", name_of(p->format),
                 " g", p->group, " k", p->k, " vs ", name_of(first.format), " g", first.group, " k", first.k, ")");
    out.n += p->n;
    q.push_back(p->q);
    s.push_back(p->scales);
    z.push_back(p->zeros);
    c.push_back(p->channel_scales);
    mn.push_back(p->mins);
  }
  out.q = concat_rows(q, what);
  out.scales = concat_rows(s, what);
  out.zeros = concat_rows(z, what);
  out.channel_scales = concat_rows(c, what);
  out.mins = concat_rows(mn, what);
  return out;
}

// perm / block map equality for linears that share one input (both undefined counts as equal).
bool same_host_tensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), size_t(a.nbytes())) == 0);
}

}  // namespace

Model::Model(const ModelConfig& config, const std::string& recipe, const std::string& device, const std::string& dtype)
    : cfg_(config), recipe_(parse_recipe(recipe)), device_(Device::parse(device)),
      dtype_(scalar_type_from_name(dtype)) {
  cfg_.validate();
  local_ = cfg_;
  shard_ = ShardLayout::make(cfg_, 0, 1);
  LOWBIT_CHECK_TYPE(dtype_ == ScalarType::f32 || dtype_ == ScalarType::f16 || dtype_ == ScalarType::bf16,
                    "Model: argument 'dtype' must be f32, f16 or bf16, got ", dtype);
  require_device(device_, "Model");
  model_detail::check_device_recipe(recipe_, dtype_, device_, cfg_);  // no GPU kernel: fail at load, never fall back
  const WeightFormat float_format = dtype_ == ScalarType::f32   ? WeightFormat::f32
                                    : dtype_ == ScalarType::f16 ? WeightFormat::f16
                                                                : WeightFormat::bf16;
  weight_format_ = recipe_.weight_bits == 16 ? float_format : recipe_.weight;
  // lm_head keeps float activations and, under activation-quantized recipes, 16-bit float weights, as QServe
  // and TurboMind keep it in FP16: the logits see no activation rounding (on SmolLM2 under W8A8 that is worth
  // ~1% perplexity). f16 rather than f32 under f32 compute halves the bytes streamed per token.
  head_format_ = recipe_.activation == ActivationMode::float16 ? weight_format_
                 : dtype_ == ScalarType::bf16                 ? WeightFormat::bf16
                                                              : WeightFormat::f16;
  pack_target_ = device_.is_cpu() ? PackTarget::cpu : PackTarget::sm80;
  k_cache_type();
  v_cache_type();
}

static ScalarType kv_type_for(KVBits bits, ScalarType compute, const char* which) {
  switch (bits) {
    case KVBits::kv16: return compute;
    case KVBits::kv8: return ScalarType::u8;
    case KVBits::kv4: return ScalarType::u4;
    case KVBits::kv2: return ScalarType::u2;  // the GPU at head_dim 64 and 128 (device_support.cpp)
  }
  LOWBIT_CHECK(false, "Model: bad ", which, " cache bits ", static_cast<int>(bits));
}
ScalarType Model::k_cache_type() const { return kv_type_for(recipe_.k_bits, dtype_, "K"); }
ScalarType Model::v_cache_type() const { return kv_type_for(recipe_.v_bits, dtype_, "V"); }

KVCacheConfig Model::kv_cache_config(int64_t num_blocks, int block_size) const {
  KVCacheConfig c;
  c.num_layers = cfg_.num_layers;
  c.num_kv_heads = local_.num_kv_heads;  // this rank's KV heads
  c.head_dim = cfg_.head_dim;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.k_type = k_cache_type();
  c.v_type = v_cache_type();
  c.k_per_channel = recipe_.k_per_channel;
  LOWBIT_CHECK(!c.k_per_channel || block_size == recipe_.k_group, "Model.kv_cache_config: per-channel K (recipe '",
               recipe_.text, "') needs block_size = its K group ", recipe_.k_group, ", got ", block_size);
  c.device = device_;
  return c;
}

int Model::kv_block_size(int requested) const { return recipe_.k_per_channel ? recipe_.k_group : requested; }

int64_t Model::kv_bytes_per_token() const { return KVCache::bytes_per_token(kv_cache_config(1, kv_block_size(1))); }

void Model::check_not_finalized(const char* op) const {
  LOWBIT_CHECK(!finalized_, op, ": the model is already finalized");
}

// Expected shape of every accepted name; an empty shape means "not a weight of this model".
static Shape expected_shape(const ModelConfig& c, const WeightName& w) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  if (w.layer < 0) {
    if (w.suffix == "model.embed_tokens.weight" || w.suffix == "lm_head.weight") return {V, H};
    if (w.suffix == "model.norm.weight") return {H};
    return {};
  }
  const std::string& s = w.suffix;
  if (s == "input_layernorm.weight" || s == "post_attention_layernorm.weight") return {H};
  if (s == "self_attn.q_proj.weight") return {c.q_size(), H};
  if (s == "self_attn.k_proj.weight" || s == "self_attn.v_proj.weight") return {c.kv_size(), H};
  if (s == "self_attn.o_proj.weight") return {H, c.q_size()};
  if (s == "mlp.gate_proj.weight" || s == "mlp.up_proj.weight") return {I, H};
  if (s == "mlp.down_proj.weight") return {H, I};
  if (c.attention_bias) {
    if (s == "self_attn.q_proj.bias") return {c.q_size()};
    if (s == "self_attn.k_proj.bias" || s == "self_attn.v_proj.bias") return {c.kv_size()};
  }
  return {};
}

void Model::set_weight(const std::string& name, const Tensor& tensor) {
  check_not_finalized("Model.set_weight");
  const WeightName w = parse_name(name, cfg_.num_layers);
  const Shape expected = expected_shape(cfg_, w);
  LOWBIT_CHECK(!expected.empty(), "Model.set_weight: unknown weight name '", name, "' for arch ", cfg_.arch,
               " (expected HF names such as model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight,",
               " model.norm.weight", cfg_.attention_bias ? ", model.layers.0.self_attn.q_proj.bias" : "", ")");
  LOWBIT_CHECK(tensor.defined() && tensor.shape() == expected, "Model.set_weight: '", name, "' expects shape ",
               shape_str(expected), ", got ", tensor.defined() ? shape_str(tensor.shape()) : std::string("undefined"));
  Tensor f32 = to_f32_host(tensor, name);
  const ShardCut cut = shard_cut(shard_, cfg_, w.suffix);
  if (is_linear_suffix(w.suffix) || w.suffix == "lm_head.weight") {
    const WeightFormat f = w.suffix == "lm_head.weight" ? head_format_ : weight_format_;
    // Rows quantize independently, so a row shard is cut first; an input-channel shard is cut after
    // quantizing the whole row, whose per-channel scale spans every rank's share.
    if (cut.kind == ShardKind::rows) f32 = shard_float(f32, cut);
    QuantizedWeight q = quantize_weight(f32, f, group_for(f), false);
    stage_linear(name, cut.kind == ShardKind::cols ? shard_quantized(q, cut, name) : std::move(q));
  } else {
    staged_float_[name] = shard_float(f32, cut);  // q/k/v biases are cut with their rows; norms stay whole
  }
}

void Model::set_quantized_weight(const std::string& name, const QuantizedWeight& weight) {
  check_not_finalized("Model.set_quantized_weight");
  const WeightName w = parse_name(name, cfg_.num_layers);
  LOWBIT_CHECK(is_linear_suffix(w.suffix) || w.suffix == "lm_head.weight", "Model.set_quantized_weight: '", name,
               "' is not a linear weight (only *_proj.weight and lm_head.weight are quantized)");
  const Shape expected = expected_shape(cfg_, w);
  LOWBIT_CHECK(weight.n == expected[0] && weight.k == expected[1], "Model.set_quantized_weight: '", name,
               "' expects shape ", shape_str(expected), ", got [", weight.n, ", ", weight.k, "]");
  const WeightFormat want = w.suffix == "lm_head.weight" ? head_format_ : weight_format_;
  LOWBIT_CHECK(weight.format == want, "Model.set_quantized_weight: '", name, "' has format ", name_of(weight.format),
               " but recipe ", recipe_.text, " uses ", name_of(want),
               w.suffix == "lm_head.weight" && want != weight_format_
                   ? " for lm_head (activation-quantized recipes keep lm_head in float: pass it to set_weight)"
                   : "");
  stage_linear(name, shard_quantized(weight, shard_cut(shard_, cfg_, w.suffix), name));
}

void Model::set_tensor_parallel(std::shared_ptr<Communicator> comm) {
  constexpr const char* op = "Model.set_tensor_parallel";
  check_not_finalized(op);
  LOWBIT_CHECK(comm != nullptr, op, ": argument 'comm' is null");
  LOWBIT_CHECK(staged_linear_.empty() && staged_float_.empty() && staged_perm_.empty() && staged_block_bits_.empty(),
               op, ": call it before any weight is given");
  shard_ = ShardLayout::make(cfg_, comm->rank(), comm->world_size());
  local_ = shard_.local(cfg_);
  comm_ = std::move(comm);
}

void Model::set_head_format(const std::string& format) {
  constexpr const char* op = "Model.set_head_format";
  check_not_finalized(op);
  LOWBIT_CHECK(!staged_linear_.count("lm_head.weight"), op, ": call it before lm_head.weight is given");
  const WeightFormat f = weight_format_from_name(format);
  LOWBIT_CHECK(f == WeightFormat::f32 || f == WeightFormat::f16 || f == WeightFormat::bf16 || f == WeightFormat::w8 ||
                   f == WeightFormat::w4,
               op, ": lm_head takes f32, f16, bf16, w8 or w4 weights, got '", format, "'");
  LOWBIT_CHECK(recipe_.activation == ActivationMode::float16 || !(f == WeightFormat::w8 || f == WeightFormat::w4), op,
               ": recipe ", recipe_.text, " quantizes activations, and lm_head takes float activations: give it a "
               "float format (f16, bf16, f32), got '", format, "'");
  head_format_ = f;
}

int Model::group_for(WeightFormat f) const {
  if (is_group_wise(f)) return recipe_.group > 0 ? recipe_.group : 128;
  // w8 is per channel unless the recipe groups it (w8a16g32); a w8 lm_head under a w4 recipe stays per channel
  return f == WeightFormat::w8 && weight_format_ == WeightFormat::w8 ? recipe_.group : 0;
}

void Model::stage_linear(const std::string& name, QuantizedWeight w) { staged_linear_[name] = std::move(w); }

void Model::set_input_permutation(const std::string& name, const Tensor& perm) {
  constexpr const char* op = "Model.set_input_permutation";
  check_not_finalized(op);
  const WeightName w = parse_name(name, cfg_.num_layers);
  LOWBIT_CHECK(w.layer >= 0 && is_linear_suffix(w.suffix), op, ": '", name,
               "' is not a decoder linear weight (model.layers.{i}.*_proj.weight)");
  const int64_t k = expected_shape(cfg_, w)[1];
  check_defined(perm, op, "perm");
  LOWBIT_CHECK_TYPE(perm.dtype() == ScalarType::s32 || perm.dtype() == ScalarType::s64, op,
                    ": argument 'perm' must be s32 or s64, got ", name_of(perm.dtype()));
  check_shape(perm, {k}, op, "perm");
  check_device(perm, Device::cpu(), op, "perm");
  Tensor p = Tensor::empty({k}, ScalarType::s32);
  std::vector<char> seen(size_t(k), 0);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t v = perm.dtype() == ScalarType::s32 ? int64_t(perm.data<int32_t>()[j * perm.stride(0)])
                                                      : perm.data<int64_t>()[j * perm.stride(0)];
    LOWBIT_CHECK(v >= 0 && v < k && !seen[size_t(v)], op, ": argument 'perm' of '", name,
                 "' must be a permutation of 0..", k - 1, "; entry ", j, " is ", v,
                 v >= 0 && v < k ? " (repeated)" : " (out of range)");
    seen[size_t(v)] = 1;
    p.data<int32_t>()[j] = int32_t(v);
  }
  const ShardCut cut = shard_cut(shard_, cfg_, w.suffix);
  if (cut.kind == ShardKind::cols) {
    // A row-parallel shard sees only its own input channels: its permutation must stay inside them.
    Tensor local = Tensor::empty({cut.end - cut.begin}, ScalarType::s32);
    for (int64_t j = cut.begin; j < cut.end; ++j) {
      const int32_t v = p.data<int32_t>()[j];
      if (v < cut.begin || v >= cut.end)
        LOWBIT_NOT_SUPPORTED(op, ": '", name, "' permutes input channel ", v, " to position ", j, ", across the ",
                             "tensor-parallel shards of its input (rank ", shard_.rank, " holds [", cut.begin, ", ",
                             cut.end, ")); run this checkpoint without tensor parallelism");
      local.data<int32_t>()[j - cut.begin] = v - int32_t(cut.begin);
    }
    p = local;
  }
  staged_perm_[name] = p;
  has_input_transforms_ = true;
}

void Model::set_fmpq_block_bits(const std::string& name, const Tensor& block_bits) {
  constexpr const char* op = "Model.set_fmpq_block_bits";
  check_not_finalized(op);
  LOWBIT_CHECK(recipe_.activation == ActivationMode::fmpq_mixed, op, ": recipe ", recipe_.text,
               " has no FMPQ (a4) activations, so '", name, "' takes no block map");
  const WeightName w = parse_name(name, cfg_.num_layers);
  LOWBIT_CHECK(w.layer >= 0 && is_linear_suffix(w.suffix), op, ": '", name,
               "' is not a decoder linear weight (model.layers.{i}.*_proj.weight)");
  const int64_t k = expected_shape(cfg_, w)[1], blocks = (k + kFmpqBlock - 1) / kFmpqBlock;
  check_defined(block_bits, op, "block_bits");
  check_dtype(block_bits, ScalarType::u8, op, "block_bits");
  check_shape(block_bits, {blocks}, op, "block_bits");
  check_device(block_bits, Device::cpu(), op, "block_bits");
  Tensor b = block_bits.contiguous().clone();
  for (int64_t j = 0; j < blocks; ++j) {
    const int v = b.data<uint8_t>()[j];
    LOWBIT_CHECK(v == 4 || v == 8, op, ": argument 'block_bits' of '", name, "' must hold 4 or 8 per block, got ", v,
                 " for block ", j);
  }
  const ShardCut cut = shard_cut(shard_, cfg_, w.suffix);
  if (cut.kind == ShardKind::cols) {
    LOWBIT_CHECK(cut.begin % kFmpqBlock == 0 && (cut.end % kFmpqBlock == 0 || cut.end == k), op, ": '", name,
                 "': the tensor-parallel shard [", cut.begin, ", ", cut.end, ") of its input splits a ", kFmpqBlock,
                 "-channel FMPQ block; use fewer ranks");
    b = b.slice(0, cut.begin / kFmpqBlock, (cut.end + kFmpqBlock - 1) / kFmpqBlock).clone();
  }
  staged_block_bits_[name] = b;
  has_input_transforms_ = true;
}

Model::LinearInput Model::shared_input(int l, const std::vector<const char*>& suffixes, const char* what) const {
  auto staged = [](const std::map<std::string, Tensor>& m, const std::string& n) {
    auto it = m.find(n);
    return it == m.end() ? Tensor() : it->second;
  };
  const std::string first = layer_name(l, suffixes[0]);
  LinearInput in{staged(staged_perm_, first), staged(staged_block_bits_, first)};
  for (size_t i = 1; i < suffixes.size(); ++i) {
    const std::string n = layer_name(l, suffixes[i]);
    LOWBIT_CHECK(same_host_tensor(staged(staged_perm_, n), in.perm), "Model.finalize: ", what,
                 " read one input, so their input permutations must be equal; '", n, "' differs from '", first, "'");
    LOWBIT_CHECK(same_host_tensor(staged(staged_block_bits_, n), in.block_bits), "Model.finalize: ", what,
                 " read one input, so their FMPQ block maps must be equal; '", n, "' differs from '", first, "'");
  }
  if (in.perm.defined() && !device_.is_cpu()) in.perm = in.perm.to(device_);  // the gather reads it there
  return in;
}

Tensor Model::to_compute(const Tensor& host_f32) const {
  Tensor t = f32_to_dtype_host(host_f32, dtype_);
  return device_.is_cpu() ? t : t.to(device_);
}

PackedWeight Model::pack(const QuantizedWeight& w) const {
  return device_.is_cpu() ? pack_weight(w, pack_target_, device_) : model_detail::pack_for_device(w, device_);
}

void Model::finalize() {
  check_not_finalized("Model.finalize");
  // Every name the config asks for, in a stable order, so the error lists all of them at once.
  std::vector<std::string> missing;
  auto need_linear = [&](const std::string& n) {
    if (!staged_linear_.count(n)) missing.push_back(n);
  };
  auto need_float = [&](const std::string& n) {
    if (!staged_float_.count(n)) missing.push_back(n);
  };
  need_float("model.embed_tokens.weight");
  for (int l = 0; l < cfg_.num_layers; ++l) {
    need_float(layer_name(l, "input_layernorm.weight"));
    need_float(layer_name(l, "post_attention_layernorm.weight"));
    for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight"})
      need_linear(layer_name(l, s));
    if (cfg_.attention_bias)
      for (const char* s : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"})
        need_float(layer_name(l, s));
  }
  need_float("model.norm.weight");
  if (!cfg_.tie_word_embeddings) need_linear("lm_head.weight");
  if (!missing.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
    LOWBIT_FAIL(ErrorKind::kValue, "Model.finalize: ", missing.size(), " weight(s) missing: ", os.str());
  }

  parameter_bytes_.clear();
  layers_.resize(size_t(cfg_.num_layers));
  for (int l = 0; l < cfg_.num_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    auto lin = [&](const char* s) -> const QuantizedWeight& { return staged_linear_.at(layer_name(l, s)); };
    L.qkv = pack(fuse({&lin("self_attn.q_proj.weight"), &lin("self_attn.k_proj.weight"), &lin("self_attn.v_proj.weight")},
                      "q/k/v"));
    L.o = pack(lin("self_attn.o_proj.weight"));
    L.gate_up = pack(fuse({&lin("mlp.gate_proj.weight"), &lin("mlp.up_proj.weight")}, "gate/up"));
    L.down = pack(lin("mlp.down_proj.weight"));
    L.qkv_in = shared_input(l, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
                            "q/k/v");
    L.o_in = shared_input(l, {"self_attn.o_proj.weight"}, "o_proj");
    L.gate_up_in = shared_input(l, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, "gate/up");
    L.down_in = shared_input(l, {"mlp.down_proj.weight"}, "down_proj");
    if (recipe_.activation == ActivationMode::fmpq_mixed && !staged_block_bits_.empty())
      for (const LinearInput* in : {&L.qkv_in, &L.o_in, &L.gate_up_in, &L.down_in})
        LOWBIT_CHECK(in->block_bits.defined(), "Model.finalize: layer ", l, ": FMPQ block maps were set for some ",
                     "linears but not all (call set_fmpq_block_bits for every *_proj.weight)");
    L.input_norm = to_compute(staged_float_.at(layer_name(l, "input_layernorm.weight")));
    L.post_norm = to_compute(staged_float_.at(layer_name(l, "post_attention_layernorm.weight")));
    if (cfg_.attention_bias) {
      Tensor b = concat_rows({staged_float_.at(layer_name(l, "self_attn.q_proj.bias")),
                              staged_float_.at(layer_name(l, "self_attn.k_proj.bias")),
                              staged_float_.at(layer_name(l, "self_attn.v_proj.bias"))},
                             "q/k/v bias");
      L.qkv_bias = to_compute(b);
      parameter_bytes_["attention"] += L.qkv_bias.nbytes();
    }
    parameter_bytes_["attention"] += packed_bytes(L.qkv) + packed_bytes(L.o);
    parameter_bytes_["mlp"] += packed_bytes(L.gate_up) + packed_bytes(L.down);
    parameter_bytes_["norms"] += L.input_norm.nbytes() + L.post_norm.nbytes();
  }
  const Tensor& embed = staged_float_.at("model.embed_tokens.weight");
  embed_table_ = to_compute(embed);
  final_norm_ = to_compute(staged_float_.at("model.norm.weight"));
  auto head = staged_linear_.find("lm_head.weight");
  lm_head_ = head != staged_linear_.end()
                 ? pack(head->second)
                 : pack(quantize_weight(shard_float(embed, shard_cut(shard_, cfg_, "lm_head.weight")), head_format_,
                                        group_for(head_format_), false));
  parameter_bytes_["embedding"] = embed_table_.nbytes();
  parameter_bytes_["norms"] += final_norm_.nbytes();
  parameter_bytes_["lm_head"] = packed_bytes(lm_head_);
  staged_linear_.clear();
  staged_float_.clear();
  staged_perm_.clear();
  staged_block_bits_.clear();
  resolve_plans();
  finalized_ = true;
}

Model::Info Model::info() const {
  Info i;
  i.recipe = recipe_.text;
  i.dtype = name_of(dtype_);
  i.device = device_.str();
  i.parameter_bytes = parameter_bytes_;
  i.kv_bytes_per_token = kv_bytes_per_token();
  // The kernels the plan runs, one line per role: "linear.qkv: gemm_w4a16_sm80 (m1, m2-4, m5-16, m17-127),
  // gemm_w4a16_large_sm80 (m128+)", "attention.decode: decode_attention_sm80".
  std::vector<std::pair<std::string, std::vector<std::string>>> roles;  // role -> "kernel (buckets)"
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> by_role;  // role -> (kernel, bucket)
  for (const kernels::PlanLine& line : plan_lines_) {
    const std::string role = line.role.substr(0, line.role.find(' '));
    const std::string bucket = line.role.size() > role.size() ? line.role.substr(role.size() + 1) : "";
    if (!by_role.count(role)) roles.push_back({role, {}});
    by_role[role].push_back({line.kernel + (line.fallback ? " [slow fallback]" : ""), bucket});
  }
  for (const auto& [role, unused] : roles) {
    std::string text = role + ": ";
    std::vector<std::pair<std::string, std::string>> entries = by_role[role];
    std::vector<std::string> done;
    for (const auto& [kernel, bucket] : entries) {
      if (std::find(done.begin(), done.end(), kernel) != done.end()) continue;
      done.push_back(kernel);
      std::string buckets;
      for (const auto& [k2, b2] : entries)
        if (k2 == kernel && !b2.empty()) buckets += (buckets.empty() ? "" : ", ") + b2;
      text += (done.size() > 1 ? "; " : "") + kernel + (buckets.empty() || entries.size() == 1 ? "" : " (" + buckets + ")");
    }
    i.kernels.push_back(text);
  }
  return i;
}

}  // namespace lowbit
