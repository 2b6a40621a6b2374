// The launch-shape search of the register-direct GEMVs (gemm_w4a16_gemv_sm80.cu, gemm_w4a8_gemv_sm80.cu), host only:
// a compiled configuration "rDbB" (register ring depth D x CTAs per SM B) named by the caller, else the automatic one,
// r4b4, or r6b3 where r4b4's shared-memory budget for x would split k over CTAs; then the fewest CTAs along k whose
// share of x fits that configuration's budget, the chunks spread evenly over them.
#pragma once
#include <string>

#include "lowbit/core/error.h"

namespace lowbit::cuda::detail {

struct GemvShape {
  int split;             // CTAs along k
  int chunks_per_split;  // 64-k chunks per CTA along k
  int config;            // index into the format's configurations
};

// configs: the format's compiled {depth, blocks}, in its launch switch's order. fits(blocks, chunks): x for `chunks`
// 64-k chunks (the format's layout) fits the per-CTA budget at `blocks` CTAs per SM. op names the kernel in errors.
template <class Config, int N, class Fits>
GemvShape plan_gemv_shape(const char* op, const Config (&configs)[N], int k_chunks, int ring, int blocks,
                          const Fits& fits) {
  auto index_of = [&](int d, int b) {
    int c = 0;
    while (c < N && (configs[c].depth != d || configs[c].blocks != b)) ++c;
    return c;
  };
  // The split stops at one chunk per CTA: a bound on the loop only, since x for one chunk of 16 tokens (about 1.4 KB)
  // fits every configuration's budget (at least ~32 KB), so no plan of either format ever reaches it.
  auto split_for = [&](int config) {
    int split = 1;
    while (split < k_chunks && !fits(configs[config].blocks, (k_chunks + split - 1) / split)) ++split;
    return split;
  };
  auto compiled = [&] {
    std::string names;
    for (int c = 0; c < N; ++c)
      names += (c ? ", r" : "r") + std::to_string(configs[c].depth) + "b" + std::to_string(configs[c].blocks);
    return names;
  };
  int config;
  if (ring != 0 || blocks != 0) {
    config = index_of(ring, blocks);
    LOWBIT_CHECK(config < N, op, ": the gemv kernel has no configuration r", ring, "b", blocks, " (compiled: ",
                 compiled(), ")");
  } else {
    config = index_of(4, 4);
    if (split_for(config) > 1) config = index_of(6, 3);
  }
  int split = split_for(config);
  const int per = (k_chunks + split - 1) / split;
  split = (k_chunks + per - 1) / per;
  return {split, per, config};
}

}  // namespace lowbit::cuda::detail
