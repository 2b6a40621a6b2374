// A mixed step (running decodes first, then prefill chunks) splits its attention by phase: the plan's
// decode kernel gets the leading decode sequences, its prefill kernel the rest (ops::paged_attention).
// Here both are recording wrappers around the CPU kernel, so the test sees which sequences each got and
// checks the split output against the same step on one kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lowbit/kernels/plan.h"
#include "lowbit/kernels/registry.h"
#include "lowbit/ops/ops.h"

using namespace lowbit;

namespace {

struct Call {
  std::string kernel;
  std::vector<int32_t> q_start, q_len, kv_len;
  int64_t table_rows;
};
std::vector<Call> g_calls;

const kernels::AttnKernel& cpu_kernel() {
  for (const kernels::AttnKernel& k : kernels::attention_kernels())
    if (std::string(k.name) == "paged_attention_cpu") return k;
  throw std::runtime_error("paged_attention_cpu is not registered");
}

template <const char* Name>
void record(const kernels::AttnArgs& a) {
  g_calls.push_back({Name, a.meta.q_start, a.meta.q_len, a.meta.kv_len, a.meta.block_tables.size(0)});
  cpu_kernel().launch(a);
}
constexpr char kDecodeName[] = "decode", kPrefillName[] = "prefill";
const kernels::AttnKernel kDecode{"test_decode", "", nullptr, nullptr, record<kDecodeName>};
const kernels::AttnKernel kPrefill{"test_prefill", "", nullptr, nullptr, record<kPrefillName>};

struct Seq {
  int q_len, kv_len;
};

// A cache holding every sequence's keys (random, written by kv_write) and the step's meta and q.
struct Step {
  KVCache cache;
  AttentionMeta meta;
  Tensor q;

  Step(const std::vector<Seq>& seqs, uint32_t seed) : cache(config(seqs)) {
    constexpr int64_t bs = 16, width = 8;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const auto random = [&](int64_t rows, int64_t heads) {
      Tensor x = Tensor::empty({rows, heads, 64}, ScalarType::f32);
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = nd(rng);
      return x;
    };
    meta.block_tables = Tensor::empty({int64_t(seqs.size()), width}, ScalarType::s32);
    int32_t next_block = 0, row = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      int32_t* table = meta.block_tables.data<int32_t>() + s * width;
      for (int64_t b = 0; b < width; ++b) table[b] = b * bs < seqs[s].kv_len ? next_block++ : -1;
      // Every key of the sequence goes into the cache (the new ones too: kv_len counts them).
      AttentionMeta w;
      w.slot_mapping = Tensor::empty({seqs[s].kv_len}, ScalarType::s32);
      for (int32_t p = 0; p < seqs[s].kv_len; ++p) w.slot_mapping.data<int32_t>()[p] = table[p / bs] * bs + p % bs;
      ops::kv_write(cache, 0, random(seqs[s].kv_len, 2), random(seqs[s].kv_len, 2), w);
      meta.q_start.push_back(row);
      meta.q_len.push_back(seqs[s].q_len);
      meta.kv_len.push_back(seqs[s].kv_len);
      row += seqs[s].q_len;
    }
    meta.slot_mapping = Tensor::empty({row}, ScalarType::s32);
    q = random(row, 6);
  }

  static KVCacheConfig config(const std::vector<Seq>& seqs) {
    KVCacheConfig c;
    c.num_layers = 1;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.block_size = 16;
    c.num_blocks = 0;
    for (const Seq& s : seqs) c.num_blocks += (s.kv_len + 15) / 16;
    c.k_type = c.v_type = ScalarType::f16;
    return c;
  }

  Tensor run(const kernels::AttentionPlan& plan) {
    Tensor out = Tensor::empty(q.shape(), ScalarType::f32);
    out.fill_bytes_(0xff);  // NaN: every row must be written
    ops::paged_attention(q, cache, 0, meta, 0.125f, out, plan);
    return out;
  }
};

kernels::AttentionPlan plan(bool split) {
  kernels::AttentionPlan p;
  p.decode = &kDecode;
  p.prefill = &kPrefill;
  p.tuning.split_mixed_attention = split;
  return p;
}

}  // namespace

TEST(AttentionMixedSplit, DecodePrefixStopsAtTheFirstRowThatIsNotADecode) {
  AttentionMeta m;
  EXPECT_EQ(decode_prefix(m), 0u);
  m.q_start = {0, 1, 2, 3, 7};
  m.q_len = {1, 1, 1, 4, 1};
  m.kv_len = {9, 3, 1, 4, 20};
  EXPECT_EQ(decode_prefix(m), 3u);  // the decode row after the chunk is not in row order with the others
  m.q_len[0] = 2;
  m.q_start = {0, 2, 3, 4, 8};
  EXPECT_EQ(decode_prefix(m), 0u);
  m.q_start = {0, 2, 3};  // one query each but a gap in the rows: not a decode run
  m.q_len = {1, 1, 1};
  m.kv_len = {5, 5, 5};
  EXPECT_EQ(decode_prefix(m), 1u);
}

TEST(AttentionMixedSplit, MetaPartSlicesVectorsAndTableRows) {
  Step s({{1, 20}, {1, 3}, {7, 40}, {5, 5}}, 3);
  const AttentionMeta p = meta_part(s.meta, 2, 2, Tensor());
  EXPECT_EQ(p.q_start, (std::vector<int32_t>{2, 9}));  // absolute rows
  EXPECT_EQ(p.q_len, (std::vector<int32_t>{7, 5}));
  EXPECT_EQ(p.kv_len, (std::vector<int32_t>{40, 5}));
  EXPECT_EQ(p.max_q_len, 7);
  EXPECT_EQ(p.max_kv_len, 40);
  ASSERT_EQ(p.block_tables.size(0), 2);
  EXPECT_EQ(p.block_tables.data<int32_t>()[0], s.meta.block_tables.data<int32_t>()[2 * s.meta.block_tables.size(1)]);
}

TEST(AttentionMixedSplit, DecodeRowsGoToTheDecodeKernelAndTheOutputMatchesOneKernel) {
  // Three running decodes, two prefill chunks (one over a cached prefix), and a decode row after them.
  Step s({{1, 37}, {1, 5}, {1, 1}, {23, 23}, {5, 50}, {1, 9}}, 11);
  g_calls.clear();
  const Tensor whole = s.run(plan(false));
  ASSERT_EQ(g_calls.size(), 1u);
  EXPECT_EQ(g_calls[0].kernel, "prefill");
  EXPECT_EQ(g_calls[0].table_rows, 6);

  g_calls.clear();
  const Tensor split = s.run(plan(true));
  ASSERT_EQ(g_calls.size(), 2u);
  EXPECT_EQ(g_calls[0].kernel, "decode");
  EXPECT_EQ(g_calls[0].q_start, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(g_calls[0].kv_len, (std::vector<int32_t>{37, 5, 1}));
  EXPECT_EQ(g_calls[0].table_rows, 3);
  EXPECT_EQ(g_calls[1].kernel, "prefill");
  EXPECT_EQ(g_calls[1].q_start, (std::vector<int32_t>{3, 26, 31}));
  EXPECT_EQ(g_calls[1].q_len, (std::vector<int32_t>{23, 5, 1}));
  EXPECT_EQ(g_calls[1].table_rows, 3);

  // The CPU kernel treats every (query, head) alone, so the split changes no value.
  ASSERT_EQ(split.numel(), whole.numel());
  for (int64_t i = 0; i < split.numel(); ++i) {
    const float a = split.data<float>()[i], b = whole.data<float>()[i];
    ASSERT_TRUE(std::isfinite(a)) << "row element " << i << " not written by the split step";
    ASSERT_NEAR(a, b, 1e-6f * (1.f + std::abs(b))) << "element " << i;
  }
}

TEST(AttentionMixedSplit, StepsThatAreNotMixedRunOneKernel) {
  Step decode({{1, 12}, {1, 30}, {1, 2}}, 5);
  g_calls.clear();
  decode.run(plan(true));
  ASSERT_EQ(g_calls.size(), 1u);
  EXPECT_EQ(g_calls[0].kernel, "decode");

  Step prefill({{9, 12}, {1, 30}}, 6);  // the decode row comes after a chunk: no decode prefix
  g_calls.clear();
  prefill.run(plan(true));
  ASSERT_EQ(g_calls.size(), 1u);
  EXPECT_EQ(g_calls[0].kernel, "prefill");
}
