"""Decode attention with per-channel 4-bit K (kc4, group 64, f16 window) beside per-token kv4 and kv8 and SDPA fp16
on Llama-3-8B heads (32 q / 8 kv heads, head_dim 128): the kernel time of one decode step over a paged cache
written by kv_write (so the window holds the last L mod 64 keys as it would in the engine). Through the
paged_attention op, which uploads its metadata per call, so the times are the profiler's kernel times (decode
kernels and the split merge; copies left out). Writes JSON (argv[1]) and prints a table."""
import math
import sys

import torch
import torch.nn.functional as F

from lowbit import _core

from bench_gpu_common import device_meta, profiled_kernel_us, write_json

HQ, HKV, D, GROUP = 32, 8, 128, 64
CONFIGS = [(1, 8192 + 37), (16, 8192 + 37), (64, 4096 + 37), (256, 1536 + 37)]
REPS = 20


def filled_cache(b, length, k_type, v_type, per_channel):
    bs = GROUP if per_channel else 16
    per_seq = -(-length // bs) + 1
    chunk = max(1, 65536 // b)  # prefill every sequence in chunks of tokens
    # A chunk holds a window slot for every block it writes (released once sealed, at the next chunk).
    cache = _core.KVCache(1, HKV, D, b * per_seq, block_size=bs, k_type=k_type, v_type=v_type, device="cuda",
                          k_per_channel=per_channel, k_window_slots=b * (chunk // GROUP + 2) + 2)
    table = torch.randperm(b * per_seq, dtype=torch.int32).view(b, per_seq)
    for start in range(0, length, chunk):
        n = min(chunk, length - start)
        pos = torch.arange(start, start + n)
        slots = (table[:, pos // bs].long() * bs + pos % bs).to(torch.int32).flatten()
        meta = _core.AttentionMeta([i * n for i in range(b)], [n] * b, [start + n] * b, table.cuda(), slots.cuda())
        _core.prepare_k_window(cache, slots)
        kv = torch.randn(b * n, HKV, D, device="cuda").half()
        _core.kv_write(cache, 0, kv, kv * 0.5 + 0.1, meta)
    return cache, table


def bench(b, length):
    row = {"batch": b, "seq_len": length}
    q = torch.randn(b, HQ, 1, D, device="cuda").half()
    k = torch.randn(b, HKV, length, D, device="cuda").half()
    row["sdpa_fp16_us"] = profiled_kernel_us(lambda: F.scaled_dot_product_attention(q, k, k, enable_gqa=True), REPS)
    k = None
    q3 = q.view(b, HQ, D).contiguous()
    out = torch.empty_like(q3)
    for name, kt, vt, pc in [("kv8", "u8", "u8", False), ("kv4", "u4", "u4", False), ("kc4v4", "u4", "u4", True),
                             ("kc4v8", "u4", "u8", True)]:
        cache, table = filled_cache(b, length, kt, vt, pc)
        meta = _core.AttentionMeta(list(range(b)), [1] * b, [length] * b, table.cuda(),
                                   torch.zeros(b, dtype=torch.int32, device="cuda"))
        t = profiled_kernel_us(lambda: _core.paged_attention(q3, cache, 0, meta, 1 / math.sqrt(D), out), REPS)
        row[f"{name}_us"] = t
        row[f"{name}_vs_sdpa"] = row["sdpa_fp16_us"] / t
        cache = None
        torch.cuda.empty_cache()
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench_kv_per_channel.json"
    rows = []
    print(f"{'B x L':>12} {'SDPA':>8} {'kv8':>8} {'kv4':>8} {'kc4v4':>8} {'kc4v8':>8}   (us; kc4v4 / kv4)")
    for b, length in CONFIGS:
        r = bench(b, length)
        rows.append(r)
        print(f"{b:>4} x {length:<6} {r['sdpa_fp16_us']:8.1f} {r['kv8_us']:8.1f} {r['kv4_us']:8.1f} "
              f"{r['kc4v4_us']:8.1f} {r['kc4v8_us']:8.1f}   {r['kc4v4_us'] / r['kv4_us']:.2f}x", flush=True)
    write_json(out, {"meta": device_meta(), "decode_attention": rows})


if __name__ == "__main__":
    main()
