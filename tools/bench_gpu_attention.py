"""Paged decode attention (f16 / u8 / u4 KV) vs SDPA fp16 (enable_gqa) on Llama-3-8B heads:
32 query heads, 8 kv heads, head_dim 128. Writes JSON (argv[1]) and prints a table. --split-sweep also
times each explicit split size (SPLITS).

Prefill (run by default after decode; --prefill runs it alone, --decode skips it): one fresh prompt (q_len = kv_len) of
PREFILL_LENS tokens through paged_attention, each prefill kernel forced by name (on sm_90 the wgmma kernel
prefill_attention_sm90 and the mma.sync kernel prefill_attention_tc_sm80), vs causal SDPA on contiguous f16
q/k/v; the f16-cache output is checked against SDPA's (max abs difference recorded). PREFILL_KV also holds per-channel
K formats (kc4v4, kc2v2: K per channel over blocks of PREFILL_PC_BLOCK = 64 tokens, the recipe default, V per token);
the prompt fills whole blocks, so every query reads its own block as f16 window rows. paged_attention copies its seq_info to the device on each call, so the lowbit
time is the prefill kernel's own device time from the profiler (the SDPA time is its kernels' too).
Prefill is compute bound: TFLOPS count the causal half, 4 * Hq * D * L(L+1)/2."""
import math
import sys

import torch
import torch.nn.functional as F

import lowbit
from lowbit import _core

from bench_gpu_common import (copies_for, copy_bandwidth_gbs, device_meta, graph_time_us, profiled_kernel_us,
                              write_json)

HQ, HKV, D, BLOCK = 32, 8, 128, 16
CONFIGS = [(1, 8192), (1, 32768), (1, 131072), (16, 8192), (64, 4096), (64, 8192)]
SPLITS = [256, 512, 1024, 2048, 4096, 8192]  # --split-sweep: explicit split_tokens tried per config
PREFILL_LENS = [512, 2048, 8192, 32768]
PREFILL_KV = ["f16", "u8", "u4", "u2", "kc4v4", "kc2v2"]
PREFILL_PC_BLOCK = 64
PREFILL_REPS = 10


def paged_cache(kv, b, length):
    nblk = b * length // BLOCK
    table = torch.randperm(nblk, device="cuda", dtype=torch.int32).view(b, length // BLOCK)
    if kv == "f16":
        k = torch.randn(nblk, HKV, BLOCK, D, device="cuda").half()
        v = torch.randn(nblk, HKV, BLOCK, D, device="cuda").half()
        return k, v, None, None, table
    width = D if kv == "u8" else D // 2
    k = torch.randint(0, 256, (nblk, HKV, BLOCK, width), dtype=torch.uint8, device="cuda")
    v = torch.randint(0, 256, (nblk, HKV, BLOCK, width), dtype=torch.uint8, device="cuda")
    kp = torch.stack([torch.rand(nblk, HKV, BLOCK, device="cuda") * 0.1, torch.randn(nblk, HKV, BLOCK, device="cuda")], -1)
    vp = torch.stack([torch.rand(nblk, HKV, BLOCK, device="cuda") * 0.1, torch.randn(nblk, HKV, BLOCK, device="cuda")], -1)
    return k, v, kp, vp, table


def kv_bytes(kv, b, length):
    per_elem = {"f16": 2, "u8": 1, "u4": 0.5}[kv]
    params = 0 if kv == "f16" else 2 * 8  # (scale, zero) f32 for K and V
    return int(b * length * HKV * (2 * D * per_elem + params))


def bench(b, length, l2, meta, split_sweep=False):
    row = {"batch": b, "seq_len": length}
    q = torch.randn(b, HQ, 1, D, device="cuda").half()
    sdpa_bytes = kv_bytes("f16", b, length)
    copies = copies_for(sdpa_bytes, l2, at_least=1)
    kvs = [(torch.randn(b, HKV, length, D, device="cuda").half(), torch.randn(b, HKV, length, D, device="cuda").half())
           for _ in range(copies)]
    row["sdpa_fp16_us"] = graph_time_us([lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                                         for k, v in kvs])
    del kvs
    q3 = q.view(b, HQ, D)
    out = torch.empty(b, HQ, D, device="cuda").half()
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    lq, lout, llens = (lowbit.from_dlpack(t) for t in (q3, out, lens))
    stream = torch.cuda.current_stream
    for kv in ["f16", "u8", "u4"]:
        nbytes = kv_bytes(kv, b, length)
        caches = []
        for _ in range(copies_for(nbytes, l2, at_least=1)):
            k, v, kp, vp, table = paged_cache(kv, b, length)
            caches.append(tuple(None if t is None else lowbit.from_dlpack(t) for t in (k, v, kp, vp, table)) +
                          ((k, v, kp, vp, table),))  # keep torch owners alive

        def make(c, kv=kv, split=0):
            return lambda: _core.decode_attention(lq, c[0], c[1], c[2], c[3], c[4], llens, length,
                                                  1 / math.sqrt(D), lout, kv_dtype=kv, split_tokens=split,
                                                  stream=stream().cuda_stream)
        t = graph_time_us([make(c) for c in caches])
        row[f"lowbit_{kv}_us"] = t
        row[f"lowbit_{kv}_gbs"] = nbytes / (t * 1e3)
        row[f"speedup_{kv}_vs_sdpa"] = row["sdpa_fp16_us"] / t
        if split_sweep:  # the data behind the split-size heuristic: time per explicit split size
            row[f"lowbit_{kv}_us_by_split"] = {s: graph_time_us([make(c, split=s) for c in caches])
                                               for s in SPLITS if s < length}
        del caches
    row["sdpa_gbs"] = sdpa_bytes / (row["sdpa_fp16_us"] * 1e3)
    return row


def bench_prefill(length):
    """One fresh prompt of `length` tokens: lowbit's paged prefill (f16/u8/u4 KV) vs causal SDPA."""
    flops = 4 * HQ * D * length * (length + 1) / 2
    row = {"seq_len": length, "causal_gflop": flops / 1e9}
    q = torch.randn(length, HQ, D, device="cuda").half()
    k = torch.randn(length, HKV, D, device="cuda").half()
    v = torch.randn(length, HKV, D, device="cuda").half()
    qs, ks, vs = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))  # [1, H, L, D]
    row["sdpa_fp16_us"] = profiled_kernel_us(
        lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True), PREFILL_REPS)
    row["sdpa_tflops"] = flops / (row["sdpa_fp16_us"] * 1e6)
    del qs, ks, vs
    nblk = -(-length // BLOCK)
    table = torch.randperm(nblk, dtype=torch.int32).view(1, nblk)
    slots = (table[0, torch.arange(length) // BLOCK].long() * BLOCK + torch.arange(length) % BLOCK).to(torch.int32)
    meta = _core.AttentionMeta([0], [length], [length], table.cuda(), slots.cuda())
    out = torch.empty_like(q)
    heads_first = [x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)]  # [1, H, L, D]
    ref = F.scaled_dot_product_attention(*heads_first, is_causal=True, enable_gqa=True)[0].transpose(0, 1).float()
    major, minor = torch.cuda.get_device_capability()
    kernels = (["prefill_attention_sm90"] if (major, minor) == (9, 0) else []) + ["prefill_attention_tc_sm80"]
    for kv in PREFILL_KV:
        if kv.startswith("kc"):  # per-channel K: its own block size, window slots prepared before the write
            bits = {"4": "u4", "2": "u2"}
            pc_blk = -(-length // PREFILL_PC_BLOCK)
            pc_table = torch.randperm(pc_blk, dtype=torch.int32).view(1, pc_blk)
            pc_slots = (pc_table[0, torch.arange(length) // PREFILL_PC_BLOCK].long() * PREFILL_PC_BLOCK +
                        torch.arange(length) % PREFILL_PC_BLOCK).to(torch.int32)
            cache = _core.KVCache(1, HKV, D, pc_blk, block_size=PREFILL_PC_BLOCK, k_type=bits[kv[2]],
                                  v_type=bits[kv[4]], device="cuda", k_per_channel=True, k_window_slots=pc_blk)
            kv_meta = _core.AttentionMeta([0], [length], [length], pc_table.cuda(), pc_slots.cuda())
            _core.prepare_k_window(cache, pc_slots)
        else:
            cache = _core.KVCache(1, HKV, D, nblk, BLOCK, kv, kv, "cuda")
            kv_meta = meta
        _core.kv_write(cache, 0, k, v, kv_meta)
        for name in kernels:
            tag = f"{kv}" if name == kernels[0] else f"{kv}_{name}"
            out.fill_(float("nan"))
            call = (lambda name=name, cache=cache, kv_meta=kv_meta:
                    _core.paged_attention(q, cache, 0, kv_meta, 1 / math.sqrt(D), out, kernel=name))
            t = profiled_kernel_us(call, PREFILL_REPS, "prefill_attention")
            row[f"lowbit_{tag}_us"] = t
            row[f"lowbit_{tag}_tflops"] = flops / (t * 1e6)
            row[f"speedup_{tag}_vs_sdpa"] = row["sdpa_fp16_us"] / t
            row[f"max_abs_diff_{tag}_vs_sdpa"] = float((out.float() - ref).abs().max())
        del cache
    row["kernels"] = kernels
    return row


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else "bench_attention.json"
    sweep = "--split-sweep" in sys.argv
    prefill_only = "--prefill" in sys.argv
    decode_only = "--decode" in sys.argv
    meta = device_meta()
    meta["copy_bandwidth_gbs"] = copy_bandwidth_gbs()
    rows = []
    for b, length in [] if prefill_only else CONFIGS:
        r = bench(b, length, meta["l2_bytes"], meta, split_sweep=sweep)
        rows.append(r)
        print(f"B={b:3d} L={length:6d}  sdpa {r['sdpa_fp16_us']:8.1f} us ({r['sdpa_gbs']:5.0f} GB/s)  "
              f"f16 {r['lowbit_f16_us']:8.1f} ({r['lowbit_f16_gbs']:5.0f})  u8 {r['lowbit_u8_us']:8.1f} "
              f"({r['lowbit_u8_gbs']:5.0f})  u4 {r['lowbit_u4_us']:8.1f} ({r['lowbit_u4_gbs']:5.0f})  "
              f"x{r['speedup_u8_vs_sdpa']:.2f}/x{r['speedup_u4_vs_sdpa']:.2f}", flush=True)
        for kv in ("f16", "u8", "u4") if sweep else ():
            print(f"    {kv} by split_tokens: " + "  ".join(f"{s}: {t:.1f}" for s, t in r[f"lowbit_{kv}_us_by_split"].items()))
        torch.cuda.empty_cache()
    prefill_rows = []
    for length in [] if decode_only else PREFILL_LENS:
        r = bench_prefill(length)
        prefill_rows.append(r)
        print(f"prefill L={length:5d}  sdpa {r['sdpa_fp16_us']:9.1f} us ({r['sdpa_tflops']:5.1f} TFLOPS)  " +
              "  ".join(f"{tag} {r[f'lowbit_{tag}_us']:9.1f} ({r[f'lowbit_{tag}_tflops']:5.1f}, "
                        f"err {r[f'max_abs_diff_{tag}_vs_sdpa']:.1e})"
                        for tag in (kv if name == r["kernels"][0] else f"{kv}_{name}"
                                    for kv in PREFILL_KV for name in r["kernels"])),
              flush=True)
        torch.cuda.empty_cache()
    write_json(out, {"meta": meta, "attention": rows, "prefill": prefill_rows})


if __name__ == "__main__":
    main()
