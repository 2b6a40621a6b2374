// The KV formats of issue 16 on the CPU: 2-bit per-token rows, per-channel K blocks (4 and 2 bits) and
// the f16 residual window, checked against a float64 model of the format written here from the
// documented rules (kv_cache.h): codes bit-exact (away from rounding ties), the window's rows, blocks
// quantized exactly when they fill, copy-on-write and block reuse across a group boundary, and paged
// attention (decode, prefill, chunked prefill over a written prefix) against float64 attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <tuple>

#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/kv_quant_cpu.h"
#include "lowbit/kv/kv_cache.h"

using namespace lowbit;

namespace {

// The reference's (scale, zero) over values xs: the format's float rule.
std::pair<float, float> ref_params(const std::vector<float>& xs, int bits) {
  const float lo = *std::min_element(xs.begin(), xs.end()), hi = *std::max_element(xs.begin(), xs.end());
  return {(hi - lo) / static_cast<float>((1 << bits) - 1), lo};
}

// The code of x: the format's rule is float arithmetic, round half to even (bit-exact with the kernel).
int ref_code(float x, float scale, float zero, int bits, bool* tie) {
  *tie = false;
  if (!(scale > 0.f)) return 0;
  const float t = (x - zero) / scale;
  return int(std::clamp(std::nearbyint(t), 0.f, float((1 << bits) - 1)));
}

int packed_code(const uint8_t* row, int64_t i, int bits) {
  const int per_byte = 8 / bits;
  return (row[i / per_byte] >> (bits * (i % per_byte))) & ((1 << bits) - 1);
}

float f16_round(float x) { return f16_bits_to_f32(f32_to_f16_bits(x)); }

std::vector<float> random_values(int64_t n, std::mt19937& rng, float outlier_every = 7) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = nd(rng) * (i % int64_t(outlier_every) == 3 ? 5.f : 1.f) + 0.3f;
  return x;
}

TEST(KvFormats, TwoBitRowsQuantizeBitExactAndPackFourPerByte) {
  std::mt19937 rng(1);
  for (int64_t n : {64, 128, 6, 3}) {
    const std::vector<float> x = random_values(n, rng);
    std::vector<uint8_t> codes(static_cast<size_t>((n + 3) / 4), 0xee);
    float params[2];
    cpu::quantize_kv_row(x.data(), n, 2, codes.data(), params);
    const auto [scale, zero] = ref_params(x, 2);
    ASSERT_EQ(params[0], scale);
    ASSERT_EQ(params[1], zero);
    int seen_max = 0;
    for (int64_t i = 0; i < n; ++i) {
      bool tie = false;
      const int want = ref_code(x[i], scale, zero, 2, &tie);
      const int got = packed_code(codes.data(), i, 2);
      if (!tie) ASSERT_EQ(got, want) << "n " << n << " i " << i;
      seen_max = std::max(seen_max, got);
    }
    EXPECT_EQ(seen_max, 3) << "the row maximum must take the top code";
    std::vector<float> back(static_cast<size_t>(n));
    cpu::dequantize_kv_row(codes.data(), n, 2, params, back.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_FLOAT_EQ(back[i], packed_code(codes.data(), i, 2) * scale + zero);
      ASSERT_LE(std::abs(back[i] - x[i]), scale * 0.5f * 1.0001f + 1e-6f);
    }
  }
  // A constant row stores scale 0 and code 0, and reads back exactly.
  std::vector<float> c(8, -0.625f);
  uint8_t codes[2];
  float params[2];
  cpu::quantize_kv_row(c.data(), 8, 2, codes, params);
  EXPECT_EQ(params[0], 0.f);
  EXPECT_EQ(codes[0] | codes[1], 0);
}

TEST(KvFormats, PerChannelBlocksQuantizeEachChannelOverTheTokens) {
  std::mt19937 rng(2);
  const int64_t rows = 32, D = 64;
  for (int bits : {4, 2}) {
    std::vector<float> x = random_values(rows * D, rng, 11);
    for (int64_t r = 0; r < rows; ++r) x[r * D + 5] = 2.5f;  // channel 5 constant: scale 0
    const ScalarType t = bits == 4 ? ScalarType::u4 : ScalarType::u2;
    const int64_t row_bytes = bytes_for(t, D);
    std::vector<uint8_t> codes(static_cast<size_t>(rows * row_bytes));
    std::vector<float> params(static_cast<size_t>(2 * D));
    cpu::quantize_k_block_per_channel(x.data(), rows, D, bits, codes.data(), params.data());
    for (int64_t d = 0; d < D; ++d) {
      std::vector<float> col;
      for (int64_t r = 0; r < rows; ++r) col.push_back(x[r * D + d]);
      const auto [scale, zero] = ref_params(col, bits);
      ASSERT_EQ(params[d], scale) << "channel " << d;
      ASSERT_EQ(params[D + d], zero) << "channel " << d;
      for (int64_t r = 0; r < rows; ++r) {
        bool tie = false;
        const int want = ref_code(col[r], scale, zero, bits, &tie);
        if (!tie) ASSERT_EQ(packed_code(codes.data() + r * row_bytes, d, bits), want) << "row " << r << " ch " << d;
      }
    }
    EXPECT_EQ(params[5], 0.f);
    std::vector<float> back(static_cast<size_t>(rows * D));
    cpu::load_k_rows_per_channel(codes.data(), params.data(), t, rows, D, back.data());
    for (int64_t i = 0; i < rows * D; ++i) {
      const int64_t d = i % D;
      ASSERT_NEAR(back[i], x[i], params[d] * 0.5f * 1.0001f + 1e-6f) << "bits " << bits << " i " << i;
    }
    EXPECT_EQ(back[3 * D + 5], 2.5f);
  }
}

// ---- a paged cache driven through kv_write, with a float64 model of what it must hold ----------------

struct Format {
  ScalarType k, v;
  bool k_per_channel;
  const char* name;
};

// Float64 model of one sequence's cache: the K/V values written, per position.
struct RefSeq {
  std::vector<int32_t> blocks;             // block table
  std::vector<std::vector<float>> k, v;    // [position][head * D]
};

class Harness {
 public:
  Harness(const Format& f, int hkv, int D, int bs, int64_t num_blocks) : f_(f), hkv_(hkv), D_(D), bs_(bs) {
    KVCacheConfig c;
    c.num_layers = 2;
    c.num_kv_heads = hkv;
    c.head_dim = D;
    c.block_size = bs;
    c.num_blocks = num_blocks;
    c.k_type = f.k;
    c.v_type = f.v;
    c.k_per_channel = f.k_per_channel;
    cache_ = std::make_unique<KVCache>(c);
  }
  KVCache& cache() { return *cache_; }
  static constexpr int kLayer = 1;

  // Appends n tokens of random K/V to `s` (its table must cover them) through kv_write.
  void append(RefSeq& s, int64_t n, std::mt19937& rng) { append_step({{&s, n}}, rng); }
  // One step: appends n_i tokens to each sequence in a single kv_write, as the engine does.
  void append_step(const std::vector<std::pair<RefSeq*, int64_t>>& seqs, std::mt19937& rng) {
    int64_t n = 0;
    for (const auto& e : seqs) n += e.second;
    Tensor k = Tensor::empty({n, hkv_, D_}, ScalarType::f32), v = Tensor::empty({n, hkv_, D_}, ScalarType::f32);
    Tensor slots = Tensor::empty({n}, ScalarType::s32);
    std::normal_distribution<float> nd(0.f, 1.f);
    int64_t t = 0;
    for (const auto& [sp, count] : seqs) {
      RefSeq& s = *sp;
      for (int64_t i = 0; i < count; ++i, ++t) {
        std::vector<float> kr(size_t(hkv_ * D_)), vr(size_t(hkv_ * D_));
        for (int64_t j = 0; j < hkv_ * D_; ++j) {
          // K has per-channel offsets and outlier channels (what per-channel K is for).
          kr[j] = nd(rng) + (j % D_ == 7 ? 6.f : 0.f) + 0.1f * float(j % 5);
          vr[j] = nd(rng);
        }
        std::copy(kr.begin(), kr.end(), k.data<float>() + t * hkv_ * D_);
        std::copy(vr.begin(), vr.end(), v.data<float>() + t * hkv_ * D_);
        const int64_t pos = int64_t(s.k.size());
        s.k.push_back(kr);
        s.v.push_back(vr);
        slots.data<int32_t>()[t] = s.blocks.at(size_t(pos / bs_)) * bs_ + int32_t(pos % bs_);
      }
    }
    cpu::kv_write_cpu(*cache_, kLayer, k, v, slots);
  }

  // What a query at position `qpos` must read for key position p of `s` (head h, channel d), in
  // float64: per-channel K blocks are quantized once full at the query's own position, else f16.
  double ref_k(const RefSeq& s, int64_t qpos, int64_t p, int h, int d) const {
    const float x = s.k[p][h * D_ + d];
    if (!is_quantized_kv_type(f_.k)) return f_.k == ScalarType::f32 ? x : f16_round(x);
    const int bits = bits_of(f_.k);
    std::vector<float> xs;
    if (f_.k_per_channel) {
      const int64_t b0 = p / bs_ * bs_;
      if (b0 + bs_ > qpos + 1) return f16_round(x);  // residual window
      const auto key = std::make_tuple(&s, b0, h, d);
      auto it = memo_.find(key);
      if (it == memo_.end()) {
        for (int64_t r = b0; r < b0 + bs_; ++r) xs.push_back(f16_round(s.k[r][h * D_ + d]));
        it = memo_.emplace(key, ref_params(xs, bits)).first;
      }
      const auto [scale, zero] = it->second;
      bool tie = false;
      return double(ref_code(f16_round(x), scale, zero, bits, &tie)) * scale + zero;
    }
    for (int c = 0; c < D_; ++c) xs.push_back(s.k[p][h * D_ + c]);
    const auto [scale, zero] = ref_params(xs, bits);
    bool tie = false;
    return double(ref_code(x, scale, zero, bits, &tie)) * scale + zero;
  }
  double ref_v(const RefSeq& s, int64_t p, int h, int d) const {
    const float x = s.v[p][h * D_ + d];
    if (!is_quantized_kv_type(f_.v)) return f_.v == ScalarType::f32 ? x : f16_round(x);
    std::vector<float> xs;
    for (int c = 0; c < D_; ++c) xs.push_back(s.v[p][h * D_ + c]);
    const auto [scale, zero] = ref_params(xs, bits_of(f_.v));
    bool tie = false;
    return double(ref_code(x, scale, zero, bits_of(f_.v), &tie)) * scale + zero;
  }
  // Runs attention for the last q_len[i] tokens of each sequence; checks against float64 attention.
  void check_attention(const std::vector<const RefSeq*>& seqs, const std::vector<int>& q_lens, int hq,
                       std::mt19937& rng, double tol, int64_t max_keys_per_item = 0) {
    const int64_t G = hq / hkv_;
    AttentionMeta meta;
    int64_t T = 0, max_blocks = 1;
    for (const RefSeq* s : seqs) max_blocks = std::max<int64_t>(max_blocks, int64_t(s->blocks.size()));
    meta.block_tables = Tensor::empty({int64_t(seqs.size()), max_blocks}, ScalarType::s32);
    std::fill_n(meta.block_tables.data<int32_t>(), meta.block_tables.numel(), -1);
    for (size_t i = 0; i < seqs.size(); ++i) {
      meta.q_start.push_back(int32_t(T));
      meta.q_len.push_back(q_lens[i]);
      meta.kv_len.push_back(int32_t(seqs[i]->k.size()));
      T += q_lens[i];
      std::copy(seqs[i]->blocks.begin(), seqs[i]->blocks.end(), meta.block_tables.data<int32_t>() + i * max_blocks);
    }
    Tensor q = Tensor::empty({T, hq, D_}, ScalarType::f32);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = u(rng);
    Tensor out = Tensor::empty({T, hq, D_}, ScalarType::f32);
    out.fill_bytes_(0xff);
    const double scale = 1.0 / std::sqrt(double(D_));
    cpu::paged_attention_cpu(q, *cache_, kLayer, meta, float(scale), out, max_keys_per_item);
    double worst = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const RefSeq& s = *seqs[i];
      const int64_t kl = int64_t(s.k.size());
      // The reference cache of this sequence, decoded once: K as seen by a query at the last position (every
      // full block quantized), K in f16 (the window view of blocks a query sees before they fill), and V.
      const int64_t HD = int64_t(hkv_) * D_;
      std::vector<double> k_last(size_t(kl * HD)), k_win(size_t(kl * HD)), v_ref(size_t(kl * HD));
      for (int64_t p = 0; p < kl; ++p)
        for (int hh = 0; hh < hkv_; ++hh)
          for (int d = 0; d < D_; ++d) {
            const size_t at = size_t(p * HD + hh * D_ + d);
            k_last[at] = ref_k(s, kl - 1, p, hh, d);
            k_win[at] = ref_k(s, /*qpos=*/-1, p, hh, d);  // no block is full at position -1: f16
            v_ref[at] = ref_v(s, p, hh, d);
          }
      for (int64_t j = 0; j < q_lens[i]; ++j) {
        const int64_t t = meta.q_start[i] + j, pos = kl - q_lens[i] + j;
        for (int64_t h = 0; h < hq; ++h) {
          const int kvh = int(h / G);
          std::vector<double> sc(size_t(pos + 1));
          double mx = -1e300;
          for (int64_t p = 0; p <= pos; ++p) {
            // Quantized once the key's block was full at the query's position, else the f16 window.
            const bool quantized = !f_.k_per_channel || (p / bs_ + 1) * bs_ <= pos + 1;
            const double* kr = (quantized ? k_last.data() : k_win.data()) + p * HD + kvh * D_;
            double dot = 0;
            for (int d = 0; d < D_; ++d) dot += double(q.data<float>()[(t * hq + h) * D_ + d]) * kr[d];
            sc[p] = dot * scale;
            mx = std::max(mx, sc[p]);
          }
          double l = 0;
          for (auto& x : sc) l += (x = std::exp(x - mx));
          for (int d = 0; d < D_; ++d) {
            double o = 0;
            for (int64_t p = 0; p <= pos; ++p) o += sc[p] * v_ref[size_t(p * HD + kvh * D_ + d)];
            const double got = out.data<float>()[(t * hq + h) * D_ + d];
            ASSERT_TRUE(std::isfinite(got)) << "row " << t << " head " << h;
            worst = std::max(worst, std::abs(got - o / l));
          }
        }
      }
    }
    EXPECT_LE(worst, tol) << f_.name;
  }

 private:
  Format f_;
  int hkv_, D_, bs_;
  // Per-channel (scale, zero) of a full block, by (its first row, head, channel): rows never change.
  mutable std::map<std::tuple<const RefSeq*, int64_t, int, int>, std::pair<float, float>> memo_;
  std::unique_ptr<KVCache> cache_;
};

// The first four quantize K per channel (KvWindowCases runs on those).
const Format kFormats[] = {
    {ScalarType::u4, ScalarType::u4, true, "kc4v4"},  {ScalarType::u2, ScalarType::u2, true, "kc2v2"},
    {ScalarType::u4, ScalarType::u2, true, "kc4v2"},  {ScalarType::u2, ScalarType::f16, true, "kc2v16"},
    {ScalarType::u2, ScalarType::u2, false, "kv2"},   {ScalarType::u4, ScalarType::u2, false, "k4v2"},
    {ScalarType::u2, ScalarType::u8, false, "k2v8"},
};

void PrintTo(const Format& f, std::ostream* os) { *os << f.name; }

class KvFormatCases : public ::testing::TestWithParam<Format> {};
class KvWindowCases : public ::testing::TestWithParam<Format> {};  // per-channel K formats only

// The residual window: rows of a partly filled block stay f16 in the side store, and the token that
// fills a block quantizes it per channel (bit-exact codes) and drops its window entry.
TEST_P(KvWindowCases, WindowFillsThenQuantizesExactlyAtTheBlockBoundary) {
  const Format f = GetParam();
  const int hkv = 2, D = 64, bs = 16;
  Harness hs(f, hkv, D, bs, 8);
  std::mt19937 rng(3);
  RefSeq s;
  s.blocks = {5, 2, 7};
  const KResidualStore& store = hs.cache().k_residual(Harness::kLayer);
  const int bits = bits_of(f.k);
  const int64_t row_bytes = bytes_for(f.k, D);
  // 1 token, then up to 15 (block 5 full exactly), then 1, then 20 (block 2 fills mid-write).
  int64_t len = 0;
  for (int64_t n : {1, 14, 1, 20}) {
    const int64_t full_before = len / bs;
    hs.append(s, n, rng);
    len += n;
    const int64_t full = len / bs;
    // Blocks filled by this write keep their window rows until the next write (this step's queries).
    EXPECT_EQ(store.num_entries(), full - full_before + (len % bs ? 1 : 0)) << "after " << len << " tokens";
    for (int64_t b = 0; b < full; ++b) {
      const int32_t id = s.blocks[size_t(b)];
      if (b < full_before) EXPECT_EQ(store.find(id), nullptr) << "a block full before left the window";
      for (int h = 0; h < hkv; ++h) {
        const uint8_t* codes = static_cast<const uint8_t*>(hs.cache().k_data(Harness::kLayer).data_ptr()) +
                               (int64_t(id) * hkv + h) * bs * row_bytes;
        const float* p = hs.cache().k_params(Harness::kLayer).data<float>() + (int64_t(id) * hkv + h) * 2 * D;
        for (int d = 0; d < D; ++d) {
          std::vector<float> col;
          for (int64_t r = 0; r < bs; ++r) col.push_back(f16_round(s.k[size_t(b * bs + r)][h * D + d]));
          const auto [scale, zero] = ref_params(col, bits);
          ASSERT_EQ(p[d], scale);
          ASSERT_EQ(p[D + d], zero);
          for (int64_t r = 0; r < bs; ++r) {
            bool tie = false;
            const int want = ref_code(col[size_t(r)], scale, zero, bits, &tie);
            if (!tie) ASSERT_EQ(packed_code(codes + r * row_bytes, d, bits), want);
          }
        }
      }
    }
    if (len % bs) {
      const int32_t id = s.blocks[size_t(full)];
      const uint16_t* res = store.find(id);
      ASSERT_NE(res, nullptr);
      for (int64_t r = 0; r < len % bs; ++r)
        for (int h = 0; h < hkv; ++h)
          for (int d = 0; d < D; ++d)
            ASSERT_EQ(res[(h * bs + r) * D + d], f32_to_f16_bits(s.k[size_t(full * bs + r)][h * D + d]));
    }
  }
}

// Decode, prefill from scratch, chunked prefill over a written prefix, and single tokens, at lengths
// around the group/block boundaries, GQA groups 1, 3, 8 and 16, head_dim 64, 128 and 256, and split-KV
// parts (forced to one block) that start inside a sequence.
TEST_P(KvFormatCases, AttentionMatchesFloat64AtEveryWindowFill) {
  const Format f = GetParam();
  for (const auto& [hq, hkv, D, bs, split] :
       {std::tuple{3, 3, 64, 16, 0}, std::tuple{9, 3, 64, 32, 0}, std::tuple{8, 1, 128, 16, 0},
        std::tuple{16, 1, 256, 16, 0}, std::tuple{6, 2, 64, 16, 16}}) {
    SCOPED_TRACE(std::string(f.name) + " hq " + std::to_string(hq) + " hkv " + std::to_string(hkv) + " D " +
                 std::to_string(D) + " bs " + std::to_string(bs) + " split " + std::to_string(split));
    Harness hs(f, hkv, D, bs, 40);
    std::mt19937 rng(4 + hq);
    // (prefix written earlier, tokens of this step): decode at 1, bs-1, bs, bs+1, 3bs+5 keys;
    // prefill of 2bs+3 from scratch; chunked prefill of 7 over a 2bs-2 prefix (crosses a boundary).
    const std::vector<std::pair<int, int>> shape = {{0, 1},      {bs - 2, 1},  {bs - 1, 1},     {bs, 1},
                                                    {3 * bs + 4, 1}, {0, 2 * bs + 3}, {2 * bs - 2, 7}};
    std::vector<RefSeq> seqs(shape.size());
    int32_t next = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      const int total = shape[i].first + shape[i].second;
      for (int b = 0; b * bs < total; ++b) seqs[i].blocks.push_back((next++ * 7) % 40);  // scattered ids
      if (shape[i].first) hs.append(seqs[i], shape[i].first, rng);
    }
    ASSERT_LE(next, 40);
    std::vector<const RefSeq*> ptrs;
    std::vector<int> q_lens;
    std::vector<std::pair<RefSeq*, int64_t>> step;
    for (size_t i = 0; i < shape.size(); ++i) {
      step.emplace_back(&seqs[i], shape[i].second);
      ptrs.push_back(&seqs[i]);
      q_lens.push_back(shape[i].second);
    }
    hs.append_step(step, rng);
    hs.check_attention(ptrs, q_lens, hq, rng, 2e-5, split);
  }
}

// Forks and preemption across a group boundary: a copied partial block carries its window, the two
// sequences then fill (and quantize) their own copies differently; a freed partial block reused by
// another sequence serves that sequence's rows; recomputing a preempted sequence reproduces it exactly.
TEST_P(KvFormatCases, ForkAndReuseAcrossTheBoundary) {
  const Format f = GetParam();
  const int hq = 4, hkv = 2, D = 64, bs = 16;
  Harness hs(f, hkv, D, bs, 12);
  std::mt19937 rng(5);
  RefSeq a;
  a.blocks = {3, 8};
  hs.append(a, 20, rng);  // block 3 full, block 8 holds 4 window tokens
  RefSeq b = a;           // the fork: shares block 3, copies the partial block before writing
  b.blocks = {3, 10};
  hs.cache().copy_block(8, 10);
  a.blocks.push_back(1);
  b.blocks.push_back(4);
  // One step: a fills block 8 and crosses into a third block, b fills its copy with other tokens.
  hs.append_step({{&a, 13}, {&b, 15}}, rng);
  hs.check_attention({&a, &b}, {13, 15}, hq, rng, 2e-5);
  hs.append_step({{&a, 1}, {&b, 1}}, rng);  // then a decode step each
  hs.check_attention({&a, &b}, {1, 1}, hq, rng, 2e-5);

  // Preempt b: its blocks go back to the pool; c takes b's partial third block (stale window rows).
  RefSeq c;
  c.blocks = {4};
  hs.append_step({{&c, 5}, {&a, 1}}, rng);
  hs.check_attention({&c, &a}, {5, 1}, hq, rng, 2e-5);

  // Recompute a from scratch into other blocks: the same tokens give the same cache, bit for bit.
  RefSeq again;
  again.blocks = {6, 7, 9};
  again.k = {};
  std::mt19937 same(5);
  hs.append(again, 20, same);
  EXPECT_EQ(again.k, std::vector<std::vector<float>>(a.k.begin(), a.k.begin() + 20));
  const int64_t row_bytes = bytes_for(f.k, D);
  const auto* kd = static_cast<const uint8_t*>(hs.cache().k_data(Harness::kLayer).data_ptr());
  const int64_t block_bytes = int64_t(hkv) * bs * row_bytes;
  EXPECT_EQ(0, std::memcmp(kd + 6 * block_bytes, kd + 3 * block_bytes, size_t(block_bytes)));
}

INSTANTIATE_TEST_SUITE_P(Formats, KvFormatCases, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(PerChannelK, KvWindowCases, ::testing::ValuesIn(kFormats, kFormats + 4),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(KvFormats, CacheRefusesBadPerChannelConfigsAndGpuFormats) {
  KVCacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.block_size = 16;
  c.num_blocks = 2;
  c.k_type = ScalarType::u8;
  c.v_type = ScalarType::u4;
  c.k_per_channel = true;
  try {
    KVCache x(c);
    FAIL() << "per-channel u8 K accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("per-channel K (k_per_channel) needs k_type u4 or u2, got u8"),
              std::string::npos)
        << e.what();
  }
  c.k_type = ScalarType::u2;
  c.head_dim = 66;
  try {
    KVCache x(c);
    FAIL() << "u2 with head_dim 66 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("packs 4 values per byte and needs head_dim divisible by 4, got 66"),
              std::string::npos)
        << e.what();
  }
  c.head_dim = 64;
  KVCache ok(c);
  EXPECT_EQ(ok.k_params(0).shape(), (Shape{2, 1, 2, 64}));
  // (u2: 16 bytes of codes + 2 * 64 floats over 16 tokens = 32) + (u4 V: 32 + 8)
  EXPECT_EQ(KVCache::bytes_per_token(c), 16 + 32 + 32 + 8);
  // 2-bit K runs on GPUs too, per token or per channel; per channel it needs groups (blocks) and head_dim that
  // are multiples of 16, checked before any memory is taken (so also in a build without CUDA).
  c.device = Device::cuda(0);
  c.block_size = 8;
  try {
    KVCache x(c);
    FAIL() << "GPU per-channel K with 8-token groups accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kValue);
    EXPECT_NE(std::string(e.what()).find("per-channel K on cuda:0 needs block_size (the K group) and head_dim "
                                         "multiples of 16, got 8 and 64"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
