"""One fresh 8K-token prompt (32 q / 8 kv heads, head_dim 128) through the Hopper prefill kernel, forced by name, once
per KV type in argv (default f16 u4): the workload the ncu step of tools/gpu_run.sh (prefill_profile) profiles."""
import math
import sys

import torch

from lowbit import _core

HQ, HKV, D, BLOCK, LENGTH = 32, 8, 128, 16, 8192


def main():
    kinds = sys.argv[1:] or ["f16", "u4"]
    q = torch.randn(LENGTH, HQ, D, device="cuda").half()
    k = torch.randn(LENGTH, HKV, D, device="cuda").half()
    v = torch.randn(LENGTH, HKV, D, device="cuda").half()
    nblk = LENGTH // BLOCK
    table = torch.randperm(nblk, dtype=torch.int32).view(1, nblk)
    slots = (table[0, torch.arange(LENGTH) // BLOCK].long() * BLOCK + torch.arange(LENGTH) % BLOCK).to(torch.int32)
    meta = _core.AttentionMeta([0], [LENGTH], [LENGTH], table.cuda(), slots.cuda())
    out = torch.empty_like(q)
    for kv in kinds:
        cache = _core.KVCache(1, HKV, D, nblk, BLOCK, kv, kv, "cuda")
        _core.kv_write(cache, 0, k, v, meta)
        _core.paged_attention(q, cache, 0, meta, 1 / math.sqrt(D), out, kernel="prefill_attention_sm90")
        torch.cuda.synchronize()
        print(kv, "ran; output finite:", bool(torch.isfinite(out).all()))


if __name__ == "__main__":
    main()
