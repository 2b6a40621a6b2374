// Recipe strings ("w4a8kv4", "w4a16g64k8v4", ...) <-> Recipe; grammar in include/lowbit/quant/recipe.h.
#include "lowbit/quant/recipe.h"

#include <cctype>

namespace lowbit {
namespace {

constexpr const char* kValidExamples =
    "valid recipes look like w16a16, w8a16, w8a8kv8, w4a16, w4a16g64kv8, w4a8kv4, w4a8k8v4-liquid, w4a4kv4, "
    "wfp8a16, wfp8a8 (grammar: w{16|8|4|fp8} a{16|8|4} [g{32|64|128}] [kv{16|8|4|2} | k[c]{16|8|4|2}[g{32|64|128}]v{16|8|4|2}] "
    "[-{qoq|liquid}]; per-channel K: kc4v4, kc2v2, kc4g32v2, ...)";

// A cursor over the lower-cased recipe text.
struct Cursor {
  const std::string& original;
  std::string s;
  size_t pos = 0;

  bool eat(const char* word) {
    const std::string w(word);
    if (s.compare(pos, w.size(), w) != 0) return false;
    pos += w.size();
    return true;
  }
  // Reads a decimal number; -1 when none is there.
  int number() {
    int v = -1;
    while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos])) && v < 10000)
      v = (v < 0 ? 0 : v * 10) + (s[pos++] - '0');
    return v;
  }
  [[noreturn]] void fail(const std::string& what) const {
    LOWBIT_CHECK(false, "parse_recipe: bad recipe '", original, "': ", what, " at position ", pos, "; ",
                 kValidExamples);
  }
};

KVBits kv_bits(Cursor& c, const char* which) {
  const int v = c.number();
  if (v != 16 && v != 8 && v != 4 && v != 2) c.fail(std::string(which) + " bits must be 16, 8, 4 or 2");
  return static_cast<KVBits>(v);
}

}  // namespace

const char* name_of(ActivationMode a) {
  switch (a) {
    case ActivationMode::float16: return "float16";
    case ActivationMode::int8_per_token: return "int8_per_token";
    case ActivationMode::fmpq_mixed: return "fmpq_mixed";
    case ActivationMode::fp8_per_token: return "fp8_per_token";
  }
  return "?";
}

int activation_bits(ActivationMode a) {
  switch (a) {
    case ActivationMode::float16: return 16;
    case ActivationMode::int8_per_token:
    case ActivationMode::fp8_per_token: return 8;
    case ActivationMode::fmpq_mixed: return 4;
  }
  return 16;
}

const char* variant_of(const Recipe& r) {
  if (r.weight == WeightFormat::liquid) return "liquid";
  if (r.weight == WeightFormat::qoq && r.activation == ActivationMode::int8_per_token) return "qoq";
  return "";
}

Recipe parse_recipe(const std::string& text) {
  Cursor c{text, {}};
  size_t b = text.find_first_not_of(" \t\n"), e = text.find_last_not_of(" \t\n");
  c.s = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
  for (char& ch : c.s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));

  Recipe r;
  if (!c.eat("w")) c.fail("expected 'w' (weight bits) first");
  const bool fp8 = c.eat("fp8");
  const int wbits = fp8 ? 8 : c.number();
  if (wbits != 16 && wbits != 8 && wbits != 4) c.fail("weight bits must be 16, 8, 4 or fp8");
  if (!c.eat("a")) c.fail("expected 'a' (activation bits) after the weight part");
  const int abits = c.number();
  if (abits != 16 && abits != 8 && abits != 4) c.fail("activation bits must be 16, 8 or 4");

  int group = 0;
  if (c.eat("g")) {
    group = c.number();
    if (group != 32 && group != 64 && group != 128) c.fail("group size must be 32, 64 or 128");
    if (wbits != 4 && (wbits != 8 || fp8)) c.fail("a group size applies to 4-bit and int8 weights only");
  }
  if (c.eat("kv")) {
    r.k_bits = r.v_bits = kv_bits(c, "kv");
  } else if (c.eat("k")) {
    r.k_per_channel = c.eat("c");
    r.k_bits = kv_bits(c, "k");
    if (r.k_per_channel) {
      if (r.k_bits != KVBits::kv4 && r.k_bits != KVBits::kv2) c.fail("per-channel K ('kc') takes 4 or 2 bits");
      r.k_group = kDefaultKGroup;
      if (c.eat("g")) {
        r.k_group = c.number();
        if (r.k_group != 32 && r.k_group != 64 && r.k_group != 128) c.fail("K group size must be 32, 64 or 128");
      }
    }
    if (!c.eat("v")) c.fail("expected 'v' (value bits) after the k part");
    r.v_bits = kv_bits(c, "v");
  }
  bool liquid = false, qoq_named = false;
  if (c.eat("-")) {
    liquid = c.eat("liquid");
    qoq_named = !liquid && c.eat("qoq");
    if (!liquid && !qoq_named) c.fail("expected '-qoq' or '-liquid'");
    if (wbits != 4 || abits != 8) c.fail("'-qoq' / '-liquid' select the W4A8 weight format and need w4a8");
  }
  if (c.pos != c.s.size()) c.fail("unexpected trailing text '" + c.s.substr(c.pos) + "'");

  r.weight_bits = wbits;
  if (fp8) {
    if (abits != 16 && abits != 8) c.fail("fp8 weights run with 16-bit or fp8 activations (wfp8a16, wfp8a8)");
    r.weight = WeightFormat::e4m3;
    if (abits == 8) r.activation = ActivationMode::fp8_per_token;
  } else if (wbits == 16) {
    if (abits != 16) c.fail("16-bit weights need 16-bit activations (w16a16)");
    r.weight = WeightFormat::f32;
  } else if (wbits == 8) {
    if (abits == 4) c.fail("w8a4 is not a supported pair (use w8a8 or w4a4)");
    // grouped int8 (GGUF Q8_0 as stored) has a float-activation CPU kernel only
    if (group != 0 && abits != 16) c.fail("grouped int8 weights run with float activations only (w8a16g32)");
    r.weight = WeightFormat::w8;
    r.activation = abits == 8 ? ActivationMode::int8_per_token : ActivationMode::float16;
  } else if (abits == 16) {
    r.weight = WeightFormat::w4;
  } else if (abits == 8) {
    r.weight = liquid ? WeightFormat::liquid : WeightFormat::qoq;
    r.activation = ActivationMode::int8_per_token;
  } else {
    r.weight = WeightFormat::qoq;
    r.activation = ActivationMode::fmpq_mixed;
  }
  if (is_group_wise(r.weight) && group == 0) group = r.weight == WeightFormat::liquid ? 64 : 128;
  r.group = group;
  r.text = to_string(r);
  return r;
}

std::string to_string(const Recipe& r) {
  std::string s = "w";
  s += r.weight == WeightFormat::e4m3 ? "fp8" : std::to_string(r.weight_bits);
  s += "a" + std::to_string(activation_bits(r.activation));
  const int default_group = r.weight == WeightFormat::liquid ? 64 : 128;
  if (is_group_wise(r.weight) && r.group != default_group) s += "g" + std::to_string(r.group);
  if (r.weight == WeightFormat::w8 && r.group != 0) s += "g" + std::to_string(r.group);  // w8 is per channel by default
  if (r.k_per_channel || r.k_bits != KVBits::kv16 || r.v_bits != KVBits::kv16) s += kv_format_name(r);
  if (r.weight == WeightFormat::liquid) s += "-liquid";
  return s;
}

std::string kv_format_name(const Recipe& r) {
  const std::string kb = std::to_string(static_cast<int>(r.k_bits)), vb = std::to_string(static_cast<int>(r.v_bits));
  if (r.k_per_channel)
    return "kc" + kb + (r.k_group != kDefaultKGroup ? "g" + std::to_string(r.k_group) : std::string()) + "v" + vb;
  return r.k_bits == r.v_bits ? "kv" + kb : "k" + kb + "v" + vb;
}

}  // namespace lowbit
