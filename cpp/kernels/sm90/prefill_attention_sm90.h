// Causal paged prefill attention on Hopper wgmma (prefill_attention_sm90.cuh has the kernel and its design):
// which operands it covers and its launch. The registry prefers it on sm_90 (attention_sm90_entries.cpp);
// everything it does not cover takes the mma.sync kernel (prefill_attention_tc.h).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "kernels/sm80/kv_type.cuh"
#include "kernels/sm80/prefill_attention_tc_launch.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/forward_kernels.h"  // PrefillSm90Options
#include "lowbit/cuda/k_window.h"

namespace lowbit::cuda {

// Whether prefill_attention_sm90 covers these operands on the current device: an sm_90 GPU with this
// library's sm_90a image, f16 q/out, K and V of f16/u8/u4/u2 per token or K of u4/u2 per channel (with its
// window; V per token), head_dim 64 or 128, q rows 16-byte aligned, out rows 4-byte aligned, contiguous 16-byte aligned caches. `why` (if
// given) names the first reason it does not.
bool prefill_attention_sm90_supported(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& out,
                                      const KWindow& window = {}, std::string* why = nullptr);

// Same contract as prefill_attention (include/lowbit/cuda/forward_kernels.h); throws NotSupported where
// prefill_attention_sm90_supported does not hold.
void prefill_attention_sm90(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                            const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, int max_q_len,
                            float scale, Tensor& out, cudaStream_t stream, const KWindow& window = {},
                            const PrefillSm90Options& options = {});

// The launch of one (head_dim, K, V) instance (defined in prefill_attention_sm90.cuh, compiled by the
// prefill_attention_sm90_d*_k*.cu files, one per head_dim and K type with every V type).
// kRefDequant: u4 / u2 dequantized as before the placed-field rework (prefill_attention_sm90_ref.cu: the A/B and
// bit-identity instances, head_dim 64 and 128 with K and V both u4 or both u2).
template <int D, KvType KT, KvType VT, bool kRefDequant = false>
void launch_prefill_attention_sm90(const PrefillTcArgs& a, dim3 grid, cudaStream_t stream);

// The key split's merge (prefill_attention_sm90_merge.cu): out from the splits' partial O and (max, sum) in a.
void prefill_attention_split_merge(const PrefillTcArgs& a, int head_dim, int max_q_len, cudaStream_t stream);

// The dequantized copy (prefill_dequant_copy.cu): whether it reads this cache (per-token u8 / u4 / u2 K and V, or
// per-channel u4c / u2c K with such V; head_dim 64 / 128), and the copy of every key below each sequence's kv_len
// (per-channel K: below the tail split's bound, the keys every query sees as sealed codes) into k_out / v_out, f16
// [num_seqs * max_blocks, Hkv, block_size, D] (page g = seq * max_blocks + block), with table_out [num_seqs,
// max_blocks] = g: the f16 instance then runs with those in place of the cache's data and block table.
bool prefill_dequant_copy_covers(int head_dim, KvType kt, KvType vt);
void prefill_dequant_copy(const PrefillTcArgs& a, int head_dim, KvType kt, KvType vt, __half* k_out, __half* v_out,
                          int32_t* table_out, cudaStream_t stream);

}  // namespace lowbit::cuda
