// The CPU packed weight layout, shared by the packer (quant/pack_cpu.cpp) and the CPU GEMM kernels.
//
// Output channels are cut into tiles of kTileRows = 8 rows (one AVX2 register of f32 per row set) and
// k into pairs (kp covers k = 2kp, 2kp+1). For each (tile, pair) the 16 weights sit together in the
// order  e = row * 2 + kk  (row 0..7 inside the tile, kk 0..1), so that
//   - the float kernels get [r0k0 r0k1 r1k0 r1k1 r2k0 r2k1 r3k0 r3k1] and the same for rows 4..7 as two
//     8-lane f32 vectors and multiply them by the broadcast pair (x[2kp], x[2kp+1]);
//   - the int8 kernels get all 16 as one 16-lane int16 vector and feed _mm256_madd_epi16 with the
//     broadcast int16 pair of the quantized activation: one madd = 8 rows x 2 k, exact in int32.
// Rows past n and the k past an odd k are zero (zero weight, zero scale).
//
// data  f32/f16/bf16/e4m3/s8 (f32, f16, bf16, e4m3, w8 formats): [tiles, pairs, 16] elements.
//       u8 (qoq, liquid): [tiles, quads, 16] bytes, quads = ceil(k / 4); byte j of (tile, quad) holds
//       (row j / 4, k j % 4) in its low nibble and (row 4 + j / 4, k j % 4) in its high nibble, so that
//       (b & 15 | b >> 4) as 32 bytes feed _mm256_maddubs_epi16 with the broadcast 4 s8 activations
//       and one _mm256_madd_epi16 by ones leaves row r's 4-k sum in int32 lane r. The pair order e
//       above is one byte shuffle away (gemm_unpack_avx2.h).
// w8/e4m3: scales f32 [tiles * 8] (per output channel).
// grouped w8 (group > 0, GGUF Q8_0): scales f32 [tiles, G, 8]; aux f32 [tiles, G, 16], the scale of lane e
//          (row e / 2), so the float kernel multiplies the 16 s8 values of a pair by it: q * s exactly.
// w4 (float activations only, so it has its own per-k layout): data u8 [tiles, k, 4]; the 32-bit word
//          of (tile, k) holds row r in bits 4r..4r+3, row 7 stored as q ^ 8. One broadcast 32-bit load
//          ANDed with the lane mask 0xF << 4r and converted to f32 gives q * 16^r exactly (row 7: the
//          sign bit turns q ^ 8 into (q - 8) * 2^28), so unpacking costs two instructions per k.
//          scales/zeros f16 [tiles, G, 8] (original values, for unpack); zeros undefined when symmetric
//          and not given (zero = 8). aux f32 [tiles, G, 16]: lanes 0..7 the multiplier s * 16^-r,
//          lanes 8..15 the addend -z*s (row 7: (8 - z) * s), so w = v * mul + add equals (q - z) * s
//          rounded once. Decode sums v * x per group and applies mul and add * sum(x) at group end.
// qoq    : scales/zeros u8 [tiles, G, 8]; channel_scales f32 [tiles * 8]. aux u8 [tiles, G, 128]: int16
//          lanes 0..15 multiplier s and 16..31 addend -z*s per lane e, then int32 lanes 0..7 s and 8..15
//          -z*s per row; s8 = q*s - z*s (QServe §3 progressive group quant: subtraction after
//          multiplication). The packer rejects weights whose s8 value would leave [-128, 127].
// liquid : scales (step s) / zeros (offset a) u8 [tiles, G, 8]; channel_scales f32 [tiles * 8]. aux as
//          qoq with addend a - 128: LiquidGEMM §4 dequant (q*s + a) XOR 0x80 in u8 equals
//          q*s + a - 128 because (u XOR 0x80) read as s8 is u - 128 for any byte u.
// Groups must have even size so that a k pair never straddles two groups (the last group may be short);
// qoq/liquid groups must be a multiple of 4 (k quads).
#pragma once
#include <cstdint>

#include "lowbit/quant/format.h"

namespace lowbit::cpu {

constexpr int kTileRows = 8;
constexpr int kPairElems = 2 * kTileRows;  // weights per (tile, k pair)
constexpr int kGroupParamLanes = 32;       // aux entries per (tile, group): 16 multipliers + 16 addends

inline int64_t num_row_tiles(int64_t n) { return (n + kTileRows - 1) / kTileRows; }
inline int64_t num_k_pairs(int64_t k) { return (k + 1) / 2; }
inline int64_t num_k_quads(int64_t k) { return (k + 3) / 4; }
constexpr int kQuadBytes = 16;   // qoq/liquid bytes per (tile, k quad)
constexpr int kU4AuxBytes = 128;  // qoq/liquid aux bytes per (tile, group)

// Below this many multiply-adds a GEMM runs on the calling thread: waking the OpenMP team costs more
// than it saves (and on a busy machine a late worker stalls the join).
constexpr int64_t kParallelMacs = int64_t(1) << 17;
inline bool worth_parallel(int64_t m, int64_t n, int64_t k) { return m * n * k >= kParallelMacs; }

}  // namespace lowbit::cpu
