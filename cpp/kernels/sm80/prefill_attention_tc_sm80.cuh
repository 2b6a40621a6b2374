// Causal paged prefill attention on tensor cores (FlashAttention-2 style): f16 queries and outputs,
// head_dim 64 or 128, K and V each f16, u8, u4 or u2 with per-token (scale, zero) f32 parameters
// (include/lowbit/kv/kv_cache.h), or K per channel (u4c / u2c, below). Everything else takes the warp kernel
// (prefill_attention_sm80.cu).
//
// Grid (sequence, query head, query tile of 64 rows); 4 warps, each owns 16 query rows whose Q
// fragments (the mma A operand) stay in registers. The block walks key tiles of 64 up to the last key
// its last row sees. Each tile of K and V is gathered from the paged cache with cp.async (the page is
// looked up per key row, so any block_size works) into two pipeline stages, so tile t + 1 loads while
// tile t is computed; u8/u4/u2 codes land raw and are dequantized in f32 (code * scale + zero, rounded
// once to f16) just before use. The f16 tiles have rows padded by 16 bytes (ldmatrix without bank
// conflicts). Per warp:
//   S[16, 64]  = Q · Kᵀ        mma.sync m16n8k16, K rows are the n side (ldmatrix, not transposed)
//   online softmax per row in f32, log2 domain (exp2f); the causal mask only on diagonal tiles
//   O[16, D]  += P · V         P from the S accumulators as A operand, V by ldmatrix.trans
// and at the end O / l is stored as f16. Query rows past q_len compute on zeros and are not stored.
//
// u4c (per-channel K, KIVI style; the K group is the cache block, bs % 16 == 0 and bs >= 32, so a key
// tile touches at most two blocks): the codes are u4 rows as above, the (scale, zero) are per channel of
// a block (k_params [blocks, Hkv, 2, D]), and a block is also readable as its f16 window rows
// (PrefillTcArgs::k_window, slot window_map[block]). A query at position p sees key block
// [b0, b0 + bs) as codes iff p >= b0 + bs - 1, else as window rows: keys [0, codes_end(p)) as codes,
// [codes_end(p), p] as window rows. So a tile is read as codes (dequantized with the staged channel
// parameters of its blocks), as window rows (copied into the f16 K tile along with the tile's codes
// and V, not dequantized), or, where block ends fall inside the query tile's positions (near the
// diagonal), both: the tile body runs once per view (window rows first, then the codes replace them)
// with complementary masks over the same V tile, which the online softmax sums exactly (masked entries
// add 0). Tiles every row sees as codes cost what a u4 tile does, plus the per-channel parameters. u2c is
// the same with 2-bit codes.
//
// This header holds the kernel template; each instance file compiles one (head_dim, K, V) of it and
// prefill_attention_tc_sm80.cu dispatches through the generated table (prefill_attention_tc_launch.h).
#pragma once
#include <cuda_fp16.h>

#include "kernels/sm80/attention_math.cuh"
#include "kernels/sm80/kv_type.cuh"
#include "kernels/sm80/prefill_attention_tc_launch.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace prefill_tc {

using TcArgs = PrefillTcArgs;
constexpr int kKTile = 64;           // keys per tile
// Resident blocks per SM the registers must allow: 4 (128 per thread) for D 64, 3 (168) for D 128.
template <int D>
constexpr int min_blocks() { return D == 64 ? 4 : 3; }
constexpr int kPad = 8;              // halves per smem row: rows start 4 banks apart, ldmatrix conflict free
constexpr float kNoScore = -1e30f;   // finite "minus infinity": exp2(kNoScore - m) underflows to 0

using attn_math::pack_half2;

__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// "memory": keep these after the __syncthreads that publishes the tile.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const __half* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ inline void cp_async16_zfill(void* smem, const void* gmem, bool valid) {  // zeros when !valid
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ inline void cp_async8_zfill(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 8 : 0) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory"); }

// Shared memory of one side (K or V), two pipeline stages. f16 rows are copied straight into two
// padded f16 tiles; u8/u4 rows and their (scale, zero) land raw in two staging areas and are
// dequantized into one padded f16 tile just before use. u4c stages the scales and zeros of the tile's
// two blocks in one area, not two (refilled for the next tile once this one is dequantized): the
// second would cost D = 128 a resident block per SM on sm_80. Every piece is a multiple of 16 bytes.
template <KvType T, int D>
struct SideSmem {
  static constexpr bool kDirect = T == KvType::f16;
  static constexpr bool kPerChannel = kv_per_channel<T>();
  static constexpr int kRowBytes = D * kv_bits<T>() / 8;
  static constexpr int kTileBytes = kKTile * (D + kPad) * 2;
  static constexpr int kRawBytes = kKTile * kRowBytes;
  static constexpr int kParamBytes = kPerChannel ? 2 * (2 * D * 4) : kKTile * 8;  // u4c: 2 blocks x (scales, zeros)
  static constexpr int kParamStages = kPerChannel ? 1 : 2;
  static constexpr int kBytes = kDirect ? 2 * kTileBytes : kTileBytes + 2 * kRawBytes + kParamStages * kParamBytes;
  char* base;
  __device__ __half* tile(int stage) const {  // the f16 tile the mma reads
    return reinterpret_cast<__half*>(base + (kDirect ? stage * kTileBytes : 0));
  }
  __device__ uint8_t* raw(int stage) const { return reinterpret_cast<uint8_t*>(base + kTileBytes + stage * kRawBytes); }
  __device__ float* params(int stage) const {
    return reinterpret_cast<float*>(base + kTileBytes + 2 * kRawBytes + (kPerChannel ? 0 : stage) * kParamBytes);
  }
};

// Starts the copies of keys key0..key0+63 of one side into `stage` (16-byte pieces, the page looked
// up per row); keys past kv_len are zero-filled (their scores are masked, but 0 * garbage is NaN).
template <KvType T, int D>
__device__ inline void issue_side(const TcArgs& a, const uint8_t* data, const float* params, const SideSmem<T, D>& sm,
                                  int stage, const int32_t* pages, int kvh, int key0, int kv_len) {
  using S = SideSmem<T, D>;
  // u2 at head_dim 64 has one piece per row: a pass would cover 128 rows, so half the threads sit it out.
  constexpr int kPieces = S::kRowBytes / 16, kRowsPerPass = kThreads / kPieces;
  static_assert(kRowsPerPass >= 1 && (kKTile % kRowsPerPass == 0 || kRowsPerPass % kKTile == 0),
                "row pieces must tile the block");
  constexpr int kPasses = kRowsPerPass > kKTile ? 1 : kKTile / kRowsPerPass;
  auto row_of = [&](int pos) -> int64_t {
    return (static_cast<int64_t>(pages[pos / a.block_size]) * a.hkv + kvh) * a.block_size + pos % a.block_size;
  };
  const int piece = threadIdx.x % kPieces;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = threadIdx.x / kPieces + i * kRowsPerPass, pos = key0 + r;
    if (kRowsPerPass > kKTile && r >= kKTile) break;
    const bool valid = pos < kv_len;
    const uint8_t* src = data + (valid ? row_of(pos) : 0) * S::kRowBytes + 16 * piece;
    char* dst = S::kDirect ? reinterpret_cast<char*>(sm.tile(stage) + r * (D + kPad)) + 16 * piece
                           : reinterpret_cast<char*>(sm.raw(stage)) + r * S::kRowBytes + 16 * piece;
    cp_async16_zfill(dst, src, valid);
  }
  if constexpr (!S::kDirect && !S::kPerChannel) {  // u4c: issue_channel_params
    if (threadIdx.x < kKTile) {
      const int r = threadIdx.x, pos = key0 + r;
      const bool valid = pos < kv_len;
      cp_async8_zfill(sm.params(stage) + 2 * r, params + 2 * (valid ? row_of(pos) : 0), valid);
    }
  }
}

using attn_math::code_f32;

// The 8 2-bit codes of one chunk of 8 dims of a staged row: 16 bits, field e = dim e.
template <KvType T>
__device__ inline void chunk_codes(const uint8_t* row, int c, uint32_t (&q)[8]) {
  static_assert(kv_bits<T>() == 2, "u2 / u2c rows");
  const uint32_t w = *reinterpret_cast<const uint16_t*>(row + 2 * c);
#pragma unroll
  for (int e = 0; e < 8; ++e) q[e] = (w >> (2 * e)) & 0x3u;
}

// u8/u4/u2: the staged codes of `stage` to the f16 tile, code * scale + zero in f32, rounded once.
// Zero-filled rows (past kv_len) give 0 * 0 + 0.
template <KvType T, int D>
__device__ inline void dequantize_side(const SideSmem<T, D>& sm, int stage) {
  using S = SideSmem<T, D>;
  constexpr int kChunks = D / 8, kRowsPerPass = kThreads / kChunks;  // chunks of 8 dims
  const int c = threadIdx.x % kChunks;
  const uint8_t* raw = sm.raw(stage);
  const float* params = sm.params(stage);
  __half* tile = sm.tile(stage);
#pragma unroll
  for (int i = 0; i < kKTile / kRowsPerPass; ++i) {
    const int r = threadIdx.x / kChunks + i * kRowsPerPass;
    const float s = params[2 * r], z = params[2 * r + 1];
    float x[8];
    if constexpr (T == KvType::u8) {  // byte i = dim i
      const uint2 w = *reinterpret_cast<const uint2*>(raw + r * S::kRowBytes + 8 * c);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[e] = fmaf(code_f32((w.x >> (8 * e)) & 0xFFu), s, z);
        x[4 + e] = fmaf(code_f32((w.y >> (8 * e)) & 0xFFu), s, z);
      }
    } else if constexpr (T == KvType::u4) {  // dim i in byte i/2, low nibble first: nibble i of the little-endian word
      const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + r * S::kRowBytes + 4 * c);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32((w >> (4 * e)) & 0xFu), s, z);
    } else {  // u2: dim i in bits 2 (i % 4) of byte i / 4
      uint32_t q[8];
      chunk_codes<T>(raw + r * S::kRowBytes, c, q);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32(q[e]), s, z);
    }
    *reinterpret_cast<uint4*>(tile + r * (D + kPad) + 8 * c) =
        make_uint4(pack_half2(x[0], x[1]), pack_half2(x[2], x[3]), pack_half2(x[4], x[5]), pack_half2(x[6], x[7]));
  }
}

// u4c: a query at position pos sees keys [0, codes_end) as codes and [codes_end, pos] as window rows:
// block [b0, b0 + bs) is codes iff pos >= b0 + bs - 1, i.e. iff it ends at or before pos + 1.
__device__ inline int codes_end(int pos, int bs) { return (pos + 1) / bs * bs; }

// u4c: the first key of the second K block a key tile touches (>= key0 + kKTile: the tile lies in one
// block). The block size is a multiple of 16 and at least 32, and key0 a multiple of 64, so a tile
// touches at most two blocks and the second starts a multiple of 16 keys into it.
__device__ inline int second_block_key(int key0, int bs) { return key0 - key0 % bs + bs; }

// u4c: starts the copies of the scales and zeros of the tile's two blocks (the second zero-filled when
// the tile has none or it starts past kv_len) into the one parameter area, as slot 0 and 1.
template <KvType KT, int D>
__device__ inline void issue_channel_params(const TcArgs& a, const SideSmem<KT, D>& sm, const int32_t* pages,
                                            int kvh, int key0, int kv_len) {
  constexpr int kSlotPieces = 2 * D * 4 / 16;  // scales then zeros of one block, in 16-byte pieces
  static_assert(2 * kSlotPieces <= kThreads, "one piece per thread");
  if (threadIdx.x < 2 * kSlotPieces) {
    const int slot = threadIdx.x / kSlotPieces, piece = threadIdx.x % kSlotPieces;
    const int first_key = slot == 0 ? key0 : second_block_key(key0, a.block_size);  // of the slot's block
    const bool valid = first_key < min(key0 + kKTile, kv_len);
    const int64_t block = valid ? pages[first_key / a.block_size] : 0;
    cp_async16_zfill(sm.params(0) + slot * 2 * D + 4 * piece, a.k_params + (block * a.hkv + kvh) * 2 * D + 4 * piece,
                     valid);
  }
}

// u4c: the staged codes of `stage` (the tile at key0) to the f16 tile with the per-channel parameters,
// code * scale[dim] + zero[dim] in f32, rounded once. Rows from `split` on are the second block's; split
// is a multiple of 16, so a pass of rows never straddles the two and the thread's 8 (scale, zero) stay
// in registers.
template <KvType KT, int D>
__device__ inline void dequantize_k_channels(const SideSmem<KT, D>& sm, int stage, int key0, int bs) {
  using S = SideSmem<KT, D>;
  constexpr int kChunks = D / 8, kRowsPerPass = kThreads / kChunks;  // chunks of 8 dims
  static_assert(16 % kRowsPerPass == 0, "a block boundary must fall between passes");
  const int c = threadIdx.x % kChunks;
  const uint8_t* raw = sm.raw(stage);
  __half* tile = sm.tile(stage);
  const int split = second_block_key(key0, bs) - key0;
  float sc[8], zr[8];
  auto load_params = [&](int slot) {
    const float4* p = reinterpret_cast<const float4*>(sm.params(0) + slot * 2 * D + 8 * c);
    const float4 s0 = p[0], s1 = p[1], z0 = p[D / 4], z1 = p[D / 4 + 1];
    sc[0] = s0.x, sc[1] = s0.y, sc[2] = s0.z, sc[3] = s0.w, sc[4] = s1.x, sc[5] = s1.y, sc[6] = s1.z, sc[7] = s1.w;
    zr[0] = z0.x, zr[1] = z0.y, zr[2] = z0.z, zr[3] = z0.w, zr[4] = z1.x, zr[5] = z1.y, zr[6] = z1.z, zr[7] = z1.w;
  };
  load_params(0);
#pragma unroll
  for (int i = 0; i < kKTile / kRowsPerPass; ++i) {
    if (i * kRowsPerPass == split) load_params(1);
    const int r = threadIdx.x / kChunks + i * kRowsPerPass;
    float x[8];
    if constexpr (KT == KvType::u4c) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + r * S::kRowBytes + 4 * c);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32((w >> (4 * e)) & 0xFu), sc[e], zr[e]);
    } else {
      uint32_t q[8];
      chunk_codes<KT>(raw + r * S::kRowBytes, c, q);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32(q[e]), sc[e], zr[e]);
    }
    *reinterpret_cast<uint4*>(tile + r * (D + kPad) + 8 * c) =
        make_uint4(pack_half2(x[0], x[1]), pack_half2(x[2], x[3]), pack_half2(x[4], x[5]), pack_half2(x[6], x[7]));
  }
}

// u4c: starts the copies of the f16 window rows of keys [lo, hi) of the tile at key0 into the f16 K
// tile, every other row zero-filled (as is a block without a window slot, which valid input never asks
// for here). hi <= kv_len, so a second block the rows reach is in the block table.
template <int D>
__device__ inline void issue_window_rows(const TcArgs& a, __half* tile, const int32_t* pages, int kvh, int key0, int lo,
                                         int hi) {
  constexpr int kPieces = D * 2 / 16, kRowsPerPass = kThreads / kPieces;
  const int bs = a.block_size, split_key = second_block_key(key0, bs);
  const int slot0 = a.window_map[pages[key0 / bs]];
  const int slot1 = hi > split_key ? a.window_map[pages[key0 / bs + 1]] : -1;
  const int piece = threadIdx.x % kPieces;
#pragma unroll
  for (int i = 0; i < kKTile / kRowsPerPass; ++i) {
    const int r = threadIdx.x / kPieces + i * kRowsPerPass, key = key0 + r;
    const bool first = key < split_key;
    const int slot = first ? slot0 : slot1, offset = key - (first ? split_key - bs : split_key);
    const bool valid = key >= lo && key < hi && slot >= 0;
    const int64_t row = valid ? (static_cast<int64_t>(slot) * a.hkv + kvh) * bs + offset : 0;
    cp_async16_zfill(tile + r * (D + kPad) + 8 * piece, a.k_window + row * D + 8 * piece, valid);
  }
}

// u4c: which keys the block's query rows see as codes, in shared memory (D = 128 has no registers to
// spare for these across the key tiles; each use reads them again).
struct RowCodes {
  int end[kQTile];           // codes_end of query row row0 + i
  int warp_last[kWarps];     // codes_end of each warp's last stored row
  int block_last, rows_end;  // codes_end of the block's last stored row; the position after that row
};

template <int D, KvType KT, KvType VT>
constexpr int smem_bytes() {
  return SideSmem<KT, D>::kBytes + SideSmem<VT, D>::kBytes + (kv_per_channel<KT>() ? sizeof(RowCodes) : 0);
}

// The views of a key tile one pass of the tile body reads: per-token K has one (all), u4c two, the
// codes and the window rows (the header comment says which query sees which).
enum class View { all, codes, window };

// One warp's keys in one pass: key groups wholly past last_key are skipped (their P is 0 for every
// stored row, which the mask makes sure of); mask: whether any entry needs masking at all.
struct PassKeys {
  int last_key;
  bool mask;
};

// The keys [first, last] one query row sees in a view (first only bounds the window view).
struct RowKeys {
  int first, last;
};

// mma fragment names (g = lane / 4, t = lane % 4): A regs {row g, cols 2t..}, {g+8, 2t..}, {g, 2t+8..},
// {g+8, 2t+8..}; B regs {k 2t.., col g}, {k 2t+8.., col g}; C {row g, cols 2t, 2t+1}, {row g+8, same}.
//
// The tile body of one warp: S = Q·Kᵀ over the f16 K tile, the scores of keys outside the RowKeys of
// the lane's rows (row_keys(false) for row g, row_keys(true) for g + 8; asked for only here) set to
// kNoScore where pk.mask, the online softmax update of (m, l, O) and O += P·V over the f16 V tile.
template <int D, View V, class RowKeysOf>
__device__ __forceinline__ void attend_tile(const __half* k_smem, const __half* v_smem, const uint32_t (&qf)[D / 16][4],
                                            float (&o)[D / 8][4], float& m_lo, float& m_hi, float& l_lo, float& l_hi,
                                            int key0, const PassKeys& pk, RowKeysOf row_keys, float scale_log2) {
  constexpr int kStride = D + kPad;
  constexpr int kSteps = D / 16;         // k-steps of Q·Kᵀ
  constexpr int kDimTiles = D / 8;       // n8 tiles of O
  constexpr int kKeyTiles = kKTile / 8;  // n8 tiles of S
  const int lane = threadIdx.x & 31, t = lane & 3;
  // ldmatrix x4: lanes 8i..8i+7 address the rows of matrix i.
  const int mat = lane >> 3, mat_row = lane & 7;

  // S = Q·Kᵀ. Matrices: (keys 8nt.., dims 16kk..), (8nt.., 16kk+8..), (8nt+8.., 16kk..), (8nt+8.., 16kk+8..)
  // = B regs (b0, b1) of key tiles nt and nt+1.
  float s[kKeyTiles][4];
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; nt += 2) {
      if (key0 + 8 * nt > pk.last_key) break;  // keys 8nt.. masked for every stored row
      uint32_t b[4];
      ldmatrix_x4(b, k_smem + (8 * nt + 8 * (mat >> 1) + mat_row) * kStride + 16 * kk + 8 * (mat & 1));
      mma(s[nt], qf[kk], b[0], b[1]);
      mma(s[nt + 1], qf[kk], b[2], b[3]);
    }
  }

  // Scale to the log2 domain; mask.
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[nt][e] * scale_log2;
      const int key = key0 + 8 * nt + 2 * t + (e & 1);
      if (pk.mask) {
        const RowKeys row = row_keys(e >= 2);
        if (key > row.last || (V == View::window && key < row.first)) x = kNoScore;
      }
      s[nt][e] = x;
    }
  }
  // Online softmax: the 4 lanes of a row (same g) hold its 64 scores.
  float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) {
    mx_lo = fmaxf(mx_lo, fmaxf(s[nt][0], s[nt][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[nt][2], s[nt][3]));
  }
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  const float alpha_lo = exp2f(m_lo - mx_lo), alpha_hi = exp2f(m_hi - mx_hi);
  m_lo = mx_lo;
  m_hi = mx_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt) {
    s[nt][0] = exp2f(s[nt][0] - m_lo);
    s[nt][1] = exp2f(s[nt][1] - m_lo);
    s[nt][2] = exp2f(s[nt][2] - m_hi);
    s[nt][3] = exp2f(s[nt][3] - m_hi);
    sum_lo += s[nt][0] + s[nt][1];
    sum_hi += s[nt][2] + s[nt][3];
  }
  l_lo = l_lo * alpha_lo + sum_lo;
  l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
  for (int nd = 0; nd < kDimTiles; ++nd) {
    o[nd][0] *= alpha_lo;
    o[nd][1] *= alpha_lo;
    o[nd][2] *= alpha_hi;
    o[nd][3] *= alpha_hi;
  }

  // O += P·V. P's A regs for keys 16kk..16kk+15 are the C regs of key tiles 2kk and 2kk+1. Matrices:
  // (keys 16kk.., dims 8nd..), (16kk+8.., 8nd..), (16kk.., 8nd+8..), (16kk+8.., 8nd+8..), transposed
  // = B regs (b0, b1) of dim tiles nd and nd+1.
#pragma unroll
  for (int kk = 0; kk < kKTile / 16; ++kk) {
    if (key0 + 16 * kk > pk.last_key) break;  // P = 0 for every stored row
    const uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                            pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int nd = 0; nd < kDimTiles; nd += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_smem + (16 * kk + 8 * (mat & 1) + mat_row) * kStride + 8 * nd + 8 * (mat >> 1));
      mma(o[nd], pa, b[0], b[1]);
      mma(o[nd + 1], pa, b[2], b[3]);
    }
  }
}

template <int D, KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads, min_blocks<D>()) prefill_attention_tc_kernel(TcArgs a) {
  static_assert(!kv_per_channel<VT>(), "V is per token");
  constexpr bool kPerChannel = kv_per_channel<KT>();
  constexpr int kSteps = D / 16;       // k-steps of Q·Kᵀ
  constexpr int kDimTiles = D / 8;     // n8 tiles of O
  extern __shared__ __align__(16) char smem[];
  const SideSmem<KT, D> k_side{smem};
  const SideSmem<VT, D> v_side{smem + SideSmem<KT, D>::kBytes};

  const int seq = blockIdx.x, h = blockIdx.y;
  const int q_tile = gridDim.z - 1 - blockIdx.z;  // the longest causal ranges start first
  const int ns = a.num_seqs;
  const int q_start = a.seq_info[seq], q_len = a.seq_info[ns + seq], kv_len = a.seq_info[2 * ns + seq];
  const int row0 = q_tile * kQTile;
  if (row0 >= q_len) return;  // the whole block leaves before any barrier
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kvh = h / (a.hq / a.hkv);
  const int first_pos = kv_len - q_len;  // cache position of query row 0
  const int num_key_tiles = (first_pos + min(row0 + kQTile, q_len) - 1) / kKTile + 1;
  const int wrow = row0 + 16 * warp;                   // the warp's first query row
  const int r_lo = wrow + g, r_hi = r_lo + 8;          // the lane's two rows
  const int pos_lo = first_pos + r_lo, pos_hi = pos_lo + 8;
  // The last key any stored row of this warp sees: key groups past it are all masked (P = 0), so
  // the warp skips their mma work; a warp with no stored row skips the tile work altogether.
  const bool warp_live = wrow < q_len;
  const int warp_last_key = first_pos + min(wrow + 15, q_len - 1);
  RowCodes& codes_of = *reinterpret_cast<RowCodes*>(smem + SideSmem<KT, D>::kBytes + SideSmem<VT, D>::kBytes);
  if constexpr (kPerChannel) {
    const int bs = a.block_size, cta_last = first_pos + min(row0 + kQTile, q_len) - 1;
    if (threadIdx.x < kQTile) codes_of.end[threadIdx.x] = codes_end(first_pos + row0 + threadIdx.x, bs);
    if (lane == 0) codes_of.warp_last[warp] = codes_end(warp_last_key, bs);
    if (threadIdx.x == 0) codes_of.block_last = codes_end(cta_last, bs), codes_of.rows_end = cta_last + 1;
    __syncthreads();
  }

  uint32_t qf[kSteps][4];
  {
    auto q_word = [&](int r, int dim) -> uint32_t {
      if (r >= q_len) return 0u;
      const __half* p = a.q + static_cast<int64_t>(q_start + r) * a.q_stride_t + h * a.q_stride_h + dim;
      return *reinterpret_cast<const uint32_t*>(p);
    };
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      qf[kk][0] = q_word(r_lo, 16 * kk + 2 * t);
      qf[kk][1] = q_word(r_hi, 16 * kk + 2 * t);
      qf[kk][2] = q_word(r_lo, 16 * kk + 2 * t + 8);
      qf[kk][3] = q_word(r_hi, 16 * kk + 2 * t + 8);
    }
  }
  float o[kDimTiles][4];
#pragma unroll
  for (int nd = 0; nd < kDimTiles; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  // Per token, every row sees key 0 in its first tile, so its max is a score from then on. A u4c pass
  // can meet a row that has seen no key yet (its keys so far all in the other view): its max starts at
  // kNoScore / 2, above every masked score, so their P is 0 (not exp2(0)), and l and O stay 0.
  float m_lo = kPerChannel ? 0.5f * kNoScore : kNoScore, m_hi = m_lo;
  float l_lo = 0.f, l_hi = 0.f;  // l: this lane's partial row sums

  const int32_t* pages = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  // Two-stage pipeline: the copies of tile kt + 1 fly while tile kt is computed.
  issue_side<KT, D>(a, a.k, a.k_params, k_side, 0, pages, kvh, 0, kv_len);
  issue_side<VT, D>(a, a.v, a.v_params, v_side, 0, pages, kvh, 0, kv_len);
  if constexpr (kPerChannel) issue_channel_params<KT, D>(a, k_side, pages, kvh, 0, kv_len);
  cp_async_commit();
  for (int kt = 0; kt < num_key_tiles; ++kt) {
    const int key0 = kt * kKTile, stage = kt & 1;
    // u4c: whether some stored row sees tile kt as codes (the last row's codes reach into it), and
    // whether some sees it as window rows (the first row's codes end inside it; a superset where that
    // row sees no key of the tile: the pass then masks everything, which adds nothing). The window rows
    // any row sees go into the K tile (free since the barrier ending tile kt - 1) ahead of the next
    // tile's copies, so the wait below covers them but not those.
    bool codes = true, window = false;
    if constexpr (kPerChannel) {
      codes = codes_of.block_last > key0;
      window = codes_of.end[0] < key0 + kKTile;
      if (window) {
        issue_window_rows<D>(a, k_side.tile(stage), pages, kvh, key0, max(key0, codes_of.end[0]),
                             min(key0 + kKTile, codes_of.rows_end));
        cp_async_commit();
      }
    }
    if (kt + 1 < num_key_tiles) {  // the other stage was released by the barrier ending tile kt - 1
      issue_side<KT, D>(a, a.k, a.k_params, k_side, stage ^ 1, pages, kvh, key0 + kKTile, kv_len);
      issue_side<VT, D>(a, a.v, a.v_params, v_side, stage ^ 1, pages, kvh, key0 + kKTile, kv_len);
    }
    cp_async_commit();  // possibly empty: one group per tile keeps the count below right
    cp_async_wait<1>();  // this thread's copies of tile kt have landed
    __syncthreads();     // ... and everyone's
    const __half* k_smem = k_side.tile(stage);
    const __half* v_smem = v_side.tile(stage);
    if constexpr (!kPerChannel) {
      if constexpr (!SideSmem<KT, D>::kDirect || !SideSmem<VT, D>::kDirect) {
        if constexpr (!SideSmem<KT, D>::kDirect) dequantize_side<KT, D>(k_side, stage);
        if constexpr (!SideSmem<VT, D>::kDirect) dequantize_side<VT, D>(v_side, stage);
        __syncthreads();
      }
      if (warp_live) {  // warp-uniform; the barriers stay outside
        // Causal mask only where the tile reaches past the warp's first row: that also covers keys past kv_len.
        const PassKeys pk{warp_last_key, key0 + kKTile - 1 > first_pos + wrow};
        attend_tile<D, View::all>(k_smem, v_smem, qf, o, m_lo, m_hi, l_lo, l_hi, key0, pk,
                                  [&](bool hi) { return RowKeys{0, hi ? pos_hi : pos_lo}; }, a.scale_log2);
      }
    } else {
      // u4c: the K tile holds the window rows (copied with the rows of tile kt, above) where some row
      // sees window rows; else the codes, dequantized here.
      if (!window) dequantize_k_channels<KT, D>(k_side, stage, key0, a.block_size);
      if constexpr (!SideSmem<VT, D>::kDirect) dequantize_side<VT, D>(v_side, stage);
      __syncthreads();
      const int* warp_codes_end = codes_of.end + 16 * warp;  // from the warp's first row
      auto cut_of = [&](bool hi) { return warp_codes_end[g + (hi ? 8 : 0)]; };
      if (window) {
        // Where the warp's first row's codes end inside the tile. (A warp whose rows all come before key0
        // then runs a pass that masks everything: testing for that too cost D = 128 a spill.)
        if (warp_live && warp_codes_end[0] < key0 + kKTile) {
          const PassKeys pk{warp_last_key, true};
          attend_tile<D, View::window>(k_smem, v_smem, qf, o, m_lo, m_hi, l_lo, l_hi, key0, pk,
                                       [&](bool hi) { return RowKeys{cut_of(hi), hi ? pos_hi : pos_lo}; },
                                       a.scale_log2);
        }
        if (codes) {  // every warp is done with the window rows: the codes replace them
          __syncthreads();
          dequantize_k_channels<KT, D>(k_side, stage, key0, a.block_size);
          __syncthreads();
        }
      }
      // The channel parameters are consumed: the next tile's go into the same area, their own group,
      // waited for with the next tile's rows (there cp_async_wait<1> leaves only the newer group).
      if (kt + 1 < num_key_tiles) issue_channel_params<KT, D>(a, k_side, pages, kvh, key0 + kKTile, kv_len);
      cp_async_commit();
      if (codes && warp_live && codes_of.warp_last[warp] > key0) {
        // No mask where every row of the warp sees the whole tile as codes (that covers causality too).
        const PassKeys pk{codes_of.warp_last[warp] - 1, warp_codes_end[0] < key0 + kKTile};
        attend_tile<D, View::codes>(k_smem, v_smem, qf, o, m_lo, m_hi, l_lo, l_hi, key0, pk,
                                    [&](bool hi) { return RowKeys{0, cut_of(hi) - 1}; }, a.scale_log2);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled or re-dequantized
  }
  cp_async_wait<0>();  // nothing in flight at exit (only the last, empty group can be)

  l_lo = attn_math::quad_sum(l_lo);
  l_hi = attn_math::quad_sum(l_hi);
  const float inv_lo = 1.f / l_lo, inv_hi = 1.f / l_hi;  // l >= 1: the row max's own term is exp2(0)
  if (r_lo < q_len) {
    __half* p = a.out + static_cast<int64_t>(q_start + r_lo) * a.out_stride_t + h * a.out_stride_h + 2 * t;
#pragma unroll
    for (int nd = 0; nd < kDimTiles; ++nd)
      *reinterpret_cast<uint32_t*>(p + 8 * nd) = pack_half2(o[nd][0] * inv_lo, o[nd][1] * inv_lo);
  }
  if (r_hi < q_len) {
    __half* p = a.out + static_cast<int64_t>(q_start + r_hi) * a.out_stride_t + h * a.out_stride_h + 2 * t;
#pragma unroll
    for (int nd = 0; nd < kDimTiles; ++nd)
      *reinterpret_cast<uint32_t*>(p + 8 * nd) = pack_half2(o[nd][2] * inv_hi, o[nd][3] * inv_hi);
  }
}

}  // namespace prefill_tc

template <int D, KvType KT, KvType VT>
void launch_prefill_attention_tc(const PrefillTcArgs& a, dim3 grid, cudaStream_t stream) {
  using namespace prefill_tc;
  constexpr int bytes = smem_bytes<D, KT, VT>();  // up to 68 KiB: past the 48 KiB default
  LOWBIT_CUDA_CHECK("prefill_attention", cudaFuncSetAttribute(prefill_attention_tc_kernel<D, KT, VT>,
                                                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  prefill_attention_tc_kernel<D, KT, VT><<<grid, kThreads, bytes, stream>>>(a);
}

}  // namespace lowbit::cuda
