// What the decode attention dispatcher (decode_attention_sm80.cu) and the kernel's instances
// (instances/decode_attention_d*_k*_v*.cu, written by tools/generate_attention_instances.py) share:
// the kernel's arguments, the launch of one (head_dim, K type, V type) instance, and the generated
// table of the instances this build compiled.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sm80/kv_type.cuh"

namespace lowbit::cuda {

namespace decode_attn {
constexpr int kWarps = 4, kThreads = kWarps * 32, kTile = 16;
}  // namespace decode_attn

struct DecodeAttnArgs {
  const __half* q;  // [B, Hq, D]
  const uint8_t* k;
  const uint8_t* v;
  const float* k_params;  // [blocks, Hkv, bs, 2]; per-channel K (u4c): [blocks, Hkv, 2, D] = scales, zeros
  const float* v_params;  // [blocks, Hkv, bs, 2]
  // Per-channel K: the f16 residual window [window_slots, Hkv, bs, D] and each block's window slot
  // (s32 [blocks], -1 for none). The u4c splits read the complete blocks [0, (len / bs) * bs) as codes; one
  // more split (the grid's last z) reads the rest, [(len / bs) * bs, len), from the window (K rows at
  // window_map[page]) with the f16-K body, and the combine kernel merges it like any split.
  const __half* k_window;
  const int* window_map;
  const int* block_tables;
  const int* seq_lens;
  __half* out;        // [B, Hq, D]
  float* part_out;    // [B, Hq, splits, D]
  float* part_stats;  // [B, Hq, splits, 2] = (max, sum)
  int64_t q_stride_b, q_stride_h, out_stride_b, out_stride_h;
  int hq, hkv, group, block_size, max_blocks, split_tokens;
  int num_splits;         // splits per (sequence, head) in part_out (the grid's z)
  int slices;             // blocks per kv head: ceil(group / 8), each serving 8 of its query heads
  int block_shift;        // log2(block_size) when it is a power of two, else -1 (division)
  bool tile_in_one_page;  // block_size and split_tokens are multiples of 16: a tile never straddles pages
  bool ring_bulk;         // the instance's ring fed by bulk copies, where it builds one (ring_bulk(); sm_90)
  float scale;
};

// Launches the kernel instance for head_dim D and K/V types KT/VT (decode_attention_sm80.cuh defines
// it; each instance file compiles one).
template <int D, KvType KT, KvType VT>
void launch_decode_attention(const DecodeAttnArgs& p, dim3 grid, cudaStream_t stream);

// Resident blocks per SM of the instance on the current device (0 when the query fails).
template <int D, KvType KT, KvType VT>
int decode_attention_blocks_per_sm();

using DecodeAttnLaunch = void (*)(const DecodeAttnArgs&, dim3, cudaStream_t);
using DecodeAttnOccupancy = int (*)();
struct DecodeAttnEntry {
  int head_dim;
  KvType k, v;
  DecodeAttnLaunch launch;
  DecodeAttnOccupancy blocks_per_sm;
};
// The instances compiled into this build (instances/decode_attention_table.cu, generated).
extern const DecodeAttnEntry kDecodeAttnTable[];
extern const int kDecodeAttnTableSize;

}  // namespace lowbit::cuda
