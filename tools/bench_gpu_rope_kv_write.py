"""RoPE + KV write on the GPU: the fused kernel (`rope_kv_write`, one block per token, its cosines and sines computed
once) against `rope` then `kv_write` (the rope kernel computes them per row and pair), Llama-3-8B heads (32 q, 8 kv,
head_dim 128, theta 500000 with llama3 scaling), a u4 cache, token counts of a decode step (1, 1536) and of a prefill
step (8192). Device time per call from the profiler (kernels only), the mean over 20 calls.

  python3 tools/bench_gpu_rope_kv_write.py out.json
"""
import json
import sys

import torch

from bench_gpu_common import device_meta, profiled_kernel_us
from lowbit import _core as lb

HQ, HKV, D, BS = 32, 8, 128, 16
ROPE = dict(theta=500000.0, llama3=True, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position=8192)


def case(tokens):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    blocks = (tokens + BS - 1) // BS + 1
    cache = lb.KVCache(1, HKV, D, blocks, BS, "u4", "u4", "cuda")
    qkv = torch.randn(tokens, HQ + 2 * HKV, D, generator=g, device="cuda").half()
    q, k, v = qkv[:, :HQ], qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:]
    pos = torch.randint(0, 8192, (tokens,), generator=g, device="cuda", dtype=torch.int32)
    slots = torch.randperm(blocks * BS, generator=g, device="cuda")[:tokens].to(torch.int32)
    meta = lb.AttentionMeta([], [], [], slot_mapping=slots)
    fused = profiled_kernel_us(lambda: lb.rope_kv_write(q, k, v, pos, cache, 0, meta, **ROPE), 20)

    def two_ops():
        lb.rope(q, k, pos, **ROPE)
        lb.kv_write(cache, 0, k, v, meta)
    separate = profiled_kernel_us(two_ops, 20)
    moved = tokens * (HQ + HKV) * D * 2 * 2 + tokens * HKV * D * 2 + tokens * HKV * (D // 2 + 8) * 2
    return {"tokens": tokens, "fused_us": round(fused, 2), "rope_then_kv_write_us": round(separate, 2),
            "fused_tb_s": round(moved / fused / 1e6, 3)}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/bench_rope_kv_write.json"
    rows = [case(t) for t in (1, 1536, 8192)]
    for r in rows:
        print(r, flush=True)
    json.dump({"meta": {**device_meta(), "timing": "profiler kernel time, mean of 20 calls"}, "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
