// Shared by the model/engine tests: a tiny random Llama config and weights, loading them into a
// Model, and an independent float64 reference forward over one sequence (plain loops, HF semantics).
#pragma once
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "lowbit/model/model.h"
#include "random_tensor.h"

namespace lowbit::testing_ref {

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 10000.f;
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 256;
  return c;
}

// name -> f32 host tensor with the HF shape.
using Weights = std::map<std::string, Tensor>;

using testing_data::random_tensor;

inline Weights random_weights(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Weights w;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  auto lin = [&](const std::string& name, int64_t n, int64_t k) {
    const float a = 1.5f / std::sqrt(float(k));  // keeps activations O(1) through the layers
    w[name] = random_tensor({n, k}, rng, -a, a);
  };
  // Small tied embeddings keep the next-token distribution broad (logit std ~1), so greedy tokens
  // and logprobs are sensitive to any mistake in positions, caching or batching.
  w["model.embed_tokens.weight"] = random_tensor({c.vocab_size, H}, rng, -0.25f, 0.25f);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w[p + "input_layernorm.weight"] = random_tensor({H}, rng, 0.8f, 1.2f);
    w[p + "post_attention_layernorm.weight"] = random_tensor({H}, rng, 0.8f, 1.2f);
    lin(p + "self_attn.q_proj.weight", c.q_size(), H);
    lin(p + "self_attn.k_proj.weight", c.kv_size(), H);
    lin(p + "self_attn.v_proj.weight", c.kv_size(), H);
    lin(p + "self_attn.o_proj.weight", H, c.q_size());
    lin(p + "mlp.gate_proj.weight", I, H);
    lin(p + "mlp.up_proj.weight", I, H);
    lin(p + "mlp.down_proj.weight", H, I);
    if (c.attention_bias) {
      w[p + "self_attn.q_proj.bias"] = random_tensor({c.q_size()}, rng, -0.5f, 0.5f);
      w[p + "self_attn.k_proj.bias"] = random_tensor({c.kv_size()}, rng, -0.5f, 0.5f);
      w[p + "self_attn.v_proj.bias"] = random_tensor({c.kv_size()}, rng, -0.5f, 0.5f);
    }
  }
  w["model.norm.weight"] = random_tensor({H}, rng, 0.8f, 1.2f);
  if (!c.tie_word_embeddings) lin("lm_head.weight", c.vocab_size, H);
  return w;
}

inline void load(Model& m, const Weights& w) {
  for (const auto& kv : w) m.set_weight(kv.first, kv.second);
  m.finalize();
}

// Weights as the kernels see them: every linear quantized round-to-nearest and dequantized; lm_head in `fmt`
// when quantize_head, else rounded to f16 (activation-quantized recipes keep it in 16-bit float).
inline Weights effective_weights(const ModelConfig& c, const Weights& w, WeightFormat fmt, int group,
                                 bool quantize_head = true) {
  Weights out = w;
  for (auto& kv : out) {
    if (kv.first.find("_proj.weight") != std::string::npos)
      kv.second = dequantize_weight(quantize_weight(kv.second, fmt, group));
  }
  const Tensor& head = c.tie_word_embeddings ? w.at("model.embed_tokens.weight") : w.at("lm_head.weight");
  out["lm_head.weight"] = dequantize_weight(quantize_weight(head, quantize_head ? fmt : WeightFormat::f16, group));
  return out;
}

// Per token and head, asymmetric `bits`-bit round trip (the KV cache format in kv_cache.h).
inline void kv_round_trip(double* x, int64_t d, int bits) {
  if (bits >= 16) return;
  double lo = x[0], hi = x[0];
  for (int64_t i = 1; i < d; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const double levels = double((1 << bits) - 1);
  const float scale = float((hi - lo) / levels), zero = float(lo);
  for (int64_t i = 0; i < d; ++i) {
    double q = scale == 0 ? 0 : std::nearbyint((x[i] - zero) / scale);
    q = std::min(std::max(q, 0.0), levels);
    x[i] = q * scale + zero;
  }
}

// Per-token symmetric int8 round trip of a linear's input (a8 recipes): s = max|x| / 127, x = round(x / s) * s.
inline void act_round_trip(const double* x, int64_t k, double* y) {
  double mx = 0;
  for (int64_t i = 0; i < k; ++i) mx = std::max(mx, std::abs(x[i]));
  const double s = mx > 0 ? double(float(mx / 127.0)) : 1.0;
  for (int64_t i = 0; i < k; ++i) y[i] = std::nearbyint(x[i] / s) * s;
}

// Float64 logits [T, vocab] of every position of `tokens` (one sequence, causal), HF Llama semantics.
// k_bits/v_bits < 16 round-trip the cache; act_int8 quantizes every decoder linear's input per token (lm_head
// always takes float activations).
inline std::vector<double> reference_logits(const ModelConfig& c, const Weights& w, const std::vector<int32_t>& tokens,
                                            int k_bits = 16, int v_bits = 16, bool act_int8 = false,
                                            int act_shards = 1) {
  const int64_t T = int64_t(tokens.size()), H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, V = c.vocab_size;
  auto f = [&](const std::string& n) { return w.at(n).data<float>(); };
  std::vector<double> xq;
  auto float_matvec = [](const float* W, const double* x, int64_t n, int64_t k, double* y) {
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += double(W[i * k + j]) * x[j];
      y[i] = s;
    }
  };
  // shards > 1: a row-parallel linear under tensor parallelism, whose input each rank quantizes over its own
  // k / shards channels.
  auto matvec = [&](const float* W, const double* x, int64_t n, int64_t k, double* y, int64_t shards = 1) {
    if (act_int8) {
      xq.resize(size_t(k));
      for (int64_t s = 0; s < shards; ++s) act_round_trip(x + s * (k / shards), k / shards, xq.data() + s * (k / shards));
      x = xq.data();
    }
    float_matvec(W, x, n, k, y);
  };
  auto rmsnorm = [&](const double* x, const float* g, double* y) {
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += x[i] * x[i];
    const double r = 1.0 / std::sqrt(ss / double(H) + double(c.rms_norm_eps));
    for (int64_t i = 0; i < H; ++i) y[i] = x[i] * r * double(g[i]);
  };
  auto rope = [&](double* x, int64_t pos) {  // HF rotate_half: pairs (i, i + D/2)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double freq = std::pow(double(c.rope_theta), -2.0 * double(i) / double(D));
      const double a = double(pos) * freq, x1 = x[i], x2 = x[i + D / 2];
      x[i] = x1 * std::cos(a) - x2 * std::sin(a);
      x[i + D / 2] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  };
  std::vector<double> h(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) h[size_t(t * H + i)] = f("model.embed_tokens.weight")[tokens[size_t(t)] * H + i];
  std::vector<double> x(static_cast<size_t>(H)), q(static_cast<size_t>(T * Hq * D)), k(static_cast<size_t>(T * Hkv * D)), v(static_cast<size_t>(T * Hkv * D));
  std::vector<double> att(static_cast<size_t>(Hq * D)), o(static_cast<size_t>(H)), g(static_cast<size_t>(I)), u(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (int64_t t = 0; t < T; ++t) {
      rmsnorm(&h[size_t(t * H)], f(p + "input_layernorm.weight"), x.data());
      matvec(f(p + "self_attn.q_proj.weight"), x.data(), Hq * D, H, &q[size_t(t * Hq * D)]);
      matvec(f(p + "self_attn.k_proj.weight"), x.data(), Hkv * D, H, &k[size_t(t * Hkv * D)]);
      matvec(f(p + "self_attn.v_proj.weight"), x.data(), Hkv * D, H, &v[size_t(t * Hkv * D)]);
      if (c.attention_bias) {
        for (int64_t i = 0; i < Hq * D; ++i) q[size_t(t * Hq * D + i)] += f(p + "self_attn.q_proj.bias")[i];
        for (int64_t i = 0; i < Hkv * D; ++i) {
          k[size_t(t * Hkv * D + i)] += f(p + "self_attn.k_proj.bias")[i];
          v[size_t(t * Hkv * D + i)] += f(p + "self_attn.v_proj.bias")[i];
        }
      }
      for (int64_t hh = 0; hh < Hq; ++hh) rope(&q[size_t((t * Hq + hh) * D)], t);
      for (int64_t hh = 0; hh < Hkv; ++hh) {
        rope(&k[size_t((t * Hkv + hh) * D)], t);
        kv_round_trip(&k[size_t((t * Hkv + hh) * D)], D, k_bits);
        kv_round_trip(&v[size_t((t * Hkv + hh) * D)], D, v_bits);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const int64_t kh = hh / (Hq / Hkv);
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e) d += q[size_t((t * Hq + hh) * D + e)] * k[size_t((j * Hkv + kh) * D + e)];
          s[size_t(j)] = d / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t e = 0; e < D; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= t; ++j) acc += s[size_t(j)] / z * v[size_t((j * Hkv + kh) * D + e)];
          att[size_t(hh * D + e)] = acc;
        }
      }
      matvec(f(p + "self_attn.o_proj.weight"), att.data(), H, Hq * D, o.data(), act_shards);
      for (int64_t i = 0; i < H; ++i) h[size_t(t * H + i)] += o[size_t(i)];
    }
    for (int64_t t = 0; t < T; ++t) {
      rmsnorm(&h[size_t(t * H)], f(p + "post_attention_layernorm.weight"), x.data());
      matvec(f(p + "mlp.gate_proj.weight"), x.data(), I, H, g.data());
      matvec(f(p + "mlp.up_proj.weight"), x.data(), I, H, u.data());
      for (int64_t i = 0; i < I; ++i) g[size_t(i)] = g[size_t(i)] / (1.0 + std::exp(-g[size_t(i)])) * u[size_t(i)];
      matvec(f(p + "mlp.down_proj.weight"), g.data(), H, I, y.data(), act_shards);
      for (int64_t i = 0; i < H; ++i) h[size_t(t * H + i)] += y[size_t(i)];
    }
  }
  std::vector<double> logits(static_cast<size_t>(T * V));
  const float* head = w.count("lm_head.weight") ? f("lm_head.weight") : f("model.embed_tokens.weight");
  for (int64_t t = 0; t < T; ++t) {
    rmsnorm(&h[size_t(t * H)], f("model.norm.weight"), x.data());
    float_matvec(head, x.data(), V, H, &logits[size_t(t * V)]);
  }
  return logits;
}

inline int32_t argmax(const double* row, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = int32_t(i);
  return best;
}

// Greedy continuation by full recomputation with the reference.
inline std::vector<int32_t> reference_greedy(const ModelConfig& c, const Weights& w, std::vector<int32_t> tokens,
                                             int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> lg = reference_logits(c, w, tokens);
    const int32_t t = argmax(&lg[lg.size() - size_t(c.vocab_size)], c.vocab_size);
    out.push_back(t);
    tokens.push_back(t);
  }
  return out;
}

}  // namespace lowbit::testing_ref
