"""The Hopper prefill kernel's build variants side by side in one process (LOWBIT_PREFILL_SM90_VARIANT, read at each
launch, f16 K/V at head_dim 128 only: bit 1 = the producer's per-row f16 copies, bit 2 = P·V as two n64 wgmmas per
16 keys rather than one n128; 0 = the default, round 8 of docs/benchmarks_gpu.md),
against causal SDPA on the same prompt: bench_gpu_attention.py --prefill's shapes and timing (Llama-3-8B heads, one
fresh prompt, pages of BLOCK tokens in random order, the profiler's kernel time, mean of PREFILL_REPS). The f16
variants run twice in alternating order (A B C D A B C D), so a drift of the device shows as a difference between
the two passes. Writes JSON (argv[1]); lengths from argv[2] (comma separated, default 2048,8192,32768)."""
import math
import os
import sys

import torch
import torch.nn.functional as F

from lowbit import _core

from bench_gpu_attention import BLOCK, D, HKV, HQ, PREFILL_PC_BLOCK, PREFILL_REPS
from bench_gpu_common import device_meta, profiled_kernel_us, write_json

KERNEL = "prefill_attention_sm90"
F16_VARIANTS = [0, 1, 2, 3]
OTHER_KV = {"u8": [0], "u4": [0], "u2": [0], "kc4v4": [0]}  # the variants exist for f16 K/V only


def cache_for(kv, k, v, length, meta):
    if kv.startswith("kc"):
        bits = {"4": "u4", "2": "u2"}
        nblk = -(-length // PREFILL_PC_BLOCK)
        table = torch.randperm(nblk, dtype=torch.int32).view(1, nblk)
        pos = torch.arange(length)
        slots = (table[0, pos // PREFILL_PC_BLOCK].long() * PREFILL_PC_BLOCK + pos % PREFILL_PC_BLOCK).to(torch.int32)
        cache = _core.KVCache(1, HKV, D, nblk, block_size=PREFILL_PC_BLOCK, k_type=bits[kv[2]], v_type=bits[kv[4]],
                              device="cuda", k_per_channel=True, k_window_slots=nblk)
        meta = _core.AttentionMeta([0], [length], [length], table.cuda(), slots.cuda())
        _core.prepare_k_window(cache, slots)
    else:
        cache = _core.KVCache(1, HKV, D, -(-length // BLOCK), BLOCK, kv, kv, "cuda")
    _core.kv_write(cache, 0, k, v, meta)
    return cache, meta


def timed(row, tag, call, out, ref, flops, variant):
    os.environ["LOWBIT_PREFILL_SM90_VARIANT"] = str(variant)
    out.fill_(float("nan"))
    t = profiled_kernel_us(call, PREFILL_REPS, "prefill_attention")
    err = float((out.float() - ref).abs().max())
    row.setdefault(f"{tag}_us", []).append(t)
    row[f"{tag}_tflops"] = flops / (min(row[f"{tag}_us"]) * 1e6)
    row[f"{tag}_max_abs_diff_vs_sdpa"] = err
    os.environ.pop("LOWBIT_PREFILL_SM90_VARIANT")
    return t, err


def bench(length):
    flops = 4 * HQ * D * length * (length + 1) / 2
    row = {"seq_len": length, "causal_gflop": flops / 1e9}
    q = torch.randn(length, HQ, D, device="cuda").half()
    k = torch.randn(length, HKV, D, device="cuda").half()
    v = torch.randn(length, HKV, D, device="cuda").half()
    heads_first = [x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v)]
    sdpa = lambda: F.scaled_dot_product_attention(*heads_first, is_causal=True, enable_gqa=True)
    row["sdpa_us"] = [profiled_kernel_us(sdpa, PREFILL_REPS)]
    ref = sdpa()[0].transpose(0, 1).float()
    nblk = -(-length // BLOCK)
    table = torch.randperm(nblk, dtype=torch.int32).view(1, nblk)
    pos = torch.arange(length)
    slots = (table[0, pos // BLOCK].long() * BLOCK + pos % BLOCK).to(torch.int32)
    meta = _core.AttentionMeta([0], [length], [length], table.cuda(), slots.cuda())
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(D)
    cache, kv_meta = cache_for("f16", k, v, length, meta)
    call = lambda: _core.paged_attention(q, cache, 0, kv_meta, scale, out, kernel=KERNEL)
    for _ in range(2):
        for var in F16_VARIANTS:
            timed(row, f"f16_var{var}", call, out, ref, flops, var)
    row["sdpa_us"].append(profiled_kernel_us(sdpa, PREFILL_REPS))
    row["sdpa_tflops"] = flops / (min(row["sdpa_us"]) * 1e6)
    del cache
    for kv, variants in OTHER_KV.items():
        cache, kv_meta = cache_for(kv, k, v, length, meta)
        call = lambda cache=cache, kv_meta=kv_meta: _core.paged_attention(q, cache, 0, kv_meta, scale, out,
                                                                          kernel=KERNEL)
        for var in variants:
            timed(row, f"{kv}_var{var}", call, out, ref, flops, var)
        del cache
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench_prefill_variants.json"
    lens = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2048, 8192, 32768]
    rows = []
    for length in lens:
        r = bench(length)
        rows.append(r)
        sd = min(r["sdpa_us"])
        print(f"L={length:6d} sdpa {sd:9.1f} us ({r['sdpa_tflops']:.0f} TF; passes " +
              " / ".join(f"{t:.1f}" for t in r["sdpa_us"]) + ")", flush=True)
        for key in [k[:-3] for k in r if k.endswith("_us") and k != "sdpa_us"]:
            ts = r[f"{key}_us"]
            print(f"  {key:12s} " + " / ".join(f"{t:9.1f}" for t in ts) + f" us  {r[f'{key}_tflops']:5.0f} TF  "
                  f"x{sd / min(ts):.3f} SDPA  err {r[f'{key}_max_abs_diff_vs_sdpa']:.1e}", flush=True)
        torch.cuda.empty_cache()
    write_json(out, {"meta": device_meta(), "prefill_variants": rows})


if __name__ == "__main__":
    main()
