// CPU paged attention vs a dense float64 reference: every K/V type pair, head_dim 64..256, MHA/GQA/
// MQA with odd head counts, block sizes 16/32/64, one batch mixing decode, prefill, chunked prefill
// and a prefill longer than one query tile. Cache contents are written byte by byte by the test
// (random codes and params, never through kv_write) and decoded independently here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "lowbit/ops/ops.h"
#include "kernels/cpu/attention_cpu.h"

using namespace lowbit;

namespace {

const ScalarType kKvTypes[] = {ScalarType::f32, ScalarType::f16, ScalarType::bf16, ScalarType::u8, ScalarType::u4};

// Fills one cache side with random content and returns its decoded values, indexed
// [block][head][row][d] flattened like the cache.
std::vector<double> fill_random(const Tensor& data, const Tensor& params, std::mt19937& rng) {
  const ScalarType t = data.dtype();
  const int64_t n = data.numel(), D = data.size(3);
  std::vector<double> decoded(static_cast<size_t>(n));
  std::uniform_real_distribution<float> val(-1.f, 1.f), scale(0.02f, 0.15f), zero(-1.2f, 0.f);
  auto* bytes = static_cast<uint8_t*>(data.data_ptr());
  if (t == ScalarType::f32) {
    for (int64_t i = 0; i < n; ++i) decoded[i] = data.data<float>()[i] = val(rng);
  } else if (t == ScalarType::f16 || t == ScalarType::bf16) {
    auto* p = data.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) {
      const float x = val(rng);
      p[i] = t == ScalarType::f16 ? f32_to_f16_bits(x) : f32_to_bf16_bits(x);
      decoded[i] = t == ScalarType::f16 ? f16_bits_to_f32(p[i]) : bf16_bits_to_f32(p[i]);
    }
  } else {
    const int bits = bits_of(t);
    float* pr = params.data<float>();
    const int64_t rows = n / D;
    for (int64_t r = 0; r < rows; ++r) {
      pr[2 * r] = scale(rng) * (bits == 8 ? 1.f / 16 : 1.f);
      pr[2 * r + 1] = zero(rng);
    }
    for (int64_t i = 0; i < bytes_for(t, n); ++i) bytes[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < n; ++i) {
      const int code = bits == 8 ? bytes[i] : (bytes[i / 2] >> (4 * (i % 2))) & 0xf;
      const int64_t r = i / D;
      decoded[i] = code * static_cast<double>(pr[2 * r]) + pr[2 * r + 1];
    }
  }
  return decoded;
}

double rounding_of(ScalarType t) {
  return t == ScalarType::f32 ? 0x1p-24 : t == ScalarType::f16 ? 0x1p-11 : 0x1p-8;
}

struct SeqSpec {
  int q_len, kv_len;
};

struct Case {
  ScalarType k_type, v_type, q_type, out_type;
  int head_dim, hq, hkv, block_size;
  float q_amplitude = 2.f;  // large values make the softmax peaky (scores ~ +-100)
  int64_t max_keys_per_item = 0;  // > 0 forces split-KV parts
};

// Runs one mixed batch and compares with the float64 reference; returns the max error seen
// relative to the tolerance (<= 1 passes).
void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(std::string("k ") + name_of(c.k_type) + " v " + name_of(c.v_type) + " q " + name_of(c.q_type) +
               " out " + name_of(c.out_type) + " D " + std::to_string(c.head_dim) + " Hq " + std::to_string(c.hq) +
               " Hkv " + std::to_string(c.hkv) + " bs " + std::to_string(c.block_size));
  std::mt19937 rng(seed);
  // decode, prefill from scratch, chunked prefill, decode of the first token, prefill > one tile.
  const std::vector<SeqSpec> seqs = {{1, 37}, {23, 23}, {5, 50}, {1, 1}, {19, 70}};
  const int64_t D = c.head_dim, bs = c.block_size;
  int64_t blocks_total = 0, max_blocks = 0;
  for (auto s : seqs) {
    blocks_total += (s.kv_len + bs - 1) / bs;
    max_blocks = std::max<int64_t>(max_blocks, (s.kv_len + bs - 1) / bs);
  }
  KVCacheConfig cfg;
  cfg.num_layers = 2;
  cfg.num_kv_heads = c.hkv;
  cfg.head_dim = c.head_dim;
  cfg.block_size = c.block_size;
  cfg.num_blocks = blocks_total + 3;
  cfg.k_type = c.k_type;
  cfg.v_type = c.v_type;
  KVCache cache(cfg);
  const int layer = 1;
  const std::vector<double> kd = fill_random(cache.k_data(layer), cache.k_params(layer), rng);
  const std::vector<double> vd = fill_random(cache.v_data(layer), cache.v_params(layer), rng);

  // Scattered blocks: a random permutation hands each sequence non-consecutive blocks.
  std::vector<int32_t> perm(static_cast<size_t>(cfg.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  ops::AttentionMeta meta;
  meta.block_tables = Tensor::empty({static_cast<int64_t>(seqs.size()), max_blocks + 1}, ScalarType::s32);
  std::fill_n(meta.block_tables.data<int32_t>(), meta.block_tables.numel(), -1);
  int64_t T = 0;
  size_t next_block = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    meta.q_start.push_back(static_cast<int32_t>(T));
    meta.q_len.push_back(seqs[s].q_len);
    meta.kv_len.push_back(seqs[s].kv_len);
    T += seqs[s].q_len;
    for (int64_t b = 0; b * bs < seqs[s].kv_len; ++b)
      meta.block_tables.data<int32_t>()[s * (max_blocks + 1) + b] = perm[next_block++];
  }

  Tensor q = Tensor::empty({T, c.hq, D}, c.q_type);
  std::vector<double> qd(static_cast<size_t>(q.numel()));
  {
    std::uniform_real_distribution<float> val(-1.f, 1.f);
    std::vector<float> tmp(static_cast<size_t>(q.numel()));
    for (auto& x : tmp) x = c.q_amplitude * val(rng);
    for (int64_t i = 0; i < q.numel(); ++i) {
      if (c.q_type == ScalarType::f32) qd[i] = q.data<float>()[i] = tmp[i];
      if (c.q_type == ScalarType::f16) qd[i] = f16_bits_to_f32(q.data<uint16_t>()[i] = f32_to_f16_bits(tmp[i]));
      if (c.q_type == ScalarType::bf16) qd[i] = bf16_bits_to_f32(q.data<uint16_t>()[i] = f32_to_bf16_bits(tmp[i]));
    }
  }
  Tensor out = Tensor::empty({T, c.hq, D}, c.out_type);
  out.fill_bytes_(0xff);  // NaN in every float format
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  cpu::paged_attention_cpu(q, cache, layer, meta, scale, out, c.max_keys_per_item);

  // Dense float64 reference over the decoded cache.
  const int64_t G = c.hq / c.hkv;
  // f32 scores carry ~1e-7 relative error, so the absolute error grows with their magnitude.
  const double tol_rel = rounding_of(c.out_type) * 1.01, tol_abs = 1.5e-6 * c.q_amplitude;
  double worst = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t ql = seqs[s].q_len, kl = seqs[s].kv_len;
    const int32_t* table = meta.block_tables.data<int32_t>() + s * (max_blocks + 1);
    auto kv_index = [&](int64_t pos, int64_t h) {  // flattened index of (pos, head h, d = 0)
      return ((static_cast<int64_t>(table[pos / bs]) * c.hkv + h) * bs + pos % bs) * D;
    };
    for (int64_t i = 0; i < ql; ++i) {
      const int64_t t = meta.q_start[s] + i, pos = kl - ql + i;
      for (int64_t h = 0; h < c.hq; ++h) {
        const int64_t kvh = h / G;
        std::vector<double> w(static_cast<size_t>(pos + 1));
        double mx = -1e300;
        for (int64_t p = 0; p <= pos; ++p) {
          double dotp = 0;
          for (int64_t d = 0; d < D; ++d) dotp += qd[(t * c.hq + h) * D + d] * kd[kv_index(p, kvh) + d];
          w[p] = dotp * scale;
          mx = std::max(mx, w[p]);
        }
        double sum = 0;
        for (auto& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double ref = 0;
          for (int64_t p = 0; p <= pos; ++p) ref += w[p] * vd[kv_index(p, kvh) + d];
          ref /= sum;
          const int64_t idx = (t * c.hq + h) * D + d;
          const double got = c.out_type == ScalarType::f32   ? out.data<float>()[idx]
                             : c.out_type == ScalarType::f16 ? f16_bits_to_f32(out.data<uint16_t>()[idx])
                                                             : bf16_bits_to_f32(out.data<uint16_t>()[idx]);
          ASSERT_TRUE(std::isfinite(got)) << "unwritten output at token " << t << " head " << h << " d " << d;
          const double err = std::abs(got - ref) / (tol_rel * std::abs(ref) + tol_abs);
          worst = std::max(worst, err);
          ASSERT_LE(err, 1.0) << "token " << t << " head " << h << " d " << d << " got " << got << " ref " << ref;
        }
      }
    }
  }
}

}  // namespace

class AttentionKvTypes : public ::testing::TestWithParam<std::tuple<ScalarType, ScalarType, int>> {};

TEST_P(AttentionKvTypes, MatchesFloat64Reference) {
  const auto [k, v, D] = GetParam();
  // Head layouts and block sizes rotate over the type grid so every one meets every head_dim.
  static const int heads[][2] = {{9, 3}, {5, 5}, {7, 1}};
  static const int blocks[] = {16, 32, 64};
  const int i = static_cast<int>(k) * 7 + static_cast<int>(v) * 3 + D / 16;
  const Case c{k, v, ScalarType::f32, ScalarType::f32, D, heads[i % 3][0], heads[i % 3][1], blocks[(i / 3) % 3]};
  run_case(c, 1000u + static_cast<uint32_t>(i));
}

INSTANTIATE_TEST_SUITE_P(AllTypePairs, AttentionKvTypes,
                         ::testing::Combine(::testing::ValuesIn(kKvTypes), ::testing::ValuesIn(kKvTypes),
                                            ::testing::Values(64, 80, 96, 128, 256)));

TEST(Attention, EveryHeadLayoutAndBlockSize) {
  for (auto [hq, hkv] : {std::pair{9, 3}, std::pair{5, 5}, std::pair{7, 1}, std::pair{6, 2}})
    for (int bs : {16, 32, 64})
      run_case({ScalarType::u4, ScalarType::u8, ScalarType::f32, ScalarType::f32, 64, hq, hkv, bs}, 7u + bs + hq);
}

TEST(Attention, HalfPrecisionQueriesAndOutputs) {
  for (ScalarType qt : {ScalarType::f32, ScalarType::f16, ScalarType::bf16})
    for (ScalarType ot : {ScalarType::f32, ScalarType::f16, ScalarType::bf16})
      run_case({ScalarType::f16, ScalarType::u4, qt, ot, 128, 9, 3, 16}, 77u + static_cast<uint32_t>(qt) * 5 +
                                                                              static_cast<uint32_t>(ot));
}

// Split-KV: every item split into parts of 1, 2 or 3 blocks, merged; prefill tiles too (their first
// rows see no key of later parts).
TEST(Attention, SplitKvPartsMergeExactly) {
  for (int64_t keys : {1, 40, 64}) {
    for (auto [kt, vt] : {std::pair{ScalarType::u4, ScalarType::f16}, std::pair{ScalarType::f32, ScalarType::u8}}) {
      Case c{kt, vt, ScalarType::f32, ScalarType::bf16, 80, 9, 3, 16};
      c.max_keys_per_item = keys;
      run_case(c, 300u + static_cast<uint32_t>(keys));
      c.q_amplitude = 40.f;  // parts with very different maxima
      c.out_type = ScalarType::f32;
      run_case(c, 400u + static_cast<uint32_t>(keys));
    }
  }
}

TEST(Attention, PeakySoftmaxUnderflowsCleanly) {
  for (int bs : {16, 64}) {
    Case c{ScalarType::f32, ScalarType::bf16, ScalarType::f32, ScalarType::f32, 64, 6, 2, bs};
    c.q_amplitude = 60.f;
    run_case(c, 99u + bs);
  }
}

TEST(Attention, RowsOutsideEverySequenceStayUntouched) {
  KVCacheConfig cfg;
  cfg.num_layers = 1;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 64;
  cfg.num_blocks = 2;
  KVCache cache(cfg);
  std::mt19937 rng(5);
  fill_random(cache.k_data(0), cache.k_params(0), rng);
  fill_random(cache.v_data(0), cache.v_params(0), rng);
  ops::AttentionMeta meta;
  meta.q_start = {2};  // rows 0, 1 belong to no sequence
  meta.q_len = {1};
  meta.kv_len = {20};
  meta.block_tables = Tensor::empty({1, 2}, ScalarType::s32);
  meta.block_tables.data<int32_t>()[0] = 1;
  meta.block_tables.data<int32_t>()[1] = 0;
  Tensor q = Tensor::empty({3, 2, 64}, ScalarType::f32);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
  Tensor out = Tensor::empty({3, 2, 64}, ScalarType::f32);
  out.fill_bytes_(0xff);
  cpu::paged_attention_cpu(q, cache, 0, meta, 0.125f, out);
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(std::isnan(out.data<float>()[i]), i < 2 * 2 * 64) << i;
}
