// The key split of the Hopper prefill kernel (prefill_attention_sm90.cuh): how many CTAs share one query tile's
// keys, and which key tiles each takes. Host and device code; no CUDA header needed (tests_cpp reads it on the CPU).
//
// One short chunk over a long cached prefix launches hq x ceil(chunk / 128) CTAs (16-32 for Llama-3-8B heads), a
// fraction of the SMs, each walking every prefix tile. Split over keys (flash-decoding's idea), the CTAs of a query
// tile each take a range of its key tiles, write unnormalized O and each row's (max, sum) to a workspace, and a merge
// kernel combines them exactly (log-sum-exp in f32).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define LOWBIT_SPLIT_HD __host__ __device__
#else
#define LOWBIT_SPLIT_HD
#endif

namespace lowbit::cuda::prefill_split {

constexpr int kMaxSplits = 16;       // the merge reads a row's (max, sum) of every split in one warp
constexpr int kMinTilesPerSplit = 4;  // fewer than this and the pipeline fill and the merge outweigh the split
constexpr int kKeyTile = 128;         // keys per tile (prefill_sm90::kKeys)

// Splits for a launch of `ctas` CTAs (after packing) on `sms` SMs (one CTA per SM fits), whose sequences have at
// most `prefix_bound` keys before their first query (an upper bound: the host knows the block table's width, not
// each kv_len). Only where the CTAs fill less than half the SMs: as many splits as keep the launch in one wave,
// each at least kMinTilesPerSplit prefix tiles, at most kMaxSplits. forced > 0 (tests, measurements) wins, capped.
inline int plan_splits(int64_t ctas, int sms, int64_t prefix_bound, int forced = 0) {
  if (forced > 0) return forced < kMaxSplits ? forced : kMaxSplits;
  if (ctas <= 0 || 2 * ctas > sms) return 1;
  int64_t s = sms / ctas;
  const int64_t by_tiles = prefix_bound / kKeyTile / kMinTilesPerSplit;
  if (s > by_tiles) s = by_tiles;
  if (s > kMaxSplits) s = kMaxSplits;
  return s < 1 ? 1 : static_cast<int>(s);
}

// Key tiles [begin, end) of split `split` of `splits` for a CTA whose keys span `tiles` tiles. Every split but the
// last stays below `splittable` tiles (keys every row of the CTA sees in full: below its first query's position,
// and with per-channel K below that position's codes end), so each of their rows sees the first key of its range
// and none needs the causal or per-channel masks; the last split takes the rest, the diagonal included. Ranges
// are near even over `tiles`; a range may be empty (a short prefix), its CTA then writes a sum of 0.
LOWBIT_SPLIT_HD inline void split_range(int tiles, int splittable, int splits, int split, int& begin, int& end) {
  auto bound = [&](int i) {
    const int b = static_cast<int>(static_cast<int64_t>(i) * tiles / splits);
    return b < splittable ? b : splittable;
  };
  begin = bound(split);
  end = split + 1 == splits ? tiles : bound(split + 1);
}

// Where the key split's non-last splits end, in keys, for a chunk whose first position is first_pos: the cached
// prefix, and with per-channel K (quantized per block of bs tokens, the newest partial block kept in f16) only the
// keys every query of the chunk sees as sealed codes (the block the chunk completes is window rows for its earlier
// queries). The dequantized copy of per-channel K copies the keys below it (rounded down to whole key tiles).
LOWBIT_SPLIT_HD inline int splittable_keys(int first_pos, int bs, bool per_channel) {
  const int bound = per_channel ? (first_pos + 1) / bs * bs : first_pos;  // blocks sealed once first_pos is written
  return first_pos < bound ? first_pos : bound;
}

// The tail split (per-channel K with the dequantized copy): splits 0..splits-2 take tiles [0, splittable) near even
// (keys every row of the CTA sees as sealed codes: the copy holds them), the last split the rest [splittable, tiles)
// (the chunk's own blocks, the window and the diagonal: the per-channel kernel's views).
LOWBIT_SPLIT_HD inline void tail_split_range(int tiles, int splittable, int splits, int split, int& begin, int& end) {
  if (split + 1 >= splits) {
    begin = splittable, end = tiles;
    return;
  }
  const int n = splits - 1;
  begin = static_cast<int>(static_cast<int64_t>(split) * splittable / n);
  end = static_cast<int>(static_cast<int64_t>(split + 1) * splittable / n);
}

}  // namespace lowbit::cuda::prefill_split
