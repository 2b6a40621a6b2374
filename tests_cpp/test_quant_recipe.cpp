// parse_recipe / to_string: every documented form, case-insensitivity, round trip, rejections.
#include <gtest/gtest.h>

#include <string>

#include "lowbit/quant/recipe.h"

namespace lowbit {
namespace {

struct Case {
  const char* text;
  WeightFormat weight;
  int bits, group;
  ActivationMode act;
  int k, v;
  const char* canonical;
};

TEST(QuantRecipe, ParsesEveryForm) {
  const Case cases[] = {
      {"w16a16", WeightFormat::f32, 16, 0, ActivationMode::float16, 16, 16, "w16a16"},
      {"w8a16", WeightFormat::w8, 8, 0, ActivationMode::float16, 16, 16, "w8a16"},
      {"w8a16g32kv8", WeightFormat::w8, 8, 32, ActivationMode::float16, 8, 8, "w8a16g32kv8"},  // GGUF Q8_0
      {"w8a8kv8", WeightFormat::w8, 8, 0, ActivationMode::int8_per_token, 8, 8, "w8a8kv8"},
      {"w8a8k8v4", WeightFormat::w8, 8, 0, ActivationMode::int8_per_token, 8, 4, "w8a8k8v4"},
      {"w4a16", WeightFormat::w4, 4, 128, ActivationMode::float16, 16, 16, "w4a16"},
      {"w4a16g64kv8", WeightFormat::w4, 4, 64, ActivationMode::float16, 8, 8, "w4a16g64kv8"},
      {"w4a16kv8", WeightFormat::w4, 4, 128, ActivationMode::float16, 8, 8, "w4a16kv8"},
      {"w4a8kv4", WeightFormat::qoq, 4, 128, ActivationMode::int8_per_token, 4, 4, "w4a8kv4"},
      {"w4a8kv4-qoq", WeightFormat::qoq, 4, 128, ActivationMode::int8_per_token, 4, 4, "w4a8kv4"},
      {"w4a8g32-qoq", WeightFormat::qoq, 4, 32, ActivationMode::int8_per_token, 16, 16, "w4a8g32"},
      {"w4a8k8v4-liquid", WeightFormat::liquid, 4, 64, ActivationMode::int8_per_token, 8, 4, "w4a8k8v4-liquid"},
      {"w4a8g128-liquid", WeightFormat::liquid, 4, 128, ActivationMode::int8_per_token, 16, 16, "w4a8g128-liquid"},
      {"w4a4kv4", WeightFormat::qoq, 4, 128, ActivationMode::fmpq_mixed, 4, 4, "w4a4kv4"},
      {"wfp8a16kv8", WeightFormat::e4m3, 8, 0, ActivationMode::float16, 8, 8, "wfp8a16kv8"},
      {"WFP8A8kv8", WeightFormat::e4m3, 8, 0, ActivationMode::fp8_per_token, 8, 8, "wfp8a8kv8"},
      {"  W4A16KV16 ", WeightFormat::w4, 4, 128, ActivationMode::float16, 16, 16, "w4a16"},
      {"w16a16kv2", WeightFormat::f32, 16, 0, ActivationMode::float16, 2, 2, "w16a16kv2"},
  };
  for (const Case& c : cases) {
    const Recipe r = parse_recipe(c.text);
    EXPECT_EQ(r.weight, c.weight) << c.text;
    EXPECT_EQ(r.weight_bits, c.bits) << c.text;
    EXPECT_EQ(r.group, c.group) << c.text;
    EXPECT_EQ(r.activation, c.act) << c.text;
    EXPECT_EQ(static_cast<int>(r.k_bits), c.k) << c.text;
    EXPECT_EQ(static_cast<int>(r.v_bits), c.v) << c.text;
    EXPECT_EQ(r.text, c.canonical) << c.text;
    EXPECT_EQ(to_string(r), c.canonical);
    const Recipe again = parse_recipe(to_string(r));
    EXPECT_EQ(again.weight, r.weight);
    EXPECT_EQ(again.group, r.group);
    EXPECT_EQ(again.activation, r.activation);
    EXPECT_EQ(again.k_bits, r.k_bits);
    EXPECT_EQ(again.v_bits, r.v_bits);
  }
  EXPECT_TRUE(parse_recipe("w4a16k2v8").has_kv2());
  EXPECT_FALSE(parse_recipe("w4a16kv4").k_per_channel);
  EXPECT_FALSE(parse_recipe("w4a16k4v8").has_kv2());
}

TEST(QuantRecipe, PerChannelKWords) {
  struct Case {
    const char* text;
    int k, v, group;
    const char* canonical;
    const char* kv_name;
  };
  const Case cases[] = {
      {"w16a16kc4v4", 4, 4, 64, "w16a16kc4v4", "kc4v4"},
      {"w16a16kc2v2", 2, 2, 64, "w16a16kc2v2", "kc2v2"},
      {"w4a16g64kc4g32v2", 4, 2, 32, "w4a16g64kc4g32v2", "kc4g32v2"},
      {"W4A8KC2G128V8-liquid", 2, 8, 128, "w4a8kc2g128v8-liquid", "kc2g128v8"},
      {"w16a16kc4g64v16", 4, 16, 64, "w16a16kc4v16", "kc4v16"},
  };
  for (const Case& c : cases) {
    const Recipe r = parse_recipe(c.text);
    EXPECT_TRUE(r.k_per_channel) << c.text;
    EXPECT_EQ(static_cast<int>(r.k_bits), c.k) << c.text;
    EXPECT_EQ(static_cast<int>(r.v_bits), c.v) << c.text;
    EXPECT_EQ(r.k_group, c.group) << c.text;
    EXPECT_EQ(r.text, c.canonical) << c.text;
    EXPECT_EQ(kv_format_name(r), c.kv_name) << c.text;
    const Recipe again = parse_recipe(r.text);
    EXPECT_EQ(again.k_per_channel, r.k_per_channel);
    EXPECT_EQ(again.k_group, r.k_group);
  }
  EXPECT_EQ(kv_format_name(parse_recipe("w4a16k8v4")), "k8v4");
  EXPECT_EQ(kv_format_name(parse_recipe("w4a16kv2")), "kv2");
  EXPECT_EQ(parse_recipe("w4a16kv2").k_group, 0);
}

void expect_rejected(const std::string& text, const std::string& why) {
  try {
    parse_recipe(text);
    FAIL() << "accepted '" << text << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kValue);
    EXPECT_NE(msg.find("parse_recipe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + text + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
    EXPECT_NE(msg.find("w4a8kv4"), std::string::npos) << "no valid examples listed: " << msg;
  }
}

TEST(QuantRecipe, RejectsBadText) {
  expect_rejected("", "expected 'w'");
  expect_rejected("w3a16", "weight bits");
  expect_rejected("w4a2", "activation bits");
  expect_rejected("w4", "expected 'a'");
  expect_rejected("w4a16g100", "group size must be 32, 64 or 128");
  expect_rejected("w16a16kc8v8", "per-channel K ('kc') takes 4 or 2 bits");
  expect_rejected("w16a16kc16v4", "per-channel K ('kc') takes 4 or 2 bits");
  expect_rejected("w16a16kc4g16v4", "K group size must be 32, 64 or 128");
  expect_rejected("w16a16kc4", "expected 'v'");
  expect_rejected("w16a16kcv4", "k bits must be 16, 8, 4 or 2");
  expect_rejected("w8a8g32", "grouped int8 weights run with float activations only");
  expect_rejected("wfp8a16g32", "4-bit and int8 weights only");
  expect_rejected("w4a16kv3", "kv bits must be 16, 8, 4 or 2");
  expect_rejected("w4a16k8", "expected 'v'");
  expect_rejected("w4a16-liquid", "need w4a8");
  expect_rejected("w4a8-awq", "'-qoq' or '-liquid'");
  expect_rejected("w4a8kv4x", "trailing text 'x'");
  expect_rejected("w16a8", "16-bit weights need 16-bit activations");
  expect_rejected("wfp8a4", "fp8 weights run with 16-bit or fp8 activations");
  expect_rejected("w8a4", "w8a4");
}

}  // namespace
}  // namespace lowbit
