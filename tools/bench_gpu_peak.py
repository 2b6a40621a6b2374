"""Peak serving throughput, the QServe / LiquidGEMM protocol: random 1024-token prompts, 512 new tokens per
request (greedy, EOS ignored, so every request makes exactly 512), the largest batch that fits in the GPU's memory.
Llama-3-8B shape with random weights (llama_random.py), every lowbit GPU recipe asked for, and the torch.compile
static-cache baseline (llama_torch_static.py) on the same f16 weights.

Per engine, in its own child process (bench_gpu_llama8b's driver: clean memory figures, a crash costs one part):
  1. the peak batch: the largest rung of --ladder (64, 128, 256, 384, 512, ...) whose KV cache for B x (1024 + 512)
     tokens can be allocated beside the model (lowbit: the Engine's KV pool; torch: the static cache); a rung whose
     run then fails is dropped and the next lower one is run instead;
  2. the fixed batches (--fixed, default 16 and 128) and the peak batch, one measured run each after a warm-up run
     of 4 tokens (--repeats for more), reporting
       decode tok/s   tokens generated after every request has its first token / that time (the papers' figure)
       e2e tok/s      B * 512 / the whole time, prefill included
       prefill tok/s  B * 1024 / the time until every request has its first token
       full batch     lowbit: the median decode step in which all B requests made a token (the static batch that
                      torch.compile's baseline runs throughout), its tok/s and, with CUDA graphs, the step's device
                      time and host walls (Engine.stats())
     and the device memory peak;
  3. at the peak batch, one decode step under torch.profiler, its kernels summed into GEMM / attention / other.
     lowbit: a separate short request batch with CUDA graphs off (each kernel a record), torch: its eager step.
  python3 tools/bench_gpu_peak.py out.json [--parts torch,lowbit] [--recipes w8a8kv8,w4a16kv8] [--ladder ...]
  python3 tools/bench_gpu_peak.py out.json --parts '' --merge a.json b.json    # combine the slices of a session
  python3 tools/bench_gpu_peak.py out.json --tiny --parts lowbit --recipes w4a16kv8   # CPU test of the harness
w4a4 (FMPQ) recipes get a block map per decoder linear with --fmpq-int8-fraction int8 blocks (default 0.1, the issue's
GEMM target) and the input permutations `lowbit quantize --algo fmpq` writes (tools/fmpq_random.py); the part
records the layout under "fmpq".
A recipe may carry kernel overrides for an A/B in one run: --recipes w4a8kv4,w4a8kv4+split_mixed_attention=off;
"+overlap=off" runs the engine with overlap_steps=False (each decode step waited for before the next is queued).
--profile-prefill also profiles two mixed steps of the prefill phase (half the requests decoding, the rest still
prefilling), kernel by kernel, beside their wall time.
"""
import argparse
import gc
import itertools
import json
import os
import sys
import time
import traceback

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import bench_gpu_llama8b as harness  # noqa: E402
import fmpq_random  # noqa: E402
from bench_gpu_llama8b import Part, cuda, free_bytes, lowbit_model, prompt_batch, summarize, sync  # noqa: E402

PROMPT, NEW = 1024, 512
RECIPES = ("w4a16kv8", "w8a8kv8", "w8a8kv4", "w16a16")
KV_MARGIN = 16  # tokens per sequence beyond prompt + new (a partly filled last block)


def use_protocol(prompt, new):
    """The harness's helpers read its PROMPT/NEW (prompt_batch, summarize): set them for this process."""
    harness.PROMPT, harness.NEW = prompt, new


def kernel_class(name):
    n = name.lower()
    if n.startswith("memcpy") or n.startswith("memset"):
        return "copy"  # eager steps copy the logits to the host; graph steps sample on the device
    if any(k in n for k in ("attention", "attn", "fmha", "flash", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "gemv", "nvjet", "xmma", "cutlass", "wgmma", "matmul", "_mm_")):
        return "gemm"
    return "other"


def breakdown(prof, steps):
    """Per-step device ms of GEMM / attention / other kernels, and the ten largest kernels."""
    from bench_gpu_common import kernel_times
    rows = sorted(kernel_times(prof).items(), key=lambda kv: -kv[1][0])
    classes = {"gemm": 0.0, "attention": 0.0, "other": 0.0, "copy": 0.0}
    for name, (us, _) in rows:
        classes[kernel_class(name)] += us
    out = {f"{k}_ms": round(v / steps / 1e3, 3) for k, v in classes.items()}
    out["kernel_ms"] = round((sum(classes.values()) - classes["copy"]) / steps / 1e3, 3)  # without copies
    out["top_kernels"] = [{"kernel": k[:100], "us_per_step": round(v[0] / steps, 1), "class": kernel_class(k)}
                          for k, v in rows[:10]]
    return out


def ladder_fits(part, ladder, fits):
    """fits(batch) -> (ok, why) per rung until one does not fit; records part.d["fits"] and returns the rungs
    that fit, largest first (the peak search's candidates)."""
    found = {}
    for b in ladder:
        ok, why = fits(b)
        found[b] = ok or why
        if not ok:
            break
    part.d["fits"] = {str(b): v for b, v in found.items()}
    return sorted((b for b, v in found.items() if v is True), reverse=True)


def run_batches(part, engine, recipe, fixed, candidates, run, after_error, after_each):
    """The fixed batches, then the peak: the largest candidate whose run succeeds (a failure is recorded and the
    next lower rung tried). run(batch) -> the runs to summarize; after_error() frees what a failed run left;
    after_each() records memory. Returns the peak batch (None when no candidate ran)."""
    peak = None
    for b in list(fixed) + ["peak"]:
        for batch in (candidates if b == "peak" else [b]):
            try:
                case = summarize(engine, recipe, batch, run(batch))
                case["peak_search"] = b == "peak"
                part.d["cases"].append(case)
                print(json.dumps({k: v for k, v in case.items() if k != "runs"}), flush=True)
                if b == "peak":
                    peak = batch
                break
            except Exception as e:  # noqa: BLE001 - recorded; the peak search tries the next lower rung
                part.d["cases"].append({"engine": engine, "recipe": recipe, "batch": batch, "error": repr(e)[:300],
                                        "peak_search": b == "peak"})
                traceback.print_exc()
                after_error()
            finally:
                after_each()
                part.save()
    part.d["peak_batch"] = peak
    return peak


# ---------------------------------------------------------------------------------------------- lowbit
def lowbit_engine(model, batch, graphs=True, overlap=True):
    from lowbit import _core
    kv = model.info()["kv_bytes_per_token"] * batch * (PROMPT + NEW + KV_MARGIN)
    # Repeats reuse the prompts: without prefix caching every run prefills them (the protocol measures prefill).
    return _core.Engine(model, max_batch_tokens=8192, max_seqs=batch, kv_cache_bytes=kv, cuda_graphs=graphs,
                        prefix_caching=False, overlap_steps=overlap)


def lowbit_fits(model, batch):
    try:
        eng = lowbit_engine(model, batch)
    except (MemoryError, RuntimeError) as e:
        return False, repr(e)[:200]
    del eng
    gc.collect()
    return True, ""


def lowbit_profile_prefill(model, batch, shape, steps=2):
    """Mixed steps of the prefill phase: once half the requests have their first token (so half decode while
    the rest prefill in chunks of max_batch_tokens), `steps` eager steps under the profiler, with their wall
    time and what they held. The requests are aborted afterwards."""
    eng = lowbit_engine(model, batch, graphs=False)
    ids = [800000 + i for i in range(batch)]
    for rid, p in zip(ids, prompt_batch(batch, shape.vocab).tolist()):
        eng.add_request(rid, p, temperature=0.0, max_tokens=NEW)
    first = set()
    while len(first) < batch // 2:
        first.update(ev.request_id for ev in eng.step() if ev.token >= 0)
    sync()
    walls = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            t = time.perf_counter()
            eng.step()
            sync()
            walls.append(time.perf_counter() - t)
    decoding = len(first)
    for rid in ids:
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    del eng
    return {"batch": batch, "decoding_rows": decoding, "wall_ms": round(1e3 * sum(walls) / steps, 2),
            **breakdown(prof, steps)}


def lowbit_profile(model, batch, shape, steps=4):
    """Eager decode steps with all `batch` requests decoding (contexts just past the prompt), kernel by kernel.
    Prefill is chunked (max_batch_tokens), so the first requests decode while later ones still prefill: their
    max_tokens must outlast the whole prefill, or they finish before the profiled steps (which then see a
    few rows, not `batch`). The requests are aborted afterwards."""
    eng = lowbit_engine(model, batch, graphs=False)
    ids = [900000 + i for i in range(batch)]
    for rid, p in zip(ids, prompt_batch(batch, shape.vocab).tolist()):
        eng.add_request(rid, p, temperature=0.0, max_tokens=NEW)  # decode rows slow the prefill: keep them all
    first = set()
    while len(first) < batch:  # prefill (chunked by max_batch_tokens) until every request has a token
        first.update(ev.request_id for ev in eng.step() if ev.token >= 0)
    eng.step()
    sync()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            made = sum(ev.token >= 0 for ev in eng.step())
            assert made == batch, f"profiled step made {made} tokens, not {batch}"
        sync()
    for rid in ids:
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    del eng
    return breakdown(prof, steps)


def part_lowbit(args, shape, out, spec):
    from lowbit import _core
    part = Part(out, "lowbit", spec)
    recipe, overrides, overlap = harness.split_spec(spec)
    part.d["overlap_steps"] = overlap
    device, dtype = ("cuda", "f16") if cuda() else ("cpu", "f32")
    t = time.perf_counter()
    model = lowbit_model(shape, recipe, device, dtype, overrides, args.fmpq_int8_fraction)
    if _core.parse_recipe(recipe)["activation"] == "fmpq_mixed":
        part.d["fmpq"] = fmpq_random.describe(shape, args.fmpq_int8_fraction)
    part.d["load_s"] = round(time.perf_counter() - t, 2)
    part.d["kv_bytes_per_token"] = model.info()["kv_bytes_per_token"]
    part.sample_memory()
    part.save()
    candidates = ladder_fits(part, args.ladder, lambda b: lowbit_fits(model, b))
    print(f"lowbit {recipe}: loaded in {part.d['load_s']} s; fits: {part.d['fits']}", flush=True)
    eng = lowbit_engine(model, 8)
    harness.lowbit_run(eng, prompt_batch(8, shape.vocab).tolist(), 4, 0)  # kernels loaded, graphs captured
    del eng
    request_ids = itertools.count(100, 1 << 20)  # a block of ids per run

    def run(batch):
        eng = lowbit_engine(model, batch, overlap=overlap)
        try:
            prompts = prompt_batch(batch, shape.vocab).tolist()
            runs = []
            for _ in range(args.repeats):
                # per_step: the full-batch steady state beside the decode phase (torch.compile's static batch is
                # full-batch throughout)
                runs.append(harness.lowbit_run(eng, prompts, NEW, next(request_ids), per_step=True))
                part.sample_memory()
            return runs
        finally:
            del eng  # before the next batch's pool is allocated, also when this one failed

    def record_allocator():
        part.d["memory"]["allocator"] = dict(_core.allocator_stats(device)) if device == "cuda" else {}

    peak = run_batches(part, "lowbit", spec, args.fixed, candidates, run, gc.collect, record_allocator)
    if peak and cuda() and args.profile_prefill:
        try:
            part.d["prefill_step_breakdown"] = lowbit_profile_prefill(model, peak, shape)
        except Exception as e:  # noqa: BLE001
            part.d["prefill_step_breakdown"] = {"error": repr(e)[:300]}
        part.save()
    if peak and cuda() and not args.no_profile:
        try:
            part.d["step_breakdown"] = {"batch": peak, **lowbit_profile(model, peak, shape)}
        except Exception as e:  # noqa: BLE001
            part.d["step_breakdown"] = {"error": repr(e)[:300]}
    part.save()


# ---------------------------------------------------------------------------------------------- torch.compile
def torch_case(model, batch, ids, repeats):
    model.set_batch(batch, PROMPT + NEW)
    model.prefill(ids, rows=args_rows(batch))
    if cuda():
        model.capture()
    runs = []
    for _ in range(repeats + 1):  # the first is the warm-up
        sync()
        t0 = time.perf_counter()
        model.prefill(ids, rows=args_rows(batch))
        sync()
        t1 = time.perf_counter()
        model.decode(NEW - 1)
        sync()
        t2 = time.perf_counter()
        runs.append({"prefill_s": t1 - t0, "decode_s": t2 - t1, "total_s": t2 - t0, "tokens": batch * NEW,
                     "decode_tokens": batch * (NEW - 1), "decode_steps": NEW - 1,
                     "first_tokens": model.history[0, PROMPT:PROMPT + harness.FIRST_TOKENS].tolist()})
    return runs[1:]


def args_rows(batch):
    """Prefill sequences per eager forward: bounds the activations (B x 1024 x 28672 f16 for gate/up) to ~2 GB."""
    return max(1, min(batch, 32768 // PROMPT))


def torch_fits(model, batch):
    try:
        model.set_batch(batch, PROMPT + NEW)
        need = 8 << 30  # prefill activations + compile workspace + graph pool
        ok = free_bytes() > need if cuda() else True
        return ok, "" if ok else f"{free_bytes() / 1e9:.1f} GB free after the static cache, {need / 1e9:.0f} wanted"
    except torch.OutOfMemoryError as e:
        return False, repr(e)[:200]
    finally:
        model.k_cache = model.v_cache = model.graph = None
        if cuda():
            torch.cuda.empty_cache()


def part_torch(args, shape, out):
    part = Part(out, "torch_compile", "f16")
    model, dev = harness.torch_static_model(args, shape, part)
    part.d["method"] = ("one decoder layer torch.compile'd (inductor, fullgraph, static shapes), the whole decode "
                        "step captured in one CUDA graph; prefill eager with flash SDPA, "
                        f"{args_rows(256)} sequences per forward; argmax on the GPU")
    part.sample_memory()
    part.save()
    candidates = ladder_fits(part, args.ladder, lambda b: torch_fits(model, b))

    def run(batch):
        runs = torch_case(model, batch, prompt_batch(batch, shape.vocab).to(dev), args.repeats)
        part.sample_memory()
        return runs

    def free_cache():
        model.k_cache = model.v_cache = model.graph = None
        if cuda():
            torch.cuda.empty_cache()

    def record_reserved():
        if cuda():
            part.d["memory"]["torch_max_reserved_bytes"] = torch.cuda.max_memory_reserved()

    peak = run_batches(part, "torch_compile", "f16", args.fixed, candidates, run, free_cache, record_reserved)
    if peak and cuda() and not args.no_profile and model.k_cache is not None:
        model.prefill(prompt_batch(peak, shape.vocab).to(dev), rows=args_rows(peak))
        sync()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                model._step()
            sync()
        part.d["step_breakdown"] = {"batch": peak, "note": "eager step (the graph replays the same kernels)",
                                    **breakdown(prof, 4)}
    part.save()


# ---------------------------------------------------------------------------------------------- driver
def table(payload):
    lines = ["engine / recipe        | B    | decode tok/s | e2e tok/s | prefill tok/s | ms/step | peak GB | step: "
             "GEMM / attn / other ms"]
    for p in payload["parts"]:
        name = f"{p.get('engine')} {p.get('recipe', '')}"
        if p.get("error") and not p.get("cases"):
            lines.append(f"{name:<22} | FAILED: {p['error'][:150]}")
        peak_gb = (p.get("memory", {}).get("device_used_peak_bytes") or 0) / 1e9
        sb = p.get("step_breakdown") or {}
        for c in p.get("cases", []):
            if "error" in c:
                lines.append(f"{name:<22} | {c['batch']:<4} | FAILED: {c['error'][:110]}")
                continue
            step = (f"{sb['gemm_ms']:.1f} / {sb['attention_ms']:.1f} / {sb['other_ms']:.1f}"
                    if c.get("peak_search") and "gemm_ms" in sb else "")
            mark = "*" if c.get("peak_search") else " "
            lines.append(f"{name:<22} | {c['batch']:<4}{mark}| {c['decode_tok_s']:>12.0f} | {c['e2e_tok_s']:>9.0f} | "
                         f"{c['prefill_tok_s']:>13.0f} | {c['decode_ms_per_step']:>7.2f} | {peak_gb:>7.1f} | {step}")
        pb = p.get("prefill_step_breakdown") or {}
        if "wall_ms" in pb:
            lines.append(f"{'':<22} | prefill-phase step at {pb['batch']} ({pb['decoding_rows']} decoding): wall "
                         f"{pb['wall_ms']:.1f} ms, GEMM {pb['gemm_ms']:.1f} / attn {pb['attention_ms']:.1f} / other "
                         f"{pb['other_ms']:.1f} / copy {pb['copy_ms']:.1f} ms")
    lines.append("* the peak batch (largest that fits)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--parts", default="torch,lowbit")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--fixed", default="16,128")
    ap.add_argument("--ladder", default="64,128,256,384,512,768,1024")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="a tiny model and short requests (CPU test of the harness)")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-prefill", action="store_true")
    ap.add_argument("--fmpq-int8-fraction", type=float, default=fmpq_random.INT8_FRACTION,
                    help="int8 blocks per linear input of w4a4 recipes (0..1)")
    ap.add_argument("--part-timeout", type=float, default=560)
    ap.add_argument("--deadline", type=float, default=0)
    ap.add_argument("--merge", nargs="*", default=[])
    ap.add_argument("--worker", default="")
    ap.add_argument("--worker-out", default="")
    args = ap.parse_args()
    if not 0.0 <= args.fmpq_int8_fraction <= 1.0:
        ap.error(f"--fmpq-int8-fraction must be in [0, 1], got {args.fmpq_int8_fraction}")
    global PROMPT, NEW
    if args.tiny:
        PROMPT, NEW = 24, 8
    use_protocol(PROMPT, NEW)
    args.fixed = [int(b) for b in args.fixed.split(",") if b]
    args.ladder = [int(b) for b in args.ladder.split(",") if b]
    args.quick = False
    if args.worker:
        shape = harness.shape_of(args)
        try:
            if args.worker == "torch":
                part_torch(args, shape, args.worker_out)
            else:
                part_lowbit(args, shape, args.worker_out, args.worker.split(":", 1)[1])
        except Exception as e:  # noqa: BLE001 - the parent records it
            traceback.print_exc()
            d = json.load(open(args.worker_out)) if os.path.exists(args.worker_out) else {}
            d["error"] = f"{type(e).__name__}: {e}"
            json.dump(d, open(args.worker_out, "w"), indent=1)
            sys.exit(1)
        return
    args.deadline_at = time.time() + (args.deadline or 1e9)
    args.passthrough = ["--tiny"] * args.tiny + ["--no-compile"] * args.no_compile + ["--no-profile"] * args.no_profile
    args.passthrough += ["--profile-prefill"] * args.profile_prefill
    args.passthrough += ["--layers", str(args.layers), "--fixed", ",".join(map(str, args.fixed)),
                         "--ladder", ",".join(map(str, args.ladder)), "--repeats", str(args.repeats),
                         "--fmpq-int8-fraction", str(args.fmpq_int8_fraction)]
    merged = []
    for path in args.merge:
        merged += json.load(open(path))["parts"]
    meta = {}
    if cuda():
        from bench_gpu_common import device_meta
        meta = device_meta()
        meta["commit"] = os.environ.get("LOWBIT_COMMIT") or meta["commit"]
    elif args.merge:
        meta = json.load(open(args.merge[0]))["meta"]
    meta.update({"protocol": f"random prompts of {PROMPT} tokens, {NEW} new tokens each (greedy, no EOS), the "
                             "largest batch that fits; decode tok/s = tokens after every first token / that time",
                 "model": harness.dataclasses.asdict(harness.shape_of(args)), "prompt_tokens": PROMPT,
                 "new_tokens": NEW, "fixed_batches": args.fixed, "ladder": args.ladder, "repeats": args.repeats,
                 "fmpq_int8_fraction": args.fmpq_int8_fraction,
                 "timing": "wall time around synchronised loops per request batch (prefill phase, decode phase)"})
    todo = []
    for p in (p for p in args.parts.split(",") if p):
        todo += [f"lowbit:{r}" for r in args.recipes.split(",") if r] if p == "lowbit" else [p]
    out = args.out or "/tmp/bench_peak.json"
    fresh = []
    for part in todo:
        if args.deadline_at - time.time() < 60:
            fresh.append({"engine": part, "part": part, "error": "skipped: past the run's --deadline"})
            continue
        d = harness.run_child(args, part, harness.part_file(out, part), script=__file__)
        d["commit"] = meta.get("commit", "")
        fresh.append(d)
        keys = {(p.get("engine"), p.get("recipe")) for p in fresh}
        payload = {"meta": meta, "parts": [p for p in merged if (p.get("engine"), p.get("recipe")) not in keys] + fresh}
        json.dump(payload, open(out, "w"), indent=1)
    keys = {(p.get("engine"), p.get("recipe")) for p in fresh}
    payload = {"meta": meta, "parts": [p for p in merged if (p.get("engine"), p.get("recipe")) not in keys] + fresh}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    json.dump(payload, open(out, "w"), indent=1)
    print(table(payload), flush=True)


if __name__ == "__main__":
    main()
