// A recipe is the precision plan users type: "w4a16kv8", "w4a8kv4", "w8a8k8v4", "w16a16".
// Grammar (documented for users in docs/recipes.md):
//   w{16|8|4|fp8} a{16|8|4} [g{32|64|128}] [kv{16|8|4|2} | k{16|8|4|2}v{16|8|4|2}] [-{qoq|liquid}]
// w4a8 defaults to the QoQ format (g128); "-liquid" selects LiquidQuant (g64). a4 means COMET's
// mixed W4A4/W4A8 (FMPQ). 16-bit parts mean the model's compute dtype (f32/f16/bf16).
#pragma once
#include <string>

#include "lowbit/core/dtype.h"
#include "lowbit/quant/format.h"

namespace lowbit {

enum class ActivationMode : uint8_t { float16, int8_per_token, fmpq_mixed };
enum class KVBits : uint8_t { kv16 = 16, kv8 = 8, kv4 = 4, kv2 = 2 };

struct Recipe {
  std::string text;                      // normalised spelling
  WeightFormat weight = WeightFormat::f32;  // f32 stands for "the compute dtype" when weight_bits == 16
  int weight_bits = 16;
  int group = 0;
  ActivationMode activation = ActivationMode::float16;
  KVBits k_bits = KVBits::kv16, v_bits = KVBits::kv16;
};
Recipe parse_recipe(const std::string& text);  // throws naming the bad part and listing valid recipes

}  // namespace lowbit
