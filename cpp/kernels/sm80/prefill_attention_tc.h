// The tensor-core prefill attention kernel (prefill_attention_tc_sm80.cu), for the dispatcher in
// prefill_attention_sm80.cu: f16 q and out, K and V each f16, u8 or u4, the head dims of its instances.
#pragma once
#include <cuda_runtime_api.h>

#include "lowbit/core/tensor.h"
#include "kernels/sm80/prefill_attention_tc_launch.h"
#include "lowbit/cuda/k_window.h"

namespace lowbit::cuda {

// Whether prefill_attention_tc covers these operands (types, head_dim, strides and alignment).
bool prefill_attention_tc_supported(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& out,
                                    const KWindow& window = {});

// Same contract as prefill_attention (include/lowbit/cuda/forward_kernels.h); call only where
// prefill_attention_tc_supported holds.
void prefill_attention_tc(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                          const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, int max_q_len,
                          float scale, Tensor& out, cudaStream_t stream, const KWindow& window = {});

// The kernel arguments of prefill_attention's operands after the checks both tensor-core kernels share (K/V
// parameter layout and alignment, head counts); the Hopper kernel (kernels/sm90/prefill_attention_sm90.h)
// launches from the same arguments.
PrefillTcArgs prefill_tc_args(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                              const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, float scale,
                              Tensor& out, const KWindow& window = {});

}  // namespace lowbit::cuda
