// The sm80-family u4 layouts share one shape: 16-row tiles x 64-k chunks, each chunk 512 bytes = 32 lanes x four
// 32-bit words of 8 nibbles (nibble i at bits 4i..4i+3). A layout is the function `where(lane, word, i)` naming
// the (row, col) of the [n, k] codes, relative to the tile's first row and the chunk's first column, that nibble i
// of that word holds (pack_sm80.cpp: W4A16's f16 A fragments; pack_sm80_w4a8.cpp: W4A8's s8 fragments). This
// file packs and unpacks any such layout a whole word at a time, the 16-row tiles in parallel: they touch disjoint
// bytes on both sides (a tile's 16 rows in the codes, its own 512-byte chunks in the packed data). Loading an 8B
// model packs ~7 billion codes, which the per-nibble loop this replaces did one at a time (~5 ns each).
#pragma once
#include <array>
#include <cstdint>
#include <cstring>

#include "lowbit/core/tensor.h"

namespace lowbit::packed_nibbles {

constexpr int kTileN = 16, kChunkK = 64, kChunkBytes = 512;
constexpr int kNibbles = 32 * 4 * 8;  // lanes x words x nibbles of one chunk

struct Source {
  int8_t row;   // 0..15 within the tile
  int8_t col;   // 0..63 within the chunk
};

// where(lane, word, i) for every nibble of a chunk, in packed order (byte offset / 4 = lane * 4 + word).
template <class Where>
std::array<Source, kNibbles> chunk_sources(Where where) {
  std::array<Source, kNibbles> s{};
  for (int lane = 0; lane < 32; ++lane)
    for (int word = 0; word < 4; ++word)
      for (int i = 0; i < 8; ++i) s[size_t((lane * 4 + word) * 8 + i)] = where(lane, word, i);
  return s;
}

// Codes q u4 [n, k] (host, contiguous: two per byte, the even column in the low nibble) -> packed data u8
// [ceil(n/16), k/64 * 512]; rows past n are zero. k must be a multiple of 64 (the callers check it).
template <class Where>
Tensor pack(const uint8_t* q, int64_t n, int64_t k, Where where) {
  const std::array<Source, kNibbles> src = chunk_sources(where);
  const int64_t n_tiles = (n + kTileN - 1) / kTileN, k_chunks = k / kChunkK;
  Tensor data = Tensor::zeros({n_tiles, k_chunks * kChunkBytes}, ScalarType::u8);
  uint8_t* out = data.data<uint8_t>();
#pragma omp parallel for schedule(static)
  for (int64_t nt = 0; nt < n_tiles; ++nt) {
    const int rows = static_cast<int>(n - nt * kTileN < kTileN ? n - nt * kTileN : kTileN);
    for (int64_t kc = 0; kc < k_chunks; ++kc) {
      uint8_t* chunk = out + (nt * k_chunks + kc) * kChunkBytes;
      const int64_t col0 = kc * kChunkK;
      for (int w = 0; w < kNibbles / 8; ++w) {
        uint32_t v = 0;
        for (int i = 0; i < 8; ++i) {
          const Source s = src[size_t(w * 8 + i)];
          if (s.row >= rows) continue;  // padding rows stay 0
          const int64_t e = (nt * kTileN + s.row) * k + col0 + s.col;
          v |= static_cast<uint32_t>((q[e >> 1] >> ((e & 1) * 4)) & 0xF) << (4 * i);
        }
        std::memcpy(chunk + 4 * w, &v, 4);
      }
    }
  }
  return data;
}

// The inverse: packed data (host, contiguous) -> codes q u4 [n, k], which the caller allocated zeroed.
template <class Where>
void unpack(const uint8_t* data, int64_t n, int64_t k, uint8_t* q, Where where) {
  const std::array<Source, kNibbles> src = chunk_sources(where);
  const int64_t n_tiles = (n + kTileN - 1) / kTileN, k_chunks = k / kChunkK;
#pragma omp parallel for schedule(static)
  for (int64_t nt = 0; nt < n_tiles; ++nt) {
    const int rows = static_cast<int>(n - nt * kTileN < kTileN ? n - nt * kTileN : kTileN);
    for (int64_t kc = 0; kc < k_chunks; ++kc) {
      const uint8_t* chunk = data + (nt * k_chunks + kc) * kChunkBytes;
      for (int w = 0; w < kNibbles / 8; ++w) {
        uint32_t v;
        std::memcpy(&v, chunk + 4 * w, 4);
        for (int i = 0; i < 8; ++i) {
          const Source s = src[size_t(w * 8 + i)];
          if (s.row >= rows) continue;
          const int64_t e = (nt * kTileN + s.row) * k + kc * kChunkK + s.col;
          const int shift = static_cast<int>(e & 1) * 4;
          q[e >> 1] = static_cast<uint8_t>((q[e >> 1] & ~(0xF << shift)) | (((v >> (4 * i)) & 0xF) << shift));
        }
      }
    }
  }
}

}  // namespace lowbit::packed_nibbles
