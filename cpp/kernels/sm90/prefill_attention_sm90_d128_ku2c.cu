// The Hopper prefill attention instances for head_dim 128 and per-channel u2 K, every V type
// (prefill_attention_sm90.cuh).
#include "kernels/sm90/prefill_attention_sm90.cuh"

LOWBIT_PREFILL_SM90_INSTANCES(128, u2c)
