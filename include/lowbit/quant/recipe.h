// A recipe is the precision plan users type: "w4a16kv8", "w4a8kv4", "w8a8k8v4", "w16a16".
// Grammar (case-insensitive, surrounding spaces ignored; documented for users in docs/formats.md):
//   w{16|8|4|fp8} a{16|8|4} [g{32|64|128}] [kv{16|8|4|2} | k[c]{16|8|4|2}[g{32|64|128}]v{16|8|4|2}] [-{qoq|liquid}]
// KV part: "kv4" = K and V per token at 4 bits; "k8v4" = K and V bits chosen apart, both per token;
// "kc4v4" = K per channel (KIVI-style, 4 or 2 bits only) in groups of G tokens (default kDefaultKGroup,
// "kc4g32v4" picks G), V per token. Per-channel K keeps the newest < G tokens of a sequence in f16 (the
// residual window, include/lowbit/kv/kv_cache.h).
// Meaning of the weight/activation pair:
//   w16a16 -> compute dtype weights       w8a16 -> w8, float activations   w8a8 -> w8, per-token s8 (SmoothQuant)
//   w8a16g32 -> w8 with one f32 scale per group of 32 along k (GGUF Q8_0 as stored; CPU only)
//   w4a16  -> w4 (AWQ/GPTQ groups, g128)   w4a8  -> qoq g128 ("-liquid": liquid g64), per-token s8 activations
//   w4a4   -> qoq g128 weights with COMET's mixed W4A4/W4A8 activations (FMPQ)
//   wfp8a16 -> e4m3 per-channel weights, float activations
//   wfp8a8 -> e4m3 per-channel weights, per-token e4m3 activations (FP8 W8A8)
// g{..} applies to 4-bit weights and to w8a16 only; "-qoq"/"-liquid" to w4a8 only. Other pairs are rejected.
// 16-bit parts mean the model's compute dtype (f32/f16/bf16). 2-bit KV and per-channel K run on the CPU
// engine only: the CUDA engine refuses them (no GPU kernel yet).
#pragma once
#include <string>

#include "lowbit/core/dtype.h"
#include "lowbit/quant/format.h"

namespace lowbit {

enum class ActivationMode : uint8_t { float16, int8_per_token, fmpq_mixed, fp8_per_token };
enum class KVBits : uint8_t { kv16 = 16, kv8 = 8, kv4 = 4, kv2 = 2 };
const char* name_of(ActivationMode a);  // "float16", "int8_per_token", "fmpq_mixed", "fp8_per_token"
int activation_bits(ActivationMode a);   // the "a" of the spelling: 16 (float16), 8 (int8/fp8 per token), 4 (fmpq)

struct Recipe {
  std::string text;                      // normalised spelling (to_string)
  WeightFormat weight = WeightFormat::f32;  // f32 stands for "the compute dtype" when weight_bits == 16
  int weight_bits = 16;                     // 16, 8 (w8 and fp8) or 4
  int group = 0;                            // group size of group-wise formats (and of grouped w8), else 0
  ActivationMode activation = ActivationMode::float16;
  KVBits k_bits = KVBits::kv16, v_bits = KVBits::kv16;
  bool k_per_channel = false;  // "kc": K quantized per channel over groups of k_group tokens
  int k_group = 0;             // tokens per K group when k_per_channel (32, 64 or 128), else 0
  bool has_kv2() const { return k_bits == KVBits::kv2 || v_bits == KVBits::kv2; }
};
constexpr int kDefaultKGroup = 64;  // per-channel K group: 64 tokens (see docs/recipes.md for the choice)
// The KV part of the spelling alone: "kv16", "kv4", "k8v4", "kc4v4", "kc2g32v2" (for errors and docs).
std::string kv_format_name(const Recipe& r);
Recipe parse_recipe(const std::string& text);  // throws naming the bad part and listing valid recipes
// Canonical spelling: defaults left out (g128 for w4/qoq, g64 for liquid, kv16), "kv8" when K and V
// agree, "-liquid" for LiquidQuant. parse_recipe(to_string(r)) == r.
std::string to_string(const Recipe& r);
// The W4A8 weight format that the "-{qoq|liquid}" suffix selects: "qoq" (also when no suffix is given) or
// "liquid" for w4a8 recipes; "" for every other pair (they take no suffix).
const char* variant_of(const Recipe& r);

}  // namespace lowbit
