"""FlashInfer as a second attention peer (issue 16), beside SDPA and lowbit in one process, Llama-3-8B heads
(32 q / 8 kv heads, head_dim 128), pages of 16, f16 queries.

  decode:  B sequences of L cached tokens, one query token each (issue 16's decode shapes). SDPA fp16 on contiguous
           K/V; FlashInfer's paged decode on an f16 cache and on an fp8 e4m3 cache (its low-bit KV), its CUDA-core
           kernel and its tensor-core one (use_tensor_cores; FLASHINFER_DECODE_KERNELS picks, default f16, f16_tc,
           fp8_tc); lowbit's paged_attention on kv8 / kv4 / kv2 caches written by kv_write
           (bench_gpu_kv_per_channel.decode_step).
  prefill: one fresh causal prompt of L tokens: SDPA (flash), FlashInfer's single prefill (FLASHINFER_BACKENDS,
           default fa3), lowbit's Hopper prefill kernel on an f16 cache and a u4 cache.
  chunk:   one chunk of C new tokens over P cached ones (issue 16's chunked-prefill target): FlashInfer's paged batch
           prefill on f16 (causal, aligned to the last key) against lowbit's prefill kernel on f16 / u8 / u4 caches.

Times are the profiler's kernel times (all kernels of a call, copies left out: FlashInfer's split-KV merge and
lowbit's split merge included), mean of REPS calls after warm-up. A FlashInfer path that fails to import, compile
or run is recorded with its error and skipped, never fatal; the first call's wall time (its JIT compile) is
recorded. Outputs are checked against SDPA's (max abs difference). Writes JSON (argv[1]) and prints a table.
FLASHINFER_PARTS=decode,prefill,chunk picks parts; FLASHINFER_DECODE=64x8192,... and FLASHINFER_PREFILL=2048,...
and FLASHINFER_CHUNK=1:8192:256,... pick shapes."""
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from lowbit import _core

from bench_gpu_common import device_meta, profiled_kernel_us, write_json
from bench_gpu_kv_per_channel import decode_step

HQ, HKV, D, BLOCK = 32, 8, 128, 16
REPS = 20
PARTS = os.environ.get("FLASHINFER_PARTS", "decode,prefill,chunk").split(",")
DECODE = [tuple(int(x) for x in c.split("x")) for c in
          os.environ.get("FLASHINFER_DECODE", "64x8192,1x131072,16x32768,256x1536").split(",") if c]
PREFILL = [int(x) for x in os.environ.get("FLASHINFER_PREFILL", "2048,8192,32768").split(",") if x]
CHUNK = [tuple(int(y) for y in c.split(":")) for c in
         os.environ.get("FLASHINFER_CHUNK", "1:8192:256,1:32768:256").split(",") if c]
# Which FlashInfer kernels run (each is a JIT compile of a minute or more on first use): decode over f16 / fp8
# caches on CUDA cores or tensor cores (_tc), prefill backends.
FI_DECODE = os.environ.get("FLASHINFER_DECODE_KERNELS", "f16,f16_tc,fp8_tc").split(",")
FI_BACKENDS = os.environ.get("FLASHINFER_BACKENDS", "fa3").split(",")
LOWBIT_DECODE = [("kv8", "u8"), ("kv4", "u4"), ("kv2", "u2")]
SCALE = 1 / math.sqrt(D)

try:
    import flashinfer
    FI_ERROR = None
except Exception as e:  # noqa: BLE001 - recorded: the peer is optional
    flashinfer, FI_ERROR = None, repr(e)[:300]


def timed_peer(row, tag, make, ref=None):
    """Builds the peer's call (make() -> callable returning the output), runs it once (the JIT compile, timed by
    wall clock), checks it against ref, then records its kernel time. Any failure is recorded under tag_error."""
    try:
        t0 = time.perf_counter()
        fn = make()
        out = fn()
        torch.cuda.synchronize()
        row[f"{tag}_first_call_s"] = round(time.perf_counter() - t0, 2)
        if ref is not None:
            row[f"{tag}_max_abs_vs_sdpa"] = float((out.float().reshape(ref.shape) - ref).abs().max())
        row[f"{tag}_us"] = profiled_kernel_us(fn, REPS)
    except Exception as e:  # noqa: BLE001
        row[f"{tag}_error"] = repr(e)[:300]
        print(f"  {tag}: {row[tag + '_error']}", flush=True)


def paged_layout(b, length):
    """FlashInfer's page arrays for b sequences of `length` tokens over shuffled pages: (indptr, indices, last)."""
    per = -(-length // BLOCK)
    indices = torch.randperm(b * per, dtype=torch.int32, device="cuda")
    indptr = torch.arange(0, b * per + 1, per, dtype=torch.int32, device="cuda")
    last = torch.full((b,), length - (per - 1) * BLOCK, dtype=torch.int32, device="cuda")
    return indptr, indices, last, b * per


def paged_from_contiguous(k, v, indices, pages, dtype):
    """[b, L, Hkv, D] K and V -> a FlashInfer NHD cache [pages, 2, BLOCK, Hkv, D] holding them at `indices`."""
    b, length = k.shape[:2]
    per = -(-length // BLOCK)
    cache = torch.zeros(pages, 2, BLOCK, HKV, D, device="cuda", dtype=torch.float16)
    pad = per * BLOCK - length
    for i, t in enumerate((k, v)):
        t = F.pad(t, (0, 0, 0, 0, 0, pad)).view(b * per, BLOCK, HKV, D)
        cache[indices.long(), i] = t
    return cache.to(dtype)


def bench_decode(b, length, workspace):
    row = {"batch": b, "seq_len": length}
    q = torch.randn(b, HQ, D, device="cuda").half()
    k = torch.randn(b, length, HKV, D, device="cuda").half()
    v = torch.randn(b, length, HKV, D, device="cuda").half()
    qs, ks, vs = q.unsqueeze(2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # [b, H, L, D]
    ref = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True).squeeze(2).float()
    row["sdpa_fp16_us"] = profiled_kernel_us(lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True),
                                             REPS)
    if flashinfer is not None:
        indptr, indices, last, pages = paged_layout(b, length)
        for kv_name, dtype in (("f16", torch.float16), ("fp8", torch.float8_e4m3fn)):
            if not any(v.startswith(kv_name) for v in FI_DECODE):
                continue
            cache = paged_from_contiguous(k, v, indices, pages, dtype)
            for tc in [tc for tc in (False, True) if f"{kv_name}{'_tc' if tc else ''}" in FI_DECODE]:
                def make(cache=cache, dtype=dtype, tc=tc):
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tc)
                    w.plan(indptr, indices, last, HQ, HKV, D, BLOCK, q_data_type=torch.float16, kv_data_type=dtype)
                    return lambda: w.run(q, cache)
                # fp8 is compared with SDPA on the f16 values: its error is the e4m3 rounding
                timed_peer(row, f"flashinfer_{kv_name}{'_tc' if tc else ''}", make, ref)
            del cache
            torch.cuda.empty_cache()
    del k, v, ks, vs
    torch.cuda.empty_cache()
    out = torch.empty_like(q)
    for name, t in LOWBIT_DECODE:
        step = decode_step(q, out, b, length, t, t, False, 0)
        row[f"lowbit_{name}_us"] = profiled_kernel_us(step, REPS)
        del step
        torch.cuda.empty_cache()
    return row


def lowbit_prefill(q, k, v, kv_type, q_len, kv_len):
    """lowbit's Hopper prefill kernel over a cache of kv_type holding k / v ([kv_len, Hkv, D]); the query rows are
    the last q_len positions. Returns the callable (its cache lives with it)."""
    per = -(-kv_len // BLOCK)
    table = torch.randperm(per, dtype=torch.int32).view(1, per)
    pos = torch.arange(kv_len)
    slots = (table[0, pos // BLOCK].long() * BLOCK + pos % BLOCK).to(torch.int32)
    write_meta = _core.AttentionMeta([0], [kv_len], [kv_len], table.cuda(), slots.cuda())
    meta = _core.AttentionMeta([0], [q_len], [kv_len], table.cuda(), slots[kv_len - q_len:].cuda())
    cache = _core.KVCache(1, HKV, D, per, BLOCK, kv_type, kv_type, "cuda")
    _core.kv_write(cache, 0, k, v, write_meta)
    out = torch.empty_like(q)

    def call():
        _core.paged_attention(q, cache, 0, meta, SCALE, out, kernel="prefill_attention_sm90")
        return out
    return call


def sdpa_causal(q, k, v, q_len, kv_len):
    """(reference output [q_len, Hq, D] f32, SDPA callable); the mask aligned to the last key when q_len < kv_len."""
    qs, ks, vs = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))  # [1, H, L, D]
    if q_len == kv_len:
        fn = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    else:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q_len, kv_len)
        fn = lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
    return fn()[0].transpose(0, 1).float(), fn


def bench_prefill(prefix, q_len, workspace):
    kv_len = prefix + q_len
    flops = 4 * HQ * D * (q_len * prefix + q_len * (q_len + 1) / 2)
    row = {"prefix": prefix, "q_len": q_len, "kv_len": kv_len, "causal_gflop": flops / 1e9}
    q = torch.randn(q_len, HQ, D, device="cuda").half()
    k = torch.randn(kv_len, HKV, D, device="cuda").half()
    v = torch.randn(kv_len, HKV, D, device="cuda").half()
    ref, sdpa = sdpa_causal(q, k, v, q_len, kv_len)
    row["sdpa_fp16_us"] = profiled_kernel_us(sdpa, REPS if kv_len < 32768 else 5)
    if flashinfer is not None and prefix == 0:
        for backend in FI_BACKENDS:
            timed_peer(row, f"flashinfer_{backend}", lambda backend=backend: (
                lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend)), ref)
    elif flashinfer is not None:
        indptr, indices, last, pages = paged_layout(1, kv_len)
        cache = paged_from_contiguous(k.unsqueeze(0), v.unsqueeze(0), indices, pages, torch.float16)
        qo_indptr = torch.tensor([0, q_len], dtype=torch.int32, device="cuda")
        for backend in FI_BACKENDS:
            def make(backend=backend):
                w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
                w.plan(qo_indptr, indptr, indices, last, HQ, HKV, D, BLOCK, causal=True,
                       q_data_type=torch.float16, kv_data_type=torch.float16)
                return lambda: w.run(q, cache)
            timed_peer(row, f"flashinfer_paged_{backend}", make, ref)
        del cache
    for kv_type in ("f16", "u8", "u4") if prefix else ("f16", "u4"):
        call = lowbit_prefill(q, k, v, kv_type, q_len, kv_len)
        out = call()
        torch.cuda.synchronize()
        row[f"lowbit_{kv_type}_max_abs_vs_sdpa"] = float((out.float() - ref).abs().max())
        row[f"lowbit_{kv_type}_us"] = profiled_kernel_us(call, REPS if kv_len < 32768 else 5)
        del call
    for key in [k_ for k_ in row if k_.endswith("_us")]:
        row[key.replace("_us", "_tflops")] = flops / (row[key] * 1e6)
    torch.cuda.empty_cache()
    return row


def ratios(row, keys):
    base = row["sdpa_fp16_us"]
    return "  ".join(f"{k} {row[k + '_us']:.1f} ({base / row[k + '_us']:.2f}x)" if k + "_us" in row else f"{k} -"
                     for k in keys)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench_flashinfer.json"
    meta = device_meta()
    meta["timing"] = f"torch profiler kernel time (all kernels of a call), mean of {REPS} calls after warm-up"
    meta["flashinfer"] = getattr(flashinfer, "__version__", None) if flashinfer else None
    meta["flashinfer_import_error"] = FI_ERROR
    print("flashinfer:", meta["flashinfer"] or FI_ERROR, flush=True)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    result = {"meta": meta, "decode": [], "prefill": [], "chunk": []}
    if "decode" in PARTS:
        for b, length in DECODE:
            r = bench_decode(b, length, workspace)
            result["decode"].append(r)
            write_json(path, result)
            print(f"decode {b:>3} x {length:<6} sdpa {r['sdpa_fp16_us']:.1f} us  " +
                  ratios(r, ["flashinfer_f16", "flashinfer_f16_tc", "flashinfer_fp8", "flashinfer_fp8_tc",
                             "lowbit_kv8", "lowbit_kv4", "lowbit_kv2"]), flush=True)
    for part, shapes in (("prefill", [(0, L) for L in PREFILL]), ("chunk", [(p, c) for _, p, c in CHUNK])):
        if part not in PARTS:
            continue
        for prefix, q_len in shapes:
            r = bench_prefill(prefix, q_len, workspace)
            result[part].append(r)
            write_json(path, result)
            peers = [f"flashinfer_{'paged_' if prefix else ''}{b}" for b in FI_BACKENDS]
            lows = ["lowbit_f16", "lowbit_u4"] if prefix == 0 else ["lowbit_f16", "lowbit_u8", "lowbit_u4"]
            print(f"{part} P={prefix:<6} C={q_len:<6} sdpa {r['sdpa_fp16_us']:.1f} us "
                  f"({r['sdpa_fp16_tflops']:.0f} TFLOPS)  " + ratios(r, peers + lows), flush=True)
    write_json(path, result)


if __name__ == "__main__":
    main()
