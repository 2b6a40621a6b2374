// int8-activation GEMM (w8a8, QoQ w4a8, LiquidGEMM w4a8): s8 x s8 products accumulated in int32,
// bit-exact. One _mm256_madd_epi16 multiplies a tile's 8 rows x one k pair by the broadcast
// activation pair and sums each row's two products into its int32 lane (|sum| <= 2 * 128 * 128).
// qoq/liquid prefill makes the s8 weights per group first (gemm_unpack_avx2.h: q * s + c); their decode
// works on the u4 values directly (u4_decode below).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "quant/pack_cpu_layout.h"
#include "kernels/cpu/gemm_unpack_avx2.h"

namespace lowbit::cpu {
namespace {

constexpr int kRowBlock = 4;

struct W8Loader {
  const int8_t* base;
  int64_t pairs;
  const int8_t* p = nullptr;
  void tile(int64_t t) { p = base + t * pairs * kPairElems; }
  void group(int64_t) {}
  __m256i load(int64_t kp) const {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kp * kPairElems)));
  }
};

struct U4Loader {  // qoq / liquid
  const uint8_t* base;
  const int16_t* params;
  int64_t pairs, groups;
  const uint8_t* p = nullptr;
  const int16_t* tp = nullptr;
  __m256i mul{}, add{};
  void tile(int64_t t) {
    p = base + t * num_k_quads(2 * pairs) * kQuadBytes;
    tp = params + t * groups * (kU4AuxBytes / 2);
  }
  void group(int64_t g) {
    mul = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp + g * (kU4AuxBytes / 2)));
    add = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp + g * (kU4AuxBytes / 2) + 16));
  }
  __m256i load(int64_t kp) const { return u4_to_s8_lanes(p, kp, mul, add); }
};

struct Shape {
  int64_t m, pairs, group_pairs, groups, n;
};

template <int MB, class L>
inline void tile_dot(L& ld, const Shape& s, const int16_t* x, int64_t ldx, __m256i* out) {
  __m256i acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_si256();
  for (int64_t g = 0; g < s.groups; ++g) {
    ld.group(g);
    const int64_t kp_end = std::min(s.pairs, (g + 1) * s.group_pairs);
    for (int64_t kp = g * s.group_pairs; kp < kp_end; ++kp) {
      const __m256i wv = ld.load(kp);
      for (int i = 0; i < MB; ++i) {
        int32_t pair;
        __builtin_memcpy(&pair, x + i * ldx + 2 * kp, 4);
        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(wv, _mm256_set1_epi32(pair)));
      }
    }
  }
  for (int i = 0; i < MB; ++i) out[i] = acc[i];
}

template <class L>
void rows_block(L& ld, const Shape& s, const int16_t* x, int64_t ldx, int mb, __m256i* out) {
  switch (mb) {
    case 1: tile_dot<1>(ld, s, x, ldx, out); break;
    case 2: tile_dot<2>(ld, s, x, ldx, out); break;
    case 3: tile_dot<3>(ld, s, x, ldx, out); break;
    default: tile_dot<4>(ld, s, x, ldx, out); break;
  }
}

inline void store_rows(__m256i v, int64_t t, int64_t n, int32_t* acc) {
  const int64_t n0 = t * kTileRows;
  if (n0 + kTileRows <= n) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + n0), v);
  } else {
    alignas(32) int32_t tmp[kTileRows];
    _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), v);
    for (int64_t r = 0; n0 + r < n; ++r) acc[n0 + r] = tmp[r];
  }
}

// Prefill panel: two tiles' s8 weights widened to int16, buf[pair][32] (tile A lanes 0..15, B 16..31),
// times up to 6 token rows at a time: 2 madd + 2 add per row and k pair.
constexpr int kPanelLanes = 2 * kPairElems;
constexpr int kPanelRowBlock = 6;

template <int MB>
void panel_rows(const int16_t* buf, int64_t pairs, const int16_t* x, int64_t ldx, __m256i (*out)[2]) {
  __m256i acc[MB][2];
  for (int i = 0; i < MB; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buf + kp * kPanelLanes));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buf + kp * kPanelLanes + kPairElems));
    for (int i = 0; i < MB; ++i) {
      int32_t pair;
      __builtin_memcpy(&pair, x + i * ldx + 2 * kp, 4);
      const __m256i xb = _mm256_set1_epi32(pair);
      acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(w0, xb));
      acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(w1, xb));
    }
  }
  for (int i = 0; i < MB; ++i) out[i][0] = acc[i][0], out[i][1] = acc[i][1];
}

void panel_block(const int16_t* buf, int64_t pairs, const int16_t* x, int64_t ldx, int mb, __m256i (*out)[2]) {
  switch (mb) {
    case 1: panel_rows<1>(buf, pairs, x, ldx, out); break;
    case 2: panel_rows<2>(buf, pairs, x, ldx, out); break;
    case 3: panel_rows<3>(buf, pairs, x, ldx, out); break;
    case 4: panel_rows<4>(buf, pairs, x, ldx, out); break;
    case 5: panel_rows<5>(buf, pairs, x, ldx, out); break;
    default: panel_rows<6>(buf, pairs, x, ldx, out); break;
  }
}

template <class L>
void run(L loader, const Shape& s, const int16_t* x, int64_t ldx, int32_t* acc) {
  const int64_t tiles = num_row_tiles(s.n);
  if (s.m <= kRowBlock) {  // decode: stream each weight once
#pragma omp parallel for schedule(static) if (worth_parallel(s.m, s.n, 2 * s.pairs))
    for (int64_t t = 0; t < tiles; ++t) {
      L ld = loader;
      ld.tile(t);
      __m256i out[kRowBlock];
      rows_block(ld, s, x, ldx, static_cast<int>(s.m), out);
      for (int64_t i = 0; i < s.m; ++i) store_rows(out[i], t, s.n, acc + i * s.n);
    }
    return;
  }
  // prefill: unpack a two-tile panel once, then all token rows over it
  const int64_t panels = (tiles + 1) / 2;
#pragma omp parallel if (worth_parallel(s.m, s.n, 2 * s.pairs))
  {
    L ld = loader;
    std::vector<int16_t> buf(s.pairs * kPanelLanes, 0);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t t0 = 2 * p;
      for (int half = 0; half < 2 && t0 + half < tiles; ++half) {
        ld.tile(t0 + half);
        for (int64_t g = 0; g < s.groups; ++g) {
          ld.group(g);
          const int64_t kp_end = std::min(s.pairs, (g + 1) * s.group_pairs);
          for (int64_t kp = g * s.group_pairs; kp < kp_end; ++kp)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.data() + kp * kPanelLanes + half * kPairElems),
                                ld.load(kp));
        }
      }
      __m256i out[kPanelRowBlock][2];
      for (int64_t i0 = 0; i0 < s.m; i0 += kPanelRowBlock) {
        const int mb = static_cast<int>(std::min<int64_t>(kPanelRowBlock, s.m - i0));
        panel_block(buf.data(), s.pairs, x + i0 * ldx, ldx, mb, out);
        for (int i = 0; i < mb; ++i)
          for (int half = 0; half < 2 && t0 + half < tiles; ++half)
            store_rows(out[i][half], t0 + half, s.n, acc + (i0 + i) * s.n);
      }
    }
  }
}

// Decode for qoq/liquid (m <= 4): per group, maddubs(q u8, x s8) sums 4 k per row and lane, the group
// total is scaled by the integer s and the addend times sum(x) is added:
//   sum_k (q*s + add) * x = s * sum_k q*x + add * sum_k x   (exact: pack_cpu guarantees q*s + add is
// the s8 weight, without wrap). |sum_k q*x| <= 15 * 127 * group, so int32 never overflows.
template <int MB>
void u4_decode_tile(const uint8_t* td, const uint8_t* ta, int64_t quads, int64_t group_quads, int64_t groups,
                    const int8_t* x8, int64_t ldx8, const int32_t* sumx, __m256i* out) {
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_si256();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i part[MB];
    for (int i = 0; i < MB; ++i) part[i] = _mm256_setzero_si256();
    const int64_t q_end = std::min(quads, (g + 1) * group_quads);
    for (int64_t qd = g * group_quads; qd < q_end; ++qd) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(td + qd * kQuadBytes));
      const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
      const __m256i wq = _mm256_and_si256(both, mask);  // rows 0..3 | rows 4..7, 4 k each
      for (int i = 0; i < MB; ++i) {
        int32_t xs;
        __builtin_memcpy(&xs, x8 + i * ldx8 + 4 * qd, 4);
        part[i] = _mm256_add_epi32(part[i], _mm256_madd_epi16(_mm256_maddubs_epi16(wq, _mm256_set1_epi32(xs)), ones));
      }
    }
    const __m256i mul = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ta + g * kU4AuxBytes + 64));
    const __m256i add = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ta + g * kU4AuxBytes + 96));
    for (int i = 0; i < MB; ++i)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_add_epi32(_mm256_mullo_epi32(part[i], mul),
                                                         _mm256_mullo_epi32(add, _mm256_set1_epi32(sumx[i * groups + g]))));
  }
  for (int i = 0; i < MB; ++i) out[i] = acc[i];
}

void u4_decode(const PackedWeight& w, const int16_t* xq, int64_t ldx, int64_t m, int32_t* acc) {
  const int64_t quads = num_k_quads(w.k), group_quads = w.group / 4, groups = (w.k + w.group - 1) / w.group;
  const int64_t ldx8 = 4 * quads, tiles = num_row_tiles(w.n);
  std::vector<int8_t> x8(m * ldx8, 0);
  std::vector<int32_t> sumx(m * groups, 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < w.k; ++c) {
      x8[i * ldx8 + c] = static_cast<int8_t>(xq[i * ldx + c]);
      sumx[i * groups + c / w.group] += xq[i * ldx + c];
    }
  const uint8_t* data = w.data.data<uint8_t>();
  const uint8_t* aux = w.aux.data<uint8_t>();
#pragma omp parallel for schedule(static) if (worth_parallel(m, w.n, w.k))
  for (int64_t t = 0; t < tiles; ++t) {
    const uint8_t* td = data + t * quads * kQuadBytes;
    const uint8_t* ta = aux + t * groups * kU4AuxBytes;
    __m256i out[kRowBlock];
    switch (m) {
      case 1: u4_decode_tile<1>(td, ta, quads, group_quads, groups, x8.data(), ldx8, sumx.data(), out); break;
      case 2: u4_decode_tile<2>(td, ta, quads, group_quads, groups, x8.data(), ldx8, sumx.data(), out); break;
      case 3: u4_decode_tile<3>(td, ta, quads, group_quads, groups, x8.data(), ldx8, sumx.data(), out); break;
      default: u4_decode_tile<4>(td, ta, quads, group_quads, groups, x8.data(), ldx8, sumx.data(), out); break;
    }
    for (int64_t i = 0; i < m; ++i) store_rows(out[i], t, w.n, acc + i * w.n);
  }
}

// Per-block int32 sums for activations with one scale per block of k (COMET FMPQ): acc[i][b][n] sums
// the k of block b only. The loader's group changes are followed pair by pair, so blocks and groups
// need not coincide.
template <class L>
void run_blocked(L loader, const Shape& s, int64_t block_pairs, const int16_t* x, int64_t ldx, int32_t* acc) {
  const int64_t tiles = num_row_tiles(s.n), blocks = (s.pairs + block_pairs - 1) / block_pairs;
#pragma omp parallel for schedule(static) if (worth_parallel(s.m, s.n, 2 * s.pairs))
  for (int64_t t = 0; t < tiles; ++t) {
    L ld = loader;
    ld.tile(t);
    for (int64_t i0 = 0; i0 < s.m; i0 += kRowBlock) {
      const int64_t mb = std::min<int64_t>(kRowBlock, s.m - i0);
      int64_t group = -1;
      for (int64_t b = 0; b < blocks; ++b) {
        __m256i a[kRowBlock];
        for (int i = 0; i < kRowBlock; ++i) a[i] = _mm256_setzero_si256();
        const int64_t kp_end = std::min(s.pairs, (b + 1) * block_pairs);
        for (int64_t kp = b * block_pairs; kp < kp_end; ++kp) {
          if (kp / s.group_pairs != group) ld.group(group = kp / s.group_pairs);
          const __m256i wv = ld.load(kp);
          for (int64_t i = 0; i < mb; ++i) {
            int32_t pair;
            __builtin_memcpy(&pair, x + (i0 + i) * ldx + 2 * kp, 4);
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(wv, _mm256_set1_epi32(pair)));
          }
        }
        for (int64_t i = 0; i < mb; ++i) store_rows(a[i], t, s.n, acc + ((i0 + i) * blocks + b) * s.n);
      }
    }
  }
}

}  // namespace

void gemm_s8act_cpu(const int16_t* xq, int64_t ldx, int64_t m, const PackedWeight& w, int32_t* acc) {
  const int64_t pairs = num_k_pairs(w.k);
  Shape s{m, pairs, pairs, 1, w.n};
  if (w.group > 0) {
    s.group_pairs = w.group / 2;
    s.groups = (pairs + s.group_pairs - 1) / s.group_pairs;
  }
  switch (w.format) {
    case WeightFormat::w8: run(W8Loader{w.data.data<int8_t>(), pairs}, s, xq, ldx, acc); break;
    case WeightFormat::qoq:
    case WeightFormat::liquid:
      if (m <= kRowBlock) {
        u4_decode(w, xq, ldx, m, acc);
        break;
      }
      run(U4Loader{w.data.data<uint8_t>(), reinterpret_cast<const int16_t*>(w.aux.data_ptr()), pairs, s.groups}, s,
          xq, ldx, acc);
      break;
    default:
      LOWBIT_NOT_SUPPORTED("gemm_s8act_cpu: int8 activations need a w8, qoq or liquid weight, got ",
                           name_of(w.format));
  }
}

}  // namespace lowbit::cpu

namespace lowbit::cpu {

void gemm_s8act_blocked_cpu(const int16_t* xq, int64_t ldx, int64_t m, const PackedWeight& w, int64_t block,
                            int32_t* acc) {
  const int64_t pairs = num_k_pairs(w.k);
  Shape s{m, pairs, pairs, 1, w.n};
  if (w.group > 0) {
    s.group_pairs = w.group / 2;
    s.groups = (pairs + s.group_pairs - 1) / s.group_pairs;
  }
  switch (w.format) {
    case WeightFormat::w8: run_blocked(W8Loader{w.data.data<int8_t>(), pairs}, s, block / 2, xq, ldx, acc); break;
    case WeightFormat::qoq:
    case WeightFormat::liquid:
      run_blocked(U4Loader{w.data.data<uint8_t>(), reinterpret_cast<const int16_t*>(w.aux.data_ptr()), pairs, s.groups},
                  s, block / 2, xq, ldx, acc);
      break;
    default:
      LOWBIT_NOT_SUPPORTED("gemm_s8act_blocked_cpu: int8 activations need a w8, qoq or liquid weight, got ",
                           name_of(w.format));
  }
}

}  // namespace lowbit::cpu
