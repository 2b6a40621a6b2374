// Embedding lowbit from C++ without Python: build a small random Llama model through the public
// API, serve three requests with continuous batching, print the generated tokens.
//
// A real program fills the weights from its own checkpoint reader (safetensors, GGUF, ...):
// Model::set_weight takes any f32/f16/bf16 lowbit::Tensor (wrap existing memory with DLPack or copy
// into Tensor::empty) under its Hugging Face name.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "lowbit/engine/engine.h"
#include "lowbit/model/model.h"

namespace {

lowbit::Tensor random_tensor(const lowbit::Shape& shape, std::mt19937& rng, float lo, float hi) {
  lowbit::Tensor t = lowbit::Tensor::empty(shape, lowbit::ScalarType::f32);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

}  // namespace

int main() {
  lowbit::ModelConfig cfg;
  cfg.arch = "llama";
  cfg.vocab_size = 128;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128;
  cfg.num_layers = 2;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 16;
  cfg.tie_word_embeddings = true;
  cfg.max_position_embeddings = 512;

  try {
    // 4-bit weights (groups of 32), 16-bit activations, 8-bit KV cache, f32 compute on the CPU.
    lowbit::Model model(cfg, "w4a16g32kv8", "cpu", "f32");
    std::mt19937 rng(0);
    const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
    model.set_weight("model.embed_tokens.weight", random_tensor({cfg.vocab_size, H}, rng, -0.25f, 0.25f));
    model.set_weight("model.norm.weight", random_tensor({H}, rng, 0.9f, 1.1f));
    for (int l = 0; l < cfg.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      model.set_weight(p + "input_layernorm.weight", random_tensor({H}, rng, 0.9f, 1.1f));
      model.set_weight(p + "post_attention_layernorm.weight", random_tensor({H}, rng, 0.9f, 1.1f));
      model.set_weight(p + "self_attn.q_proj.weight", random_tensor({cfg.q_size(), H}, rng, -0.2f, 0.2f));
      model.set_weight(p + "self_attn.k_proj.weight", random_tensor({cfg.kv_size(), H}, rng, -0.2f, 0.2f));
      model.set_weight(p + "self_attn.v_proj.weight", random_tensor({cfg.kv_size(), H}, rng, -0.2f, 0.2f));
      model.set_weight(p + "self_attn.o_proj.weight", random_tensor({H, cfg.q_size()}, rng, -0.2f, 0.2f));
      model.set_weight(p + "mlp.gate_proj.weight", random_tensor({I, H}, rng, -0.2f, 0.2f));
      model.set_weight(p + "mlp.up_proj.weight", random_tensor({I, H}, rng, -0.2f, 0.2f));
      model.set_weight(p + "mlp.down_proj.weight", random_tensor({H, I}, rng, -0.15f, 0.15f));
    }
    model.finalize();

    lowbit::EngineConfig ec;
    ec.max_batch_tokens = 64;
    ec.max_seqs = 8;
    lowbit::Engine engine(model, ec);

    lowbit::RequestOptions greedy;
    greedy.temperature = 0.f;
    greedy.max_tokens = 8;
    lowbit::RequestOptions sampled = greedy;
    sampled.temperature = 0.8f;
    sampled.top_p = 0.9f;
    sampled.seed = 42;
    engine.add_request(1, {1, 2, 3, 4, 5}, greedy);
    engine.add_request(2, {7, 8, 9}, sampled);
    engine.add_request(3, {10, 11, 12, 13, 14, 15, 16, 17}, greedy);

    std::vector<std::vector<int32_t>> out(4);
    while (engine.has_unfinished())
      for (const lowbit::TokenEvent& ev : engine.step()) {
        out[size_t(ev.request_id)].push_back(ev.token);
        if (ev.finished) std::printf("request %lld finished (%s)\n", (long long)ev.request_id, ev.finish_reason.c_str());
      }
    for (int r = 1; r <= 3; ++r) {
      std::printf("request %d:", r);
      for (int32_t t : out[size_t(r)]) std::printf(" %d", t);
      std::printf("\n");
      if (out[size_t(r)].size() != 8) return 1;
    }
    const lowbit::EngineStats st = engine.stats();
    std::printf("kv blocks free %lld / %lld\n", (long long)st.num_free_blocks, (long long)st.num_blocks);
    return st.num_free_blocks == st.num_blocks ? 0 : 1;
  } catch (const lowbit::Error& e) {
    std::fprintf(stderr, "lowbit error: %s\n", e.what());
    return 1;
  }
}
