// Paged attention on the CPU, blocked online softmax (FlashAttention-style):
// one work item = (sequence, KV head, tile of up to kTileTokens query tokens). All G query heads of
// the GQA group and all tokens of the tile form the item's query rows, so every K/V row is
// dequantized once into f32 and used by every row while it is hot. Per cache block the item
//   1. dequantizes the block's K rows, computes scores S = Q Kᵀ (Q pre-scaled),
//   2. updates each row's running max m and sum l, rescaling its accumulator by exp(m_old - m_new),
//   3. dequantizes the block's V rows and accumulates P V.
// Causal masking: row r at position pos_r sees keys 0..pos_r only. f32 throughout.
// Few items (a single long decode) are split along the keys and merged afterwards (see Partials).
#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/kv_quant_cpu.h"

namespace lowbit::cpu {

namespace {

constexpr int64_t kTileTokens = 16;
constexpr int64_t kMinSplitKeys = 256;  // below this a part costs less than its merge and scheduling

struct WorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t tok0;  // first query token of the tile, relative to the sequence's q_start
  int32_t ntok;
  int64_t key_begin, key_end;  // keys [begin, end) of the sequence this item reads (block aligned begin)
  int64_t partial;             // -1: writes `out`; else slot in the split-KV partials buffer
};

// Split-KV ("flash decoding"): when a step has fewer (sequence, head, tile) items than threads can
// share, e.g. one long decode, items split their key range; each part leaves its running max m,
// sum l and unnormalised accumulator, and a merge rescales the parts to the common max.
struct Partials {
  int64_t rows, D;
  std::vector<float> data;
  float* m(int64_t p) { return data.data() + p * rows * (D + 2); }
  float* l(int64_t p) { return m(p) + rows; }
  float* acc(int64_t p) { return m(p) + 2 * rows; }
};

struct Scratch {
  std::vector<float> q, acc, m, l, k, k_window, v, s;
  void resize(int64_t rows, int64_t bs, int64_t D) {
    q.resize(rows * D);
    acc.resize(rows * D);
    m.resize(rows);
    l.resize(rows);
    k.resize(bs * D);
    k_window.resize(bs * D);
    v.resize(bs * D);
    s.resize(rows * bs);
  }
};

struct Context {
  const KVCache& cache;
  int layer;
  const Tensor& q;
  Tensor& out;
  const AttentionMeta& meta;
  float scale;
  int64_t Hq, Hkv, G, D, bs;
  ScalarType k_type, v_type;
  bool k_per_channel;
  const uint8_t* v_base;  // K goes through load_k_block_rows (per-channel K and its window)
  const float* vp_base;
  int64_t v_row_bytes;
};

void store_output(const Context& c, const WorkItem& w, int64_t r, const float* row) {
  const int64_t t = c.meta.q_start[w.seq] + w.tok0 + r / c.G;
  const int64_t h = w.kv_head * c.G + r % c.G;
  const int64_t o_elem = bytes_for(c.out.dtype(), 1);
  store_row_f32(row, c.out.dtype(), c.D,
                static_cast<char*>(c.out.data_ptr()) + (t * c.out.stride(0) + h * c.out.stride(1)) * o_elem);
}

void run_item(const Context& c, const WorkItem& w, Scratch& sc, Partials& parts) {
  const int64_t G = c.G, D = c.D, bs = c.bs;
  const int64_t rows = w.ntok * G;
  const int64_t q_len = c.meta.q_len[w.seq], kv_len = c.meta.kv_len[w.seq];
  const int64_t first_pos = kv_len - q_len + w.tok0;  // position of the tile's first query
  const int32_t* table = c.meta.block_tables.data<int32_t>() + w.seq * c.meta.block_tables.stride(0);

  // Query rows r = i * G + g: token i of the tile, head kv_head * G + g; pre-multiplied by scale.
  const int64_t q_elem = bytes_for(c.q.dtype(), 1);
  const char* q_base = static_cast<const char*>(c.q.data_ptr());
  for (int64_t i = 0; i < w.ntok; ++i) {
    const int64_t t = c.meta.q_start[w.seq] + w.tok0 + i;
    for (int64_t g = 0; g < G; ++g) {
      float* qr = sc.q.data() + (i * G + g) * D;
      load_row_f32(q_base + (t * c.q.stride(0) + (w.kv_head * G + g) * c.q.stride(1)) * q_elem, c.q.dtype(), D, qr);
      for (int64_t d = 0; d < D; ++d) qr[d] *= c.scale;
    }
  }
  std::fill_n(sc.acc.data(), rows * D, 0.f);
  std::fill_n(sc.m.data(), rows, -std::numeric_limits<float>::infinity());
  std::fill_n(sc.l.data(), rows, 0.f);

  for (int64_t blk = w.key_begin / bs; blk * bs < w.key_end; ++blk) {
    const int64_t key0 = blk * bs;
    const int64_t n = std::min(bs, w.key_end - key0);  // keys of this block any row can see
    const int64_t row0 = (static_cast<int64_t>(table[blk]) * c.Hkv + w.kv_head) * bs;  // first cache row
    // Per-channel K: a query sees the block quantized once the block was full at its own position
    // (key0 + bs <= pos + 1), else as the f16 residual window, as token-by-token decoding would. A block
    // filled in this step is read both ways by the step's queries (the window outlives the step).
    const int64_t block_last = key0 + bs - 1;
    const bool full = key0 + bs <= kv_len;
    load_k_block_rows(c.cache, c.layer, table[blk], w.kv_head, n, full, sc.k.data());
    const bool mixed = c.k_per_channel && full && first_pos < block_last;
    if (mixed) load_k_block_rows(c.cache, c.layer, table[blk], w.kv_head, n, false, sc.k_window.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = std::min(n, first_pos + r / G - key0 + 1);  // causal: keys <= pos_r
      if (visible <= 0) continue;
      const float* qr = sc.q.data() + r * D;
      float* sr = sc.s.data() + r * bs;
      const bool window = mixed && first_pos + r / G < block_last;
      simd::dot_rows(qr, window ? sc.k_window.data() : sc.k.data(), visible, D, sr);
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) block_max = std::max(block_max, sr[j]);
      const float m_new = std::max(sc.m[r], block_max);
      const bool first = sc.m[r] == -std::numeric_limits<float>::infinity();
      const float alpha = first ? 0.f : simd::exp_nonpositive(sc.m[r] - m_new);
      const float sum = simd::exp_shifted_sum(sr, visible, m_new);
      if (alpha != 1.f) {
        float* ar = sc.acc.data() + r * D;
        for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
      }
      sc.l[r] = sc.l[r] * alpha + sum;
      sc.m[r] = m_new;
    }
    load_kv_rows(c.v_base + row0 * c.v_row_bytes, c.vp_base ? c.vp_base + 2 * row0 : nullptr, c.v_type, n, D,
                 sc.v.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = std::min(n, first_pos + r / G - key0 + 1);
      const float* sr = sc.s.data() + r * bs;
      float* ar = sc.acc.data() + r * D;
      if (visible > 0) simd::accumulate_rows(sr, sc.v.data(), visible, D, ar);
    }
  }

  if (w.partial >= 0) {
    std::copy_n(sc.m.data(), rows, parts.m(w.partial));
    std::copy_n(sc.l.data(), rows, parts.l(w.partial));
    std::copy_n(sc.acc.data(), rows * D, parts.acc(w.partial));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* ar = sc.acc.data() + r * D;
    const float inv_l = 1.f / sc.l[r];  // l >= 1: the row's max key contributes exp(0)
    for (int64_t d = 0; d < D; ++d) ar[d] *= inv_l;
    store_output(c, w, r, ar);
  }
}

// Combines the parts [first, first + count) of one split item (the same tile, head and sequence).
void merge_parts(const Context& c, const WorkItem& w, int64_t count, Partials& parts, std::vector<float>& row) {
  const int64_t rows = w.ntok * c.G, D = c.D;
  for (int64_t r = 0; r < rows; ++r) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < count; ++p) mx = std::max(mx, parts.m(w.partial + p)[r]);
    std::fill_n(row.data(), D, 0.f);
    float l = 0.f;
    for (int64_t p = 0; p < count; ++p) {
      const float mp = parts.m(w.partial + p)[r];
      if (mp == -std::numeric_limits<float>::infinity()) continue;  // part saw no key of this row
      const float wgt = std::exp(mp - mx);
      l += parts.l(w.partial + p)[r] * wgt;
      simd::accumulate_rows(&wgt, parts.acc(w.partial + p) + r * D, 1, D, row.data());
    }
    for (int64_t d = 0; d < D; ++d) row[d] /= l;
    store_output(c, w, r, row.data());
  }
}

}  // namespace

void paged_attention_cpu(const Tensor& q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale,
                         Tensor& out, int64_t max_keys_per_item) {
  const KVCacheConfig& cfg = cache.config();
  const Tensor& vp = cache.v_params(layer);
  const Context c{cache,
                  layer,
                  q,
                  out,
                  meta,
                  scale,
                  q.size(1),
                  cfg.num_kv_heads,
                  q.size(1) / cfg.num_kv_heads,
                  cfg.head_dim,
                  cfg.block_size,
                  cfg.k_type,
                  cfg.v_type,
                  cfg.k_per_channel,
                  static_cast<const uint8_t*>(cache.v_data(layer).data_ptr()),
                  vp.defined() ? vp.data<float>() : nullptr,
                  bytes_for(cfg.v_type, cfg.head_dim)};

  std::vector<WorkItem> items;
  int64_t total_keys = 0;
  for (size_t s = 0; s < meta.q_len.size(); ++s) {
    for (int32_t t0 = 0; t0 < meta.q_len[s]; t0 += kTileTokens) {
      const int32_t ntok = static_cast<int32_t>(std::min<int64_t>(kTileTokens, meta.q_len[s] - t0));
      const int64_t keys = meta.kv_len[s] - meta.q_len[s] + t0 + ntok;  // causal: up to the tile's last query
      for (int32_t h = 0; h < cfg.num_kv_heads; ++h) {
        items.push_back({static_cast<int32_t>(s), h, t0, ntok, 0, keys, -1});
        total_keys += keys;
      }
    }
  }

  // Split long items when there are too few to keep every thread busy.
  int64_t chunk = max_keys_per_item;
  if (chunk <= 0) {
#ifdef _OPENMP
    const int64_t threads = omp_get_max_threads();
#else
    const int64_t threads = 1;
#endif
    const int64_t target = 2 * threads;
    chunk = static_cast<int64_t>(items.size()) >= target || threads == 1
                ? std::numeric_limits<int64_t>::max()
                : std::max<int64_t>(kMinSplitKeys, (total_keys + target - 1) / target);
  }
  if (chunk != std::numeric_limits<int64_t>::max()) chunk = (chunk + c.bs - 1) / c.bs * c.bs;  // whole blocks
  std::vector<WorkItem> run;  // the items threads execute
  std::vector<std::pair<WorkItem, int64_t>> merges;  // split items: (first part, number of parts)
  int64_t n_parts = 0;
  for (const WorkItem& w : items) {
    if (w.key_end <= chunk) {
      run.push_back(w);
      continue;
    }
    const int64_t count = (w.key_end + chunk - 1) / chunk;
    WorkItem first = w;
    first.partial = n_parts;
    merges.emplace_back(first, count);
    for (int64_t p = 0; p < count; ++p) {
      WorkItem part = w;
      part.key_begin = p * chunk;
      part.key_end = std::min(w.key_end, (p + 1) * chunk);
      part.partial = n_parts + p;
      run.push_back(part);
    }
    n_parts += count;
  }
  const int64_t rows_max = kTileTokens * c.G;
  Partials parts{rows_max, c.D, std::vector<float>(static_cast<size_t>(n_parts * rows_max * (c.D + 2)))};

  const int64_t n_run = static_cast<int64_t>(run.size()), n_merge = static_cast<int64_t>(merges.size());
#pragma omp parallel
  {
    Scratch sc;
    sc.resize(rows_max, c.bs, c.D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_run; ++i) run_item(c, run[static_cast<size_t>(i)], sc, parts);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_merge; ++i)
      merge_parts(c, merges[static_cast<size_t>(i)].first, merges[static_cast<size_t>(i)].second, parts, sc.v);
  }
}

}  // namespace lowbit::cpu
