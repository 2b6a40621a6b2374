"""A decode step of the Llama-3-8B shape (batch 1, or --batch N sequences) (random weights) as CUDA graphs replay it: per-kernel device time,
the idle time before each kernel (inside the step's graph, and between steps on the host), and the tok/s of
tools/bench_gpu_llama8b.py's batch-1 case (512-token prompt, 128 new tokens, median of repeats) on the same model.

Where tools/profile_gpu_step.py profiles eager steps (each kernel its own launch), this one profiles graph replays:
the kernels and the gaps are the ones a served step has. Each spec builds one model ("recipe+key=value": kernel
overrides, e.g. w4a8kv8+fused_silu_quant=off for an A/B in one process).
  python3 tools/profile_gpu_step_graphs.py out.json --specs w4a8kv8,w4a16kv8 [--contexts 512,2048] [--steps 32]
--row-cluster-modes 0,-1 runs each model's engines once per mode of the sm_90 row clusters (0: one block per row,
-1: clusters for few rows; the mode is read when the engine captures its graphs), an A/B on one loaded model;
with --ab-rounds N only the batch-1 tok/s, the modes taking turns N rounds (medians per mode).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_llama8b import NEW, PROMPT, lowbit_model, lowbit_run, prompt_batch  # noqa: E402
from llama_random import LLAMA3_8B  # noqa: E402


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("void ", "").replace("lowbit::cuda::", "")
    return name.split("(")[0][:110]


def activities(prof):
    """The profile's GPU kernels and memcpys as (start_us, end_us, name), sorted by start (the chrome trace's
    device timestamps: graph-replayed kernels appear there one by one)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            out.append((float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0)), short(ev["name"]),
                        ev.get("cat")))
    out.sort()
    return out


def analyse(acts, steps):
    """Per-kernel totals, and the idle time before each activity split into in-step (inside the graph) and
    between steps (after the step's device-to-host copy of its tokens: the host's turn)."""
    per, idle_in, idle_host, end, prev_cat, prev_name = {}, 0.0, 0.0, None, None, ""
    seq, cur = [], []
    for s, e, name, cat in acts:
        gap = 0.0 if end is None else max(0.0, s - end)
        after_copy = prev_cat == "gpu_memcpy" and "DtoH" in prev_name
        if end is not None:
            if after_copy:
                idle_host += gap
            else:
                idle_in += gap
        if after_copy and cur:
            seq.append(cur)
            cur = []
        cur.append((name, round(e - s, 2), round(gap, 2)))
        t = per.setdefault(name, [0.0, 0, 0.0])
        t[0] += e - s
        t[1] += 1
        if not after_copy:
            t[2] += gap
        end = e if end is None else max(end, e)
        prev_cat, prev_name = cat, name
    if cur:
        seq.append(cur)
    span = acts[-1][1] - acts[0][0] if acts else 0.0
    busy = sum(v[0] for v in per.values())
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    # one whole step (the second full one: the first may start mid-step), kernel by kernel
    one = seq[2] if len(seq) > 3 else (seq[1] if len(seq) > 1 else (seq[0] if seq else []))
    return {
        "span_us_per_step": span / steps, "busy_us_per_step": busy / steps,
        "idle_in_step_us_per_step": idle_in / steps, "idle_between_steps_us_per_step": idle_host / steps,
        "kernels": [{"kernel": k, "us_per_step": round(v[0] / steps, 2), "launches_per_step": v[1] / steps,
                     "idle_before_us_per_step": round(v[2] / steps, 2)} for k, v in rows],
        "one_step": [{"kernel": n, "us": d, "idle_before_us": g} for n, d, g in one],
    }


def context_profile(model, vocab, ctx, steps, batch=1):
    from lowbit import _core
    kv = model.info()["kv_bytes_per_token"] * (ctx + 3 * steps + 64) * batch
    eng = _core.Engine(model, max_batch_tokens=max(4096, ctx), max_seqs=64, kv_cache_bytes=kv, prefix_caching=False)
    g = torch.Generator().manual_seed(11)
    for r in range(batch):  # distinct prompts of one length: every row decodes at the same steps
        eng.add_request(r, torch.randint(0, vocab, (ctx,), generator=g).tolist(), temperature=0.0,
                        max_tokens=3 * steps + 8)
    for _ in range(-(-batch * ctx // max(4096, ctx))):
        eng.step()  # the prefill chunks
    for _ in range(4):
        eng.step()  # graphs captured
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    step_ms = 1e3 * (time.perf_counter() - t0) / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    while eng.has_unfinished():
        eng.step()
    res = {"context": ctx, "batch": batch, "step_ms_graphs": step_ms}
    res.update(analyse(activities(prof), steps))
    del eng
    return res


def tok_s(model, vocab, repeats):
    """tools/bench_gpu_llama8b.py's batch-1 case on this model (same engine settings, prompts and counts)."""
    from lowbit import _core
    kv = model.info()["kv_bytes_per_token"] * (PROMPT + NEW + 64)
    eng = _core.Engine(model, max_batch_tokens=4096, max_seqs=64, kv_cache_bytes=kv, prefix_caching=False)
    prompts = prompt_batch(1, vocab).tolist()
    lowbit_run(eng, prompts, 4, 0)
    runs = [lowbit_run(eng, prompts, NEW, 1 + r) for r in range(repeats)]
    del eng
    dec = statistics.median(r["decode_tokens"] / r["decode_s"] for r in runs)
    return {"decode_tok_s": round(dec, 1), "decode_ms_per_step": round(1e3 / dec, 3),
            "prefill_tok_s": round(statistics.median(PROMPT / r["prefill_s"] for r in runs), 1),
            "first_tokens": runs[0]["first_tokens"], "runs": runs}


def alternate_modes(model, vocab, spec, args):
    """Batch-1 tok/s of each row-cluster mode, the modes taking turns round after round on one loaded model, so
    that drift over the process (clocks, the allocator, the order the engines were built in) falls on every mode."""
    from lowbit import _core
    modes = [int(m) for m in args.row_cluster_modes.split(",")]
    per = {m: [] for m in modes}
    for r in range(args.ab_rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            _core._row_cluster_mode(m)
            per[m].append(tok_s(model, vocab, 1)["decode_tok_s"])
    _core._row_cluster_mode(-1)
    out = {"spec": spec, "ab_rounds": args.ab_rounds,
           "decode_tok_s": {str(m): v for m, v in per.items()},
           "median_tok_s": {str(m): statistics.median(v) for m, v in per.items()}}
    print(f"{spec}: batch-1 decode tok/s per row-cluster mode, {args.ab_rounds} alternating rounds: "
          + "; ".join(f"mode {m}: median {statistics.median(v):.1f} (min {min(v):.1f}, max {max(v):.1f})"
                      for m, v in per.items()), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--specs", default="w4a8kv8,w4a16kv8")
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoding together in the profiled steps")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--row-cluster-modes", default="", help="e.g. 0,-1: one run per mode on each model")
    ap.add_argument("--ab-rounds", type=int, default=0,
                    help="with --row-cluster-modes: only the batch-1 tok/s, the modes alternated this many rounds on "
                         "each loaded model (medians per mode; no profiles)")
    args = ap.parse_args()
    shape = LLAMA3_8B
    result = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("LOWBIT_COMMIT", ""),
              "date": time.strftime("%Y-%m-%d"), "batch": args.batch, "steps": args.steps, "runs": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    for spec in args.specs.split(","):
        base, *ov = spec.split("+")
        t = time.perf_counter()
        model = lowbit_model(shape, base, "cuda", "f16", dict(o.split("=", 1) for o in ov))
        load_s = round(time.perf_counter() - t, 1)
        if args.ab_rounds:
            result["runs"].append(alternate_modes(model, shape.vocab, spec, args))
            save()
            continue
        for mode in ([int(m) for m in args.row_cluster_modes.split(",")] if args.row_cluster_modes else [None]):
            from lowbit import _core
            if mode is not None:
                _core._row_cluster_mode(mode)
            tag = spec if mode is None else f"{spec} row_clusters={mode}"
            run = {"spec": tag, "load_s": load_s, "kernels_plan": model.info()["kernels"]}
            run["bench_b1"] = tok_s(model, shape.vocab, args.repeats)
            print(f"{tag}: loaded in {run['load_s']} s; batch 1 decode {run['bench_b1']['decode_tok_s']} tok/s "
                  f"({run['bench_b1']['decode_ms_per_step']} ms/step)", flush=True)
            run["contexts"] = []
            for ctx in (int(c) for c in args.contexts.split(",")):
                p = context_profile(model, shape.vocab, ctx, args.steps, args.batch)
                run["contexts"].append(p)
                print(f"  ctx {ctx}: step {p['step_ms_graphs']:.3f} ms wall; profiled span {p['span_us_per_step']:.1f} "
                      f"us = busy {p['busy_us_per_step']:.1f} + idle in step {p['idle_in_step_us_per_step']:.1f} "
                      f"+ between steps {p['idle_between_steps_us_per_step']:.1f}", flush=True)
                for r in p["kernels"][:16]:
                    print(f"    {r['kernel'][:80]:80s} {r['us_per_step']:8.1f} us {r['launches_per_step']:6.1f} x "
                          f"idle before {r['idle_before_us_per_step']:6.1f}", flush=True)
            result["runs"].append(run)
            save()
        del model
        torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
