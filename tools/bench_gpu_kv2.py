"""Decode attention over 2-bit KV (kv2 per token, kc2v2 per-channel K with its f16 window) beside kv4, kc4v4 and
SDPA fp16 on Llama-3-8B heads (32 q / 8 kv heads, head_dim 128), at issue 16's decode shapes: the kernel time of one
decode step over a paged cache written by kv_write (tools/bench_gpu_kv_per_channel.py's filled_cache), as the
profiler's kernel times (decode kernels and the split merge; each also alone: {name}_attn_us, {name}_merge_us). With
KV2_SWEEP=1, for kv4 and kv2 it also times the op's internals at other forced split sizes (the rule before the
whole-wave split plan, and one more) on a cache of the same shape (split_sweep; written 2026-11-27, not yet run); with
KV2_MAIN_PLAN=1, at the split main's plan (f5640a6) picks (the op's kernels, same process). Effective bandwidth = the
cache bytes one step reads (codes + parameters; SDPA: f16 K and V) / time, beside the copy bandwidth of the card (a 2
GiB device copy). Writes JSON (argv[1]) and prints a table."""
import math
import os
import sys

import torch
import torch.nn.functional as F

from lowbit import _core
from bench_gpu_common import copy_bandwidth_gbs, device_meta, profiled_kernel_parts_us, profiled_kernel_us, write_json
from bench_gpu_kv_per_channel import D, HKV, HQ, decode_step, filled_cache

CONFIGS = [(64, 8192), (1, 131072), (16, 32768), (256, 1536)]
# KV2_CONFIGS=64x8192,1x131072 times only those shapes.
if os.environ.get("KV2_CONFIGS"):
    CONFIGS = [tuple(int(x) for x in c.split("x")) for c in os.environ["KV2_CONFIGS"].split(",")]
REPS = 20
# name, K type, V type, K per channel, group
FORMATS = [("kv4", "u4", "u4", False, 0), ("kc4v4", "u4", "u4", True, 64), ("kv2", "u2", "u2", False, 0),
           ("kc2v2", "u2", "u2", True, 64), ("kc2g32v2", "u2", "u2", True, 32), ("k4v2", "u4", "u2", False, 0),
           ("kc4v2", "u4", "u2", True, 64), ("kv8", "u8", "u8", False, 0)]
BITS = {"u8": 8, "u4": 4, "u2": 2}
# KV2_FORMATS=kv4,kv2 (comma list of the names above) times only those, for a short device call. kv8 (u8 K and V)
# is there for issue 16's "kv8 at B=256 L=1.5K >= 80% of the copy bandwidth".
if os.environ.get("KV2_FORMATS"):
    FORMATS = [f for f in FORMATS if f[0] in os.environ["KV2_FORMATS"].split(",")]


def bytes_per_step(b, length, kt, vt, per_channel, group):
    """Cache bytes one decode step reads: codes, per-token (scale, zero) f32 pairs or per-channel ones per group."""
    tok = b * length * HKV
    k_params = (b * math.ceil(length / group) * HKV * 2 * D * 4) if per_channel else tok * 8
    return tok * D * (BITS[kt] + BITS[vt]) // 8 + k_params + tok * 8


def profiled_parts_us(fn, reps):
    """(all kernels, the decode kernel, the split merge) in device microseconds per call, from one profile."""
    return tuple(profiled_kernel_parts_us(fn, reps, ["", "decode_attention_kernel", "combine_splits"]))


def old_rule_split(b, length):
    """decode_attention's split before the whole-wave plan: ceil(4 SMs / (B x kv heads)) splits, >= min(512, L/16)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_split_blocks = b * HKV * ((HQ // HKV + 7) // 8)
    wanted = max(1, -(-4 * sms // per_split_blocks))
    floor = min(max(-(-length // 16), 64), 512)
    per = max(-(-length // wanted), floor)
    return -(-min(per, length + 16) // 16) * 16


def whole_wave_split(b, length, blocks_per_sm=4):
    """decode_attention's split at main f5640a6 (the whole-wave plan; 4 resident blocks per SM for u4/u4 and u2/u2):
    one wave of splits at small batches, else about one wave at 4 blocks per SM, >= min(512, L/16) tokens."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    slots, per_split_blocks = blocks_per_sm * sms, b * HKV * ((HQ // HKV + 7) // 8)
    if 2 * per_split_blocks <= slots:
        wanted = max(1, slots // per_split_blocks)
    else:
        wanted = max(1, -(-4 * sms // per_split_blocks))
    floor = min(max(-(-length // 16), 64), 512)
    per = max(-(-length // wanted), floor)
    return -(-min(per, length + 16) // 16) * 16


def split_sweep(q3, out, b, length, kt, vt, splits):
    """The op's kernels (decode + merge) at forced split sizes over one cache of that format: {split: us}."""
    cache, table = filled_cache(b, length, kt, vt, False)
    raw = lambda t: torch.from_dlpack(t)
    k, v = raw(cache.k_data(0).view_as_bytes()), raw(cache.v_data(0).view_as_bytes())
    kp, vp = raw(cache.k_params(0)), raw(cache.v_params(0))
    tab, lens = table.cuda(), torch.full((b,), length, dtype=torch.int32, device="cuda")
    res = {}
    for s in splits:
        fn = lambda: _core.decode_attention(q3, k, v, kp, vp, tab, lens, length, 1 / math.sqrt(D), out, kv_dtype=kt,
                                            split_tokens=s, v_dtype=vt)
        res[str(s)] = profiled_parts_us(fn, REPS)[0]
    return res


def bench(b, length):
    row = {"batch": b, "seq_len": length}
    q = torch.randn(b, HQ, 1, D, device="cuda").half()
    k = torch.randn(b, HKV, length, D, device="cuda").half()
    v = torch.randn(b, HKV, length, D, device="cuda").half()
    row["sdpa_fp16_us"] = profiled_kernel_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), REPS)
    row["sdpa_fp16_gbps"] = 2 * k.numel() * 2 / row["sdpa_fp16_us"] / 1e3
    k = v = None
    torch.cuda.empty_cache()
    q3 = q.view(b, HQ, D).contiguous()
    out = torch.empty_like(q3)
    for name, kt, vt, pc, group in FORMATS:
        step = decode_step(q3, out, b, length, kt, vt, pc, group)
        t, row[f"{name}_attn_us"], row[f"{name}_merge_us"] = profiled_parts_us(step, REPS)
        row[f"{name}_us"] = t
        row[f"{name}_vs_sdpa"] = row["sdpa_fp16_us"] / t
        row[f"{name}_gbps"] = bytes_per_step(b, length, kt, vt, pc, group or 16) / t / 1e3
        step = None  # frees the cache
        torch.cuda.empty_cache()
        if name in ("kv4", "kv2") and os.environ.get("KV2_MAIN_PLAN") == "1":
            # The op (kernel + merge) at the split main's plan picks, same process: what the split plan alone changed.
            split = whole_wave_split(b, length)
            row[f"{name}_main_plan_split"] = split
            row[f"{name}_main_plan_us"] = split_sweep(q3, out, b, length, kt, vt, [split])[str(split)]
            torch.cuda.empty_cache()
        if name in ("kv4", "kv2") and os.environ.get("KV2_SWEEP") == "1":
            old = old_rule_split(b, length)
            other = 8192 if old != 8192 else 4096
            row[f"{name}_split_sweep_us"] = split_sweep(q3, out, b, length, kt, vt, sorted({old, other}))
            torch.cuda.empty_cache()
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench_kv2.json"
    copy = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy:.0f} GB/s")
    names = [f[0] for f in FORMATS]
    print(f"{'B x L':>12} {'SDPA':>8} " + " ".join(f"{n:>8}" for n in names) + "   (us; x SDPA; GB/s / copy)")
    rows = []
    for b, length in CONFIGS:
        r = bench(b, length)
        rows.append(r)
        print(f"{b:>4} x {length:<6} {r['sdpa_fp16_us']:8.1f} " + " ".join(f"{r[n + '_us']:8.1f}" for n in names))
        print(f"{'':>12} {'1.00x':>8} " + " ".join(f"{r[n + '_vs_sdpa']:7.2f}x" for n in names))
        print(f"{'':>12} {r['sdpa_fp16_gbps'] / copy:7.0%} " + " ".join(f"{r[n + '_gbps'] / copy:8.0%}" for n in names),
              flush=True)
        print(f"{'attn+merge':>12} {'':>8} " + " ".join(f"{r[n + '_attn_us']:4.0f}+{r[n + '_merge_us']:<3.1f}" for n in names))
        for n in names:
            if f"{n}_main_plan_us" in r:
                us = r[n + "_main_plan_us"]
                print(f"{'':>12} {n} at main's plan (split {r[n + '_main_plan_split']}): {us:.1f} us"
                      f" ({r['sdpa_fp16_us'] / us:.2f}x)")
            if f"{n}_split_sweep_us" in r:
                print(f"{'':>12} {n} forced splits: " + ", ".join(f"{k} tok {v:.1f} us" for k, v in r[f"{n}_split_sweep_us"].items()))
    write_json(out, {"meta": device_meta(), "copy_gbps": copy, "decode_attention": rows})


if __name__ == "__main__":
    main()
