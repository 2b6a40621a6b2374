// What the tensor-core prefill dispatcher (prefill_attention_tc_sm80.cu) and the kernel's instances
// (instances/prefill_attention_tc_d*_k*_v*.cu, written by tools/generate_attention_instances.py)
// share: the kernel's arguments, the launch of one (head_dim, K type, V type) instance, and the
// generated table of the instances this build compiled.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sm80/kv_type.cuh"

namespace lowbit::cuda {

namespace prefill_tc {
constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kQTile = 16 * kWarps;  // query rows per block
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace prefill_tc

struct PrefillTcArgs {
  const __half* q;
  __half* out;
  int64_t q_stride_t, q_stride_h, out_stride_t, out_stride_h;
  const uint8_t* k;
  const uint8_t* v;
  const float* k_params;  // [blocks, Hkv, bs, 2] = (scale, zero) for u8/u4; u4c: [blocks, Hkv, 2, D]
  const float* v_params;
  // Per-channel K (u4c) only: the f16 residual window [window_slots, Hkv, bs, D] and each block's window
  // slot (s32 [blocks], -1 for none). A query at position pos sees key block kb (keys [kb*bs, kb*bs + bs))
  // as codes when pos >= kb*bs + bs - 1, else as its window rows (include/lowbit/kv/kv_cache.h).
  const __half* k_window;
  const int32_t* window_map;
  const int32_t* block_tables;
  const int32_t* seq_info;  // [3, num_seqs]: q_start, q_len, kv_len
  int num_seqs, max_blocks, hq, hkv, block_size;
  float scale_log2;  // softmax scale * log2(e): scores go straight to exp2f
  // Key split (the Hopper kernel only; kernels/sm90/prefill_split_plan.h): 1 = none. Else grid.z is sequences x
  // splits, and each split writes its rows' unnormalized O [splits, split_tokens, hq, D] and (max in the log2
  // domain, sum) [splits, split_tokens, hq] in f32 instead of out; a merge kernel writes out.
  int splits = 1, split_tokens = 0;
  float* split_o = nullptr;
  float2* split_ml = nullptr;
  // Per-channel K with the dequantized copy (prefill_attention_sm90.cu): split_tail 1 cuts a CTA's keys at the
  // codes every row sees (prefill_split::tail_split_range: splits 0..splits-2 over the tiles below, the last split
  // the rest), and a launch covers splits [split_first, split_first + split_count) of the `splits` (grid.z is
  // sequences x split_count; 0 = all of them): the f16 instance over the copy takes the first ones, the per-channel
  // instance the last, both writing the same partials for one merge.
  int split_tail = 0, split_first = 0, split_count = 0;
};

// Launches the kernel instance for head_dim D and K/V types KT/VT (prefill_attention_tc_sm80.cuh
// defines it; each instance file compiles one).
template <int D, KvType KT, KvType VT>
void launch_prefill_attention_tc(const PrefillTcArgs& a, dim3 grid, cudaStream_t stream);

using PrefillTcLaunch = void (*)(const PrefillTcArgs&, dim3, cudaStream_t);
struct PrefillTcEntry {
  int head_dim;
  KvType k, v;
  PrefillTcLaunch launch;
};
// The instances compiled into this build (instances/prefill_attention_tc_table.cu, generated).
extern const PrefillTcEntry kPrefillTcTable[];
extern const int kPrefillTcTableSize;

}  // namespace lowbit::cuda
