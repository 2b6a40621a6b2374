"""Prefill attention over a quantized per-token cache on Hopper (prefill_attention_sm90) vs SDPA on f16, with and
without packed query heads in one process: variant 0 = the launch's own choice, 1 = never packed, 2 = always packed
(the kernel option prefill_pack_heads auto / off / on; until f5640a6 the environment variable
LOWBIT_PREFILL_SM90_VARIANT, read at each launch, with the same values). At commits a69c6c5 and 64b4e2f the bits meant: packing always on
unless bit 1, and bit 2 = u8 / u4 / u2 dequantized in f32 (3 = round 8's kernel); their JSONs hold variants 0-3 so.
Llama-3-8B heads (32 q / 8 kv, D 128), pages of 16, profiler kernel time (mean of REPS), causal.
  fresh:   one prompt of L tokens (q_len = kv_len), vs causal SDPA (flash) on contiguous f16 q/k/v, and the kernel on
           an f16 cache.
  chunked: B sequences, each a chunk of C new tokens over a cached prefix of P (kv_len = P + C), vs SDPA with the
           lower-right causal mask on f16 (torch picks a non-flash backend for that mask), and the kernel on an f16
           cache.
Key split (the kernel option prefill_key_split; QCACHE_SPLITS lists them): 0 = the launch's plan (tag
without suffix), N = N splits forced (tag suffix _sN; _s1 = the kernel without the split), the f16 cache included.
QCACHE_REF=1: u4 and u2 also timed with the kernel option prefill_ref_dequant=on (tag suffix _ref: the previous
dequantization, each code shifted and masked), and `{kv}_ref_bits_equal` says whether its out has the same bits as
the placed-field dequantization's on the same cache and q.
QCACHE_COPY: the kernel option prefill_dequant_copy per run, "auto" (tag without suffix) and / or "off" (suffix _nc:
the fused kernel) or "on" (_dc); `{tag}_bits_equal_first_copy` says whether out has the bits of the first setting's;
`{tag}_copy_us` is the dequantized copy's kernel alone (in the same profile as `{tag}_us`, which includes it; 0 where
the launch took the fused kernel).
QCACHE_KV may hold kc4 (u4 K per channel in blocks of 16 with its f16 window, u4 V; QCACHE_REF=1 times its previous
extraction too) and kc2 (u2 K per channel, u2 V); since the per-channel copy (the sealed keys dequantized once) they
take QCACHE_COPY's settings too (until then kc4 ran the launch's choice only).
QCACHE_SIDE: the kernel option prefill_side_stream per run of kc4 / kc2 (the per-channel split on a second stream
beside the copy and the f16 split), "auto" (no suffix), "on" (_ss) and / or "off" (_1s: one stream);
`{tag}_bits_equal_first_side` says whether out has the bits of the first setting's (the same copy setting).
Every timing also has `{tag}_span_us` (sdpa_span_us): from the first kernel's start to the last one's end per call,
mean over the same profile (the summed kernel time counts overlapping kernels twice; one stream: the sum plus the
gaps). QCACHE_GRAPH=1 adds `{tag}_graph_us` (sdpa_graph_us): the calls captured in a CUDA graph (10 per graph, the
metadata's seq_info on the device, so nothing is uploaded in the call) and replayed, median per call over CUDA
events; x SDPA from these two as `{tag}_span_vs_sdpa` / `{tag}_graph_vs_sdpa`.
TFLOPS count the causal part: 4 Hq D sum over rows of the keys each row sees. Writes JSON (argv[1])."""
import math
import os
import sys

import torch
import torch.nn.functional as F

from lowbit import _core

from bench_gpu_common import device_meta, graph_calls_us, profiled_parts_and_span_us, write_json

HQ, HKV, D, BLOCK = 32, 8, 128, 16
FRESH = [int(x) for x in os.environ.get("QCACHE_FRESH", "2048,8192,32768").split(",") if x]
# batch:prefix:chunk
CHUNKED = [tuple(int(y) for y in x.split(":")) for x in os.environ.get(
    "QCACHE_CHUNKED", "1:8192:1024,1:8192:64,16:2048:64,64:1024:16").split(",") if x]
FORMATS = os.environ.get("QCACHE_KV", "u8,u4,u2").split(",")
VARIANTS = [int(x) for x in os.environ.get("QCACHE_VARIANTS", "0,1").split(",")]
SPLITS = [int(x) for x in os.environ.get("QCACHE_SPLITS", "0").split(",")]
REF = os.environ.get("QCACHE_REF", "0") == "1"
REF_KV = os.environ.get("QCACHE_REF_KV", "u4,u2,kc4").split(",")  # the formats QCACHE_REF=1 applies to
COPY = os.environ.get("QCACHE_COPY", "auto").split(",")
COPY_TAG = {"auto": "", "off": "_nc", "on": "_dc"}
SIDE = os.environ.get("QCACHE_SIDE", "auto").split(",")
SIDE_TAG = {"auto": "", "off": "_1s", "on": "_ss"}
GRAPH = os.environ.get("QCACHE_GRAPH", "0") == "1"
REPS = 10
KERNEL = "prefill_attention_sm90"


def timed(row, tag, call, call_on, parts=("",)):
    """row[tag_us] (summed kernel time per call), tag_span_us, and with QCACHE_GRAPH tag_graph_us; returns the
    summed times of `parts` (kernel name parts)."""
    t, span = profiled_parts_and_span_us(call, REPS, list(parts))
    row[f"{tag}_us"] = t[0]
    if span is not None:
        row[f"{tag}_span_us"] = span
    if GRAPH:
        g = graph_calls_us(call_on)
        if g is not None:
            row[f"{tag}_graph_us"] = g
    return t


def sdpa_us(row, q, k, v, b, q_len, kv_len):
    """q [b * q_len, Hq, D], k / v [b * kv_len, Hkv, D] -> SDPA on [b, H, len, D], causal (lower right)."""
    qs, ks, vs = (x.view(b, -1, x.shape[1], D).transpose(1, 2).contiguous() for x in (q, k, v))
    if q_len == kv_len:
        call = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        timed(row, "sdpa", call, lambda s: call())
        return row["sdpa_us"]
    try:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q_len, kv_len)
        call = lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
        timed(row, "sdpa", call, lambda s: call())
        return row["sdpa_us"]
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        print("sdpa lower-right:", repr(e)[:200])
        return None


def case(b, prefix, chunk):
    """b sequences, each a chunk of `chunk` new tokens over `prefix` cached ones (prefix 0: a fresh prompt)."""
    kv_len, q_len = prefix + chunk, chunk
    flops = b * 4 * HQ * D * (q_len * prefix + q_len * (q_len + 1) / 2)
    row = {"batch": b, "prefix": prefix, "q_len": q_len, "kv_len": kv_len, "causal_gflop": flops / 1e9}
    q = torch.randn(b * q_len, HQ, D, device="cuda").half()
    k = torch.randn(b * kv_len, HKV, D, device="cuda").half()
    v = torch.randn(b * kv_len, HKV, D, device="cuda").half()
    t = sdpa_us(row, q, k, v, b, q_len, kv_len)
    if t is not None:
        row["sdpa_tflops"] = flops / (t * 1e6)
    per = -(-kv_len // BLOCK)
    nblk = b * per
    table = torch.randperm(nblk, dtype=torch.int32).view(b, per)
    pos = torch.arange(kv_len)
    slots = torch.cat([table[i, pos // BLOCK].long() * BLOCK + pos % BLOCK for i in range(b)]).to(torch.int32)
    # Every cached token of every sequence written at once (one table row holds them all).
    write_meta = _core.AttentionMeta([0], [b * kv_len], [b * kv_len], table.view(1, -1).cuda(), slots.cuda())
    meta = _core.AttentionMeta([i * q_len for i in range(b)], [q_len] * b, [kv_len] * b, table.cuda(),
                               slots[:1].cuda())
    if GRAPH:  # on the device once: the calls upload nothing (capturable)
        meta.seq_info = torch.tensor([meta.q_start, meta.q_len, meta.kv_len], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    ref = None
    for kv in ["f16"] + FORMATS:
        if kv in ("kc4", "kc2"):  # per-channel u4 / u2 K (its window slots prepared before the write), V alike
            code = "u4" if kv == "kc4" else "u2"
            cache = _core.KVCache(1, HKV, D, nblk, block_size=BLOCK, k_type=code, v_type=code, device="cuda",
                                  k_per_channel=True, k_window_slots=nblk)
            _core.prepare_k_window(cache, slots)
        else:
            cache = _core.KVCache(1, HKV, D, nblk, BLOCK, kv, kv, "cuda")
        _core.kv_write(cache, 0, k, v, write_meta)
        refs = [False, True] if REF and kv in REF_KV else [False]
        copies = ["auto"] if kv == "f16" else COPY
        sides = SIDE if kv in ("kc4", "kc2") else ["auto"]
        outs = {}
        # The previous dequantization runs the fused kernel only (prefill_ref_dequant turns the copy off).
        for var, sp, rf, cp, sd in [(v, sp, rf, cp, sd) for v in ([0] if kv == "f16" else VARIANTS) for sp in SPLITS
                                    for rf in refs for cp in (copies if not rf else copies[-1:]) for sd in sides]:
            opts = {"prefill_pack_heads": ["auto", "off", "on"][var],
                    "prefill_key_split": {0: "auto", 1: "off"}.get(sp, str(sp)), "prefill_dequant_copy": cp}
            if rf:
                opts["prefill_ref_dequant"] = "on"
            if sd != "auto":
                opts["prefill_side_stream"] = sd
            call_on = lambda stream, cache=cache, opts=opts: _core.paged_attention(
                q, cache, 0, meta, 1 / math.sqrt(D), out, kernel=KERNEL, options=opts, stream=stream)
            call = lambda call_on=call_on: call_on(0)
            tag = ((kv if kv == "f16" else f"{kv}_v{var}") + (f"_s{sp}" if sp else "") + ("_ref" if rf else "")
                   + COPY_TAG[cp] + SIDE_TAG[sd])
            # the split's merge kernel and the dequantized copy included; the copy alone beside it
            t, t_copy = timed(row, tag, call, call_on, ["prefill_attention", "dequant_copy"])
            row[f"{tag}_tflops"] = flops / (t * 1e6)
            if kv != "f16":
                row[f"{tag}_copy_us"] = t_copy
            if "sdpa_us" in row:
                row[f"{tag}_vs_sdpa"] = row["sdpa_us"] / t
                for m in ("span", "graph"):
                    if f"{tag}_{m}_us" in row and f"sdpa_{m}_us" in row:
                        row[f"{tag}_{m}_vs_sdpa"] = row[f"sdpa_{m}_us"] / row[f"{tag}_{m}_us"]
            out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            outs[(var, sp, rf, cp, sd)] = out.clone()
            same = lambda x, y: bool(torch.equal(x.view(torch.int16), y.view(torch.int16)))
            if rf:  # the previous dequantization against the placed-field one (same options, the same copy setting)
                row[f"{tag}_bits_equal"] = same(out, outs[(var, sp, False, cp, sd)])
            if cp != copies[0] and not rf and sd == sides[0]:  # this copy setting against the first one's output
                row[f"{tag}_bits_equal_first_copy"] = same(out, outs[(var, sp, False, copies[0], sd)])
            if sd != sides[0] and not rf:  # this side-stream setting against the first one's (same copy setting)
                row[f"{tag}_bits_equal_first_side"] = same(out, outs[(var, sp, False, cp, sides[0])])
            if kv == "f16" and ref is None:
                ref = out.float().clone()
            else:  # vs the f16 cache's first output (a quantized cache: its quantization error, equal across variants
                # up to the dequantization's rounding; the f16 cache unsplit: the split's f32 rounding)
                row[f"{tag}_max_abs_vs_f16"] = float((out.float() - ref).abs().max())
        del cache
    return row


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench_prefill_qcache.json"
    meta = device_meta()
    meta["timing"] = f"torch profiler kernel time, mean of {REPS} calls after one warm-up"
    meta["variants"] = "0 the launch's choice; 1 one query head per CTA (no packing); 2 packing forced"
    meta["splits"] = "tag without _sN: the launch's key-split plan; _sN: N splits forced (_s1: no split)"
    rows = []
    for b, prefix, chunk in [(1, 0, L) for L in FRESH] + CHUNKED:
        r = case(b, prefix, chunk)
        rows.append(r)
        write_json(path, {"meta": meta, "rows": rows})  # after each row: a cut-off run keeps what it measured
        head = (f"B={r['batch']:>3} P={r['prefix']:>6} C={r['q_len']:>6}  "
                f"sdpa {r.get('sdpa_tflops', float('nan')):6.1f}  f16 {r['f16_tflops']:6.1f}")
        sfx = [f"_s{sp}" if sp else "" for sp in SPLITS]
        head += "".join(f"/{r[f'f16{x}_tflops']:.0f}" for x in sfx[1:])
        tags = lambda kv: [COPY_TAG[c] + (SIDE_TAG[sd] if kv in ("kc4", "kc2") else "") for c in COPY
                           for sd in (SIDE if kv in ("kc4", "kc2") else ["auto"])]
        cells = "  ".join(f"{kv}:" + "/".join(f"{r[f'{kv}_v{v}{x}{c}_us']:.1f}"
                                             + (f"(c{r[f'{kv}_v{v}{x}{c}_copy_us']:.1f})"
                                                if r.get(f"{kv}_v{v}{x}{c}_copy_us") else "")
                                             for v in VARIANTS for x in sfx for c in tags(kv))
                          + "".join(f" ref {r[f'{kv}_v{v}{x}_ref{tags(kv)[-1]}_us']:.1f}"
                                    f"{'' if r[f'{kv}_v{v}{x}_ref{tags(kv)[-1]}_bits_equal'] else ' BITS DIFFER'}"
                                    for v in VARIANTS for x in sfx if f"{kv}_v{v}{x}_ref{tags(kv)[-1]}_us" in r)
                          for kv in FORMATS)
        print(head, " ", cells, flush=True)
        spans = "  ".join(f"{k[:-8]} {r[k]:.1f}" for k in r if k.endswith("_span_us"))
        graphs = "  ".join(f"{k[:-9]} {r[k]:.1f}" for k in r if k.endswith("_graph_us"))
        print("   span us:", spans, flush=True)
        if graphs:
            print("   graph us:", graphs, flush=True)
    print("sdpa / f16 in TFLOPS; per format us for the variants", VARIANTS, "x splits", SPLITS, "x copy", COPY,
          "x side stream (kc)", SIDE)


if __name__ == "__main__":
    main()
