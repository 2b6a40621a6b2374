// Model::forward against the float64 reference in test_model_reference.h: single and mixed
// prefill/decode batches, quantized weight formats, KV types, compute dtypes, bias/untied heads,
// and the errors of set_weight/finalize.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_model_reference.h"

namespace lowbit {
namespace {

using namespace testing_ref;

// Drives Model::forward directly: owns a KV cache + allocator and runs chunks of sequences.
struct Harness {
  const Model& model;
  BlockAllocator alloc;
  KVCache cache;
  ModelWorkspace ws;
  Harness(const Model& m, int64_t blocks = 64, int block_size = 16)
      : model(m), alloc(blocks, block_size), cache(m.kv_cache_config(blocks, block_size)), ws(m.make_workspace(128, 128)) {}

  struct Chunk {
    SeqId seq;
    std::vector<int32_t> tokens;  // the new tokens
  };
  // Returns f32 logits [total new tokens, vocab] (every row), in chunk order.
  std::vector<float> run(const std::vector<Chunk>& chunks) {
    ForwardBatch b;
    int64_t width = 1;
    std::vector<int32_t> slots;
    for (const Chunk& c : chunks) {
      const int64_t start = alloc.num_tokens(c.seq);
      EXPECT_TRUE(alloc.append_tokens(c.seq, int64_t(c.tokens.size())));
      b.attn.q_start.push_back(int32_t(b.token_ids.size()));
      b.attn.q_len.push_back(int32_t(c.tokens.size()));
      b.attn.kv_len.push_back(int32_t(start + int64_t(c.tokens.size())));
      for (size_t j = 0; j < c.tokens.size(); ++j) {
        b.logit_rows.push_back(int32_t(b.token_ids.size()));
        b.token_ids.push_back(c.tokens[j]);
        b.positions.push_back(int32_t(start + int64_t(j)));
        slots.push_back(int32_t(alloc.slot_of(c.seq, start + int64_t(j))));
      }
      width = std::max<int64_t>(width, int64_t(alloc.block_table(c.seq).size()));
      b.attn.max_q_len = std::max<int32_t>(b.attn.max_q_len, int32_t(c.tokens.size()));
      b.attn.max_kv_len = std::max(b.attn.max_kv_len, b.attn.kv_len.back());
    }
    b.attn.block_tables = Tensor::empty({int64_t(chunks.size()), width}, ScalarType::s32);
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& t = alloc.block_table(chunks[i].seq);
      for (int64_t j = 0; j < width; ++j)
        b.attn.block_tables.data<int32_t>()[int64_t(i) * width + j] = j < int64_t(t.size()) ? t[size_t(j)] : -1;
    }
    b.attn.slot_mapping = Tensor::empty({int64_t(slots.size())}, ScalarType::s32);
    std::memcpy(b.attn.slot_mapping.data_ptr(), slots.data(), slots.size() * 4);
    ws.logits.fill_bytes_(0xFF);  // NaN poison: every returned row must be written
    const Tensor lg = model.forward(b, cache, ws);
    EXPECT_EQ(lg.size(0), int64_t(b.logit_rows.size()));
    return std::vector<float>(lg.data<float>(), lg.data<float>() + lg.numel());
  }
};

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

// max |got - ref| / max |ref| over rows [row0, row0 + rows) of ref (got holds exactly those rows).
double rel_err(const std::vector<float>& got, size_t got_off, const std::vector<double>& ref, size_t ref_off,
               size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[got_off + i];
    if (!std::isfinite(g)) return INFINITY;
    num = std::max(num, std::abs(g - ref[ref_off + i]));
    den = std::max(den, std::abs(ref[ref_off + i]));
  }
  return num / den;
}

// f32 compute with f32 weights: only f32 rounding separates kernel and reference (a few ulps
// accumulated over K <= 96 sums and two layers; observed ~3e-7), so 1e-5 of the logit range.
TEST(ModelForward, PrefillMatchesReferenceF32) {
  const ModelConfig c = tiny_config();
  const Weights w = random_weights(c, 1);
  Model m(c, "w16a16", "cpu", "f32");
  load(m, w);
  Harness h(m);
  for (int T : {1, 5, 16, 37}) {
    const auto tokens = random_tokens(T, int(c.vocab_size), uint32_t(T));
    const SeqId s = h.alloc.create_sequence();
    const auto got = h.run({{s, tokens}});
    const auto ref = reference_logits(c, w, tokens);
    EXPECT_LT(rel_err(got, 0, ref, 0, ref.size()), 1e-5) << "T=" << T;
    h.alloc.free_sequence(s);
  }
}

// One batch mixing a decode, a chunked-prefill continuation and a fresh prefill.
TEST(ModelForward, MixedBatchMatchesReference) {
  const ModelConfig c = tiny_config();
  const Weights w = random_weights(c, 2);
  Model m(c, "w16a16");
  load(m, w);
  Harness h(m, 64, 4);  // small blocks: sequences span several, non-contiguous blocks
  const auto a = random_tokens(9, int(c.vocab_size), 10), b = random_tokens(13, int(c.vocab_size), 11),
             d = random_tokens(6, int(c.vocab_size), 12);
  const SeqId sa = h.alloc.create_sequence(), sb = h.alloc.create_sequence(), sd = h.alloc.create_sequence();
  const int64_t V = c.vocab_size;
  h.run({{sa, {a.begin(), a.end() - 1}}, {sb, {b.begin(), b.begin() + 5}}});
  const auto got = h.run({{sa, {a.back()}}, {sd, d}, {sb, {b.begin() + 5, b.end()}}});
  const auto ra = reference_logits(c, w, a), rb = reference_logits(c, w, b), rd = reference_logits(c, w, d);
  EXPECT_LT(rel_err(got, 0, ra, size_t((a.size() - 1) * V), size_t(V)), 1e-5);
  EXPECT_LT(rel_err(got, size_t(V), rd, 0, d.size() * size_t(V)), 1e-5);
  EXPECT_LT(rel_err(got, size_t((1 + d.size()) * V), rb, size_t(5 * V), size_t(8 * V)), 1e-5);
}

struct FormatCase {
  const char* recipe;
  WeightFormat format;
  int group;
  int k_bits, v_bits;
  double tol;
  bool act_int8 = false;
};

// Quantized weights: the reference uses the same round-to-nearest weights dequantized, so only
// f32 accumulation order differs (1e-5, as for f32). Quantized KV: the reference applies the same
// per-token asymmetric round trip in float64, so codes agree except where a value sits on a
// rounding boundary (none for these seeds; observed error ~2e-7); 1e-4 leaves room for f32 scale
// arithmetic. a8: activations quantized per token to int8 in both (int32 accumulation is exact in
// the kernel), so again only boundary rounding can differ. Each case also checks that skipping the quantization would miss by >10x the tolerance.
TEST(ModelForward, QuantizedRecipesMatchReference) {
  const ModelConfig c = tiny_config();
  const Weights w = random_weights(c, 3);
  const auto tokens = random_tokens(29, int(c.vocab_size), 5);
  for (const FormatCase& fc : {FormatCase{"w8a16", WeightFormat::w8, 0, 16, 16, 1e-5},
                               FormatCase{"w4a16g32", WeightFormat::w4, 32, 16, 16, 1e-5},
                               FormatCase{"w4a16g64", WeightFormat::w4, 64, 16, 16, 1e-5},  // K=96: short tail group
                               FormatCase{"w16a16kv8", WeightFormat::f32, 0, 8, 8, 1e-4},
                               FormatCase{"w16a16k8v4", WeightFormat::f32, 0, 8, 4, 1e-4},
                               FormatCase{"w16a16kv4", WeightFormat::f32, 0, 4, 4, 1e-4},
                               FormatCase{"w8a8", WeightFormat::w8, 0, 16, 16, 1e-4, true},
                               FormatCase{"w4a8", WeightFormat::qoq, 128, 16, 16, 1e-4, true}}) {
    SCOPED_TRACE(fc.recipe);
    Model m(c, fc.recipe);
    load(m, w);
    Harness h(m);
    const SeqId s = h.alloc.create_sequence();
    const auto got = h.run({{s, tokens}});
    const Weights ew = effective_weights(c, w, fc.format, fc.group, /*quantize_head=*/!fc.act_int8);
    const auto ref = reference_logits(c, ew, tokens, fc.k_bits, fc.v_bits, fc.act_int8);
    EXPECT_LT(rel_err(got, 0, ref, 0, ref.size()), fc.tol);
    const auto unquantized = reference_logits(c, w, tokens);
    const std::vector<float> unq(unquantized.begin(), unquantized.end());
    EXPECT_GT(rel_err(unq, 0, ref, 0, ref.size()), 10 * fc.tol);
  }
}

// Half-precision compute: activations rounded to 11 (f16) / 8 (bf16) significant bits at every op
// boundary; over two layers the logit error stays within ~6 units of 2^-11 (f16: 3e-3) resp.
// 2^-8 (bf16: 2e-2) of the range (observed 6e-4 and 4e-3).
TEST(ModelForward, HalfComputeDtypes) {
  const ModelConfig c = tiny_config();
  const Weights w = random_weights(c, 4);
  const auto tokens = random_tokens(19, int(c.vocab_size), 6);
  for (auto [dtype, fmt, tol] : {std::tuple{"f16", WeightFormat::f16, 3e-3}, std::tuple{"bf16", WeightFormat::bf16, 2e-2}}) {
    SCOPED_TRACE(dtype);
    Model m(c, "w16a16", "cpu", dtype);
    load(m, w);
    Harness h(m);
    const SeqId s = h.alloc.create_sequence();
    const auto got = h.run({{s, tokens}});
    const auto ref = reference_logits(c, effective_weights(c, w, fmt, 0), tokens);
    EXPECT_LT(rel_err(got, 0, ref, 0, ref.size()), tol);
  }
}

// qwen2-style: q/k/v biases; untied lm_head; interleaved heads ratio 4:1.
TEST(ModelForward, BiasAndUntiedHead) {
  ModelConfig c = tiny_config();
  c.arch = "qwen2";
  c.attention_bias = true;
  c.tie_word_embeddings = false;
  c.num_kv_heads = 1;
  const Weights w = random_weights(c, 7);
  Model m(c, "w16a16");
  load(m, w);
  Harness h(m);
  const auto tokens = random_tokens(11, int(c.vocab_size), 8);
  const SeqId s = h.alloc.create_sequence();
  const auto got = h.run({{s, tokens}});
  const auto ref = reference_logits(c, w, tokens);
  EXPECT_LT(rel_err(got, 0, ref, 0, ref.size()), 1e-5);
}

template <typename F>
void expect_error(F&& f, ErrorKind kind, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(ModelErrors, BadWeightsAndConfigs) {
  const ModelConfig c = tiny_config();
  Model m(c, "w16a16");
  expect_error([&] { m.set_weight("model.layers.0.self_attn.q_proj.weight", Tensor::zeros({64, 65}, ScalarType::f32)); },
               ErrorKind::kValue, {"q_proj", "[64, 64]", "[64, 65]"});
  expect_error([&] { m.set_weight("model.layers.0.self_attn.qq.weight", Tensor::zeros({64}, ScalarType::f32)); },
               ErrorKind::kValue, {"unknown weight name", "qq"});
  expect_error([&] { m.set_weight("model.layers.7.input_layernorm.weight", Tensor::zeros({64}, ScalarType::f32)); },
               ErrorKind::kIndex, {"layer 7"});
  expect_error([&] { m.set_weight("model.norm.weight", Tensor::zeros({64}, ScalarType::s32)); }, ErrorKind::kType,
               {"model.norm.weight", "s32"});
  m.set_weight("model.norm.weight", Tensor::zeros({64}, ScalarType::f32));
  expect_error([&] { m.finalize(); }, ErrorKind::kValue,
               {"missing", "model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight"});
  ModelConfig bad = c;
  bad.num_kv_heads = 3;
  expect_error([&] { Model x(bad, "w16a16"); }, ErrorKind::kValue, {"num_kv_heads"});
  // kv2 and per-channel K run on the CPU; Model.kv_cache_config holds the per-channel K block to its group.
  EXPECT_EQ(Model(c, "w16a16kv2").kv_cache_config(4, 16).k_type, ScalarType::u2);
  Model kc(c, "w16a16kc4g32v2");
  EXPECT_EQ(kc.kv_block_size(16), 32);
  EXPECT_TRUE(kc.kv_cache_config(4, 32).k_per_channel);
  expect_error([&] { kc.kv_cache_config(4, 16); }, ErrorKind::kValue, {"needs block_size = its K group 32"});
  expect_error([&] { Model x(c, "w16a16", "cpu", "s8"); }, ErrorKind::kType, {"dtype"});
  Model unfinished(c, "w16a16");
  Harness h(unfinished);
  ForwardBatch b;
  b.token_ids = {1};
  b.positions = {0};
  expect_error([&] { unfinished.forward(b, h.cache, h.ws); }, ErrorKind::kValue, {"finalize"});
}

}  // namespace
}  // namespace lowbit
