// The one reader of user kernel options (include/lowbit/kernels/options.h): strings in, a validated
// ParsedKernelOptions out, once at model load.
#include <cstdlib>
#include <set>

#include "lowbit/core/error.h"
#include "lowbit/kernels/desc.h"
#include "lowbit/kernels/options.h"

namespace lowbit::kernels {
namespace {

const std::set<std::string>& forced_roles() {
  static const std::set<std::string> roles = {"linear",      "linear.qkv",     "linear.o",         "linear.gate_up",
                                              "linear.down", "linear.lm_head", "attention",        "attention.prefill",
                                              "attention.decode"};
  return roles;
}

bool on_off(const std::string& key, const std::string& v) {
  if (v == "on" || v == "1" || v == "true") return true;
  if (v == "off" || v == "0" || v == "false") return false;
  LOWBIT_CHECK_KIND(ErrorKind::kValue, false, "kernel_overrides['", key, "'] must be on or off, got '", v, "'");
  return false;
}

// A decimal count in [lo, hi], or -1.
int parse_count(const std::string& v, int lo, int hi) {
  if (v.empty() || v.size() > 3 || v.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int n = std::atoi(v.c_str());
  return n >= lo && n <= hi ? n : -1;
}

}  // namespace

std::string ParsedKernelOptions::forced_for(const std::string& role, const std::string& bucket) const {
  const std::string family = role.substr(0, role.find('.'));
  for (const std::string& key : {bucket.empty() ? std::string() : role + "@" + bucket,
                                 bucket.empty() ? std::string() : family + "@" + bucket, role, family}) {
    const auto it = key.empty() ? forced.end() : forced.find(key);
    if (it != forced.end()) return it->second;
  }
  return std::string();
}

ParsedKernelOptions parse_kernel_options(const KernelOptions& options) {
  ParsedKernelOptions p;
  p.strict = options.strict;
  KernelTuning& t = p.tuning;
  for (const auto& [key, value] : options.overrides) {
    const size_t at = key.find('@');
    if (at != std::string::npos) {  // "linear.qkv@m2-4": one token bucket of a linear role
      const std::string role = key.substr(0, at), bucket = key.substr(at + 1);
      LOWBIT_CHECK_KIND(ErrorKind::kValue, forced_roles().count(role) && role.rfind("linear", 0) == 0,
                        "kernel_overrides['", key, "']: only linear roles take a token bucket, got '", role, "'");
      bool known = false;
      for (int b = 0; b < kNumMBuckets; ++b) known = known || bucket == name_of(MBucket(b));
      LOWBIT_CHECK_KIND(ErrorKind::kValue, known, "kernel_overrides['", key, "']: unknown token bucket '", bucket,
                        "' (m1, m2-4, m5-16, m17-127, m128+)");
      LOWBIT_CHECK_KIND(ErrorKind::kValue, !value.empty(), "kernel_overrides['", key, "'] must name a kernel");
      p.forced[key] = value;
    } else if (forced_roles().count(key)) {
      LOWBIT_CHECK_KIND(ErrorKind::kValue, !value.empty(), "kernel_overrides['", key, "'] must name a kernel");
      p.forced[key] = value;
    } else if (key == "fused_norm_quant") {
      t.fused_norm_quant = on_off(key, value);
    } else if (key == "fused_silu_quant") {
      t.fused_silu_quant = on_off(key, value);
    } else if (key == "pdl") {
      t.pdl = on_off(key, value);
    } else if (key == "sm90_pairs") {
      t.sm90_pairs = on_off(key, value);
    } else if (key == "fp8_fast_accum") {
      t.fp8_fast_accum = on_off(key, value);
    } else if (key == "split_mixed_attention") {
      t.split_mixed_attention = on_off(key, value);
    } else if (key == "prefill_key_split") {
      t.prefill_key_split = value == "auto" ? 0 : value == "off" ? 1 : parse_count(value, 2, kMaxPrefillKeySplits);
      LOWBIT_CHECK_KIND(ErrorKind::kValue, t.prefill_key_split >= 0, "kernel_overrides['prefill_key_split'] must be ",
                        "auto, off or a split count from 2 to ", kMaxPrefillKeySplits, ", got '", value, "'");
    } else if (key == "prefill_pack_heads") {
      t.prefill_pack_heads = value == "auto" ? 0 : on_off(key, value) ? 2 : 1;
    } else if (key == "prefill_ref_dequant") {
      t.prefill_ref_dequant = on_off(key, value);
    } else if (key == "prefill_dequant_copy") {
      t.prefill_dequant_copy = value == "auto" ? 0 : on_off(key, value) ? 2 : 1;
    } else if (key == "prefill_side_stream") {
      t.prefill_side_stream = value == "auto" ? 0 : on_off(key, value) ? 2 : 1;
    } else if (key == "w4a16_large_tile") {
      t.w4a16_large_tile = value == "auto" ? 0 : value == "64x128" ? 64128 : value == "128x128" ? 128128
                           : value == "128x256" ? 128256 : -1;
      LOWBIT_CHECK_KIND(ErrorKind::kValue, t.w4a16_large_tile >= 0, "kernel_overrides['w4a16_large_tile'] must be ",
                        "auto, 64x128, 128x128 or 128x256, got '", value, "'");
    } else if (key == "sm90_split") {
      t.sm90_split = value == "0" ? 0 : value == "1" ? 1 : value == "2" ? 2 : value == "4" ? 4 : value == "8" ? 8 : -1;
      LOWBIT_CHECK_KIND(ErrorKind::kValue, t.sm90_split >= 0, "kernel_overrides['sm90_split'] must be 0, 1, 2, 4 ",
                        "or 8, got '", value, "'");
    } else {
      LOWBIT_CHECK_KIND(ErrorKind::kValue, false, "kernel_overrides: unknown key '", key, "'; forced kernels: ",
                        "linear, linear.{qkv,o,gate_up,down,lm_head} (each optionally @ a token bucket: @m1, @m2-4, ",
                        "@m5-16, @m17-127, @m128+), attention, attention.{prefill,decode}; ",
                        "tuning: fused_norm_quant, fused_silu_quant, pdl, w4a16_large_tile, sm90_split, sm90_pairs, ",
                        "fp8_fast_accum, split_mixed_attention, prefill_key_split, prefill_pack_heads, ",
                        "prefill_ref_dequant, prefill_dequant_copy, prefill_side_stream");
    }
  }
  return p;
}

}  // namespace lowbit::kernels
