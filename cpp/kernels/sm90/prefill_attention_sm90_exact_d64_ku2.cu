// The Hopper exact-code prefill attention instances for head_dim 64 and u2 K, every V type
// (prefill_attention_sm90_exact.cuh).
#include "kernels/sm90/prefill_attention_sm90_exact.cuh"

LOWBIT_PREFILL_SM90_EXACT_INSTANCES(64, u2)
