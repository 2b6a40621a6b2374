// What a caller may pin of the weight-stationary wgmma GEMMs' launch (gemm_w4a16_sm90, gemm_w4a8_sm90), and what
// they pick: tokens per tile (the wgmma n) and the split-K cluster size.
#pragma once

namespace lowbit::cuda::detail {

struct Sm90Choice {
  int split = 0;        // 0 = the cost model's, else 1, 2, 4 or 8
  int tokens = 0;       // 0 = the cost model's, else 128 or 256, or a small tile: 16, 32, 64
  bool serial = false;  // the earlier mainloop (each stage's wgmmas waited for before the next issue), for A/B timing
  bool streamk = false;  // W4A16: force stream-K (a persistent grid, equal k-block ranges per CTA)
  int ctas = 0;          // stream-K's CTAs: 0 = every resident one (tests pin fewer to reach each fix-up path)
  bool no_streamk = false;  // the model's plan without the stream-K candidate (the earlier plans, for A/B timing)
  int rows = 0;  // W4A16: weight rows per CTA, 0 = the cost model's, 128 = the plans before the wide tile, 256 = it
  int reduce = 0;  // W4A16 split-K reduction: 0 = the kernel's default, 1 = distributed shared memory, 2 = through L2
  bool one_producer = false;  // W4A8 and W4A16: the earlier one-thread producer (A/B timing)
  bool persistent = false;  // W4A8: the persistent tile loop ('sm90p'; tokens 0 = its own pick, ctas 0 = all resident)
  // W4A8 multicast pairs (two CTAs on neighbouring weight-row tiles share the activation tile; opt-in, measured 0-4%
  // slower): 0 = the plan's (off), 1 = off ('sm90x'), 2 = forced ('sm90m[:T]': one unsplit pair launch)
  int pair = 0;
  // W4A8 'sm90q...' (opt-in): the producers prefetch later stages' weights and parameters into L2 and the consumers
  // stage the tile's scales in smem (one-tile-per-CTA and stream-K launches; same plan, same sums); 2 ('sm90r...'):
  // and each row tile of a one-tile-per-CTA launch walks its k blocks from its own start (same int32 sums)
  int prefetch = 0;
  // Launch as a programmatic dependent of the kernel before on the stream (cuda/pdl.cuh): the weight and parameter
  // copies start while that kernel finishes; the activation copies (and W4A8's tuned launches' scales) wait. W4A8: its
  // one-tile-per-CTA launches; W4A16: its small tiles.
  bool pdl = false;
};

struct Sm90Plan {
  int tokens, split;
  int head;  // > 0: a first launch runs tiles [0, head) unsplit, a second the rest at `split`
  bool streamk = false;  // W4A16: one stream-K launch of `tokens`-token tiles (split and head 0)
  int rows = 128;        // W4A16: weight rows per CTA (256: the wide tile)
  bool pair = false;     // W4A8: one unsplit launch of multicast pairs (split 1, head 0)
};

}  // namespace lowbit::cuda::detail
