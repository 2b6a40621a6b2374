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

HQ, HKV, D = 32, 8, 128
CONFIGS = [(1, 8192 + 37), (16, 8192 + 37), (64, 4096 + 37), (256, 1536 + 37)]
REPS = 20

PARTS = {"codes (u4c)": "KvType)3", "window (f16 K)": "KvType)0", "merge": "combine_splits"}


def breakdown_us(fn, reps=REPS):
    """Device microseconds per call of each kernel of a per-channel decode (codes, window, split merge)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {k: 0.0 for k in PARTS}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            for part, needle in PARTS.items():
                if needle in ev.name:
                    out[part] += (getattr(ev, "device_time_total", None) or ev.cuda_time_total) / reps
    return out



def filled_cache(b, length, k_type, v_type, per_channel, group=64):
    bs = group if per_channel else 16
    per_seq = -(-length // bs) + 1
    chunk = max(1, 65536 // b)  # prefill every sequence in chunks of tokens
    # A chunk holds a window slot for every block it writes (released once sealed, at the next chunk).
    cache = _core.KVCache(1, HKV, D, b * per_seq, block_size=bs, k_type=k_type, v_type=v_type, device="cuda",
                          k_per_channel=per_channel, k_window_slots=b * (chunk // bs + 2) + 2)
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


def decode_step(q3, out, b, length, kt, vt, pc, group):
    """A callable running lowbit's decode attention for b sequences of `length` tokens over a freshly filled cache
    of that format (the cache lives as long as the callable)."""
    cache, table = filled_cache(b, length, kt, vt, pc, group)
    meta = _core.AttentionMeta(list(range(b)), [1] * b, [length] * b, table.cuda(),
                               torch.zeros(b, dtype=torch.int32, device="cuda"))

    def step():
        _core.paged_attention(q3, cache, 0, meta, 1 / math.sqrt(D), out)
    return step


def bench(b, length):
    row = {"batch": b, "seq_len": length}
    q = torch.randn(b, HQ, 1, D, device="cuda").half()
    k = torch.randn(b, HKV, length, D, device="cuda").half()
    v = torch.randn(b, HKV, length, D, device="cuda").half()  # its own memory: V must not hit K's lines in L2
    row["sdpa_fp16_us"] = profiled_kernel_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), REPS)
    k = v = None
    q3 = q.view(b, HQ, D).contiguous()
    out = torch.empty_like(q3)
    for name, kt, vt, pc, group in [("kv8", "u8", "u8", False, 0), ("kv4", "u4", "u4", False, 0),
                                    ("kc4v4", "u4", "u4", True, 64), ("kc4v8", "u4", "u8", True, 64),
                                    ("kc4g128v4", "u4", "u4", True, 128), ("kc4g32v4", "u4", "u4", True, 32)]:
        step = decode_step(q3, out, b, length, kt, vt, pc, group)
        t = profiled_kernel_us(step, REPS)
        row[f"{name}_us"] = t
        row[f"{name}_vs_sdpa"] = row["sdpa_fp16_us"] / t
        if pc:
            row[f"{name}_parts_us"] = breakdown_us(step)
        step = None  # frees the cache
        torch.cuda.empty_cache()
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench_kv_per_channel.json"
    rows = []
    print(f"{'B x L':>12} {'SDPA':>8} {'kv8':>8} {'kv4':>8} {'kc4v4':>8} {'kc4v8':>8} {'kc4g128':>8} {'kc4g32':>8}"
          "   (us; kc4v4 / kv4; kc4v4 codes / window / merge)")
    for b, length in CONFIGS:
        r = bench(b, length)
        rows.append(r)
        parts = " / ".join(f"{v:.1f}" for v in r["kc4v4_parts_us"].values())
        print(f"{b:>4} x {length:<6} {r['sdpa_fp16_us']:8.1f} {r['kv8_us']:8.1f} {r['kv4_us']:8.1f} "
              f"{r['kc4v4_us']:8.1f} {r['kc4v8_us']:8.1f} {r['kc4g128v4_us']:8.1f} {r['kc4g32v4_us']:8.1f}   "
              f"{r['kc4v4_us'] / r['kv4_us']:.2f}x; {parts}", flush=True)
    write_json(out, {"meta": device_meta(), "decode_attention": rows})


if __name__ == "__main__":
    main()
