"""Long context end to end (issue 16): a Llama-3-8B-shaped model with random weights (llama_random.py), W4A16
weights, one KV format per recipe (default kv16 / kv8 / kv4 / kv2 / kc2v2), prompts of --context tokens (32K).
A recipe may carry kernel options: "w4a16kv4+prefill_dequant_copy=off" (an A/B in one run).
Per recipe, in its own child process (clean memory; a crash or a timeout costs that recipe only):
  capacity        the largest batch whose KV cache fits at context + new tokens: the engine's pool takes the device
                  memory free after loading, less a --reserve-gib workspace, and capacity = its blocks over the
                  blocks one sequence needs (the allocator's own count; that batch is not run)
  per batch (--batches, default 1 and 8): B distinct random prompts, --new tokens each (greedy, no stop ids):
  prefill tok/s   B*context / (time until every request has its first token)
  decode tok/s    tokens made after that / the time after that; ms/step likewise
The engine's CUDA graphs for the batch are captured by a warm-up of B short prompts first, so decode times are
replays. One run per batch (a 32K prefill of 8 prompts takes seconds); the JSON keeps the device, date, commit.
    python3 tools/bench_gpu_long_context.py out.json [--context 32768] [--new 64] [--batches 1,8]
           [--recipes w4a16,w4a16kv8,...] [--layers N] [--tiny]   (--tiny: a 2-layer model, a CPU smoke test)
"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
from bench_gpu_llama8b import lowbit_model, lowbit_run  # noqa: E402
from llama_random import LLAMA3_8B, LlamaShape  # noqa: E402

RECIPES = ("w4a16", "w4a16kv4", "w4a16kc2v2", "w4a16kv8", "w4a16kv2")


def shape_of(args):
    s = LLAMA3_8B
    if args.tiny:
        s = LlamaShape(vocab=512, hidden=256, inter=512, layers=2, heads=8, kv_heads=2, head_dim=32)
    if args.layers:
        s = dataclasses.replace(s, layers=args.layers)
    return dataclasses.replace(s, max_positions=args.context + args.new + 64)


def worker(args, recipe):
    from lowbit import _core
    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", "f16") if on_gpu else ("cpu", "f32")
    shape = shape_of(args)
    out = {"recipe": recipe, "context": args.context, "new_tokens": args.new, "cases": [], "error": None}
    t = time.perf_counter()
    base, *overrides = recipe.split("+")  # "recipe+key=value": kernel options for an A/B in one run
    model = lowbit_model(shape, base, device, dtype, dict(o.split("=", 1) for o in overrides))
    out["load_s"] = round(time.perf_counter() - t, 1)
    info = model.info()
    per_token = info["kv_bytes_per_token"]
    out.update(kv_bytes_per_token=per_token, kv_format=info.get("kv_format"))
    batches = [int(b) for b in args.batches.split(",")]
    need = max(batches) * (args.context + args.new + 64) * per_token
    pool = need
    if on_gpu:  # the pool takes what is free after loading, less the workspace: its block count is the capacity
        free = torch.cuda.mem_get_info()[0]
        out["free_after_load_bytes"] = free
        pool = max(need, int(free - args.reserve_gib * (1 << 30)))
    eng = _core.Engine(model, max_batch_tokens=args.max_batch_tokens, max_seqs=max(batches), kv_cache_bytes=pool,
                       prefix_caching=False)
    st = eng.stats()
    per_seq_blocks = -(-(args.context + args.new) // st["block_size"])
    out.update(kv_pool_bytes=pool, block_size=st["block_size"], num_blocks=st["num_blocks"],
               capacity_batch=st["num_blocks"] // per_seq_blocks)
    g = torch.Generator().manual_seed(11)
    rid = 0
    for b in batches:
        warm = torch.randint(0, shape.vocab, (b, min(256, args.context)), generator=g).tolist()
        lowbit_run(eng, warm, 8, rid)  # kernels, allocator caches and this batch's decode graphs
        rid += b
        prompts = torch.randint(0, shape.vocab, (b, args.context), generator=g).tolist()
        r = lowbit_run(eng, prompts, args.new, rid)
        rid += b
        case = {"batch": b, "prefill_s": round(r["prefill_s"], 3),
                "prefill_tok_s": round(b * args.context / r["prefill_s"], 1),
                "decode_s": round(r["decode_s"], 4), "decode_steps": r["decode_steps"],
                "decode_tok_s": round(r["decode_tokens"] / r["decode_s"], 1),
                "decode_ms_per_step": round(1000 * r["decode_s"] / r["decode_steps"], 3)}
        out["cases"].append(case)
        print(json.dumps({"recipe": recipe, **case}), flush=True)
    if on_gpu:
        out["allocator"] = dict(_core.allocator_stats("cuda"))
    return out


def run_child(args, recipe):
    """One recipe in a child process; returns its JSON, with an error string if it failed or ran out of time."""
    tmp = f"{args.out}.{recipe}.part"
    cmd = [sys.executable, os.path.abspath(__file__), args.out, "--worker", recipe] + args.passthrough
    print(f"== {recipe}", flush=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, timeout=args.recipe_timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, check=False)
        print(p.stdout[-4000:], flush=True)
        err = None if p.returncode == 0 else f"exit code {p.returncode}: {p.stdout.strip().splitlines()[-1:]}"
    except subprocess.TimeoutExpired:
        err = f"timed out after {args.recipe_timeout} s"
    d = {"recipe": recipe, "cases": []}
    if os.path.exists(tmp):
        with open(tmp) as f:
            d = json.load(f)
        os.remove(tmp)
    d["error"] = d.get("error") or err
    d["wall_s"] = round(time.perf_counter() - t0, 1)
    return d


def table(results):
    lines = ["| recipe | KV bytes / token | capacity at context | batch | prefill tok/s | decode tok/s | ms/step |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for d in results:
        for c in d.get("cases") or [{}]:
            lines.append(f"| {d['recipe']} | {d.get('kv_bytes_per_token', '')} | {d.get('capacity_batch', '')} | "
                         f"{c.get('batch', d.get('error'))} | {c.get('prefill_tok_s', '')} | "
                         f"{c.get('decode_tok_s', '')} | {c.get('decode_ms_per_step', '')} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--max-batch-tokens", type=int, default=8192)
    ap.add_argument("--reserve-gib", type=float, default=4.0, help="workspace kept out of the capacity figure")
    ap.add_argument("--recipe-timeout", type=float, default=300)
    ap.add_argument("--worker", default="")
    args = ap.parse_args()
    args.passthrough = [a for a in sys.argv[2:] if not a.startswith("--worker")]
    if args.worker:
        d = worker(args, args.worker)
        with open(f"{args.out}.{args.worker}.part", "w") as f:
            json.dump(d, f, indent=1)
        return
    meta = {"tool": "bench_gpu_long_context.py", "context": args.context, "new_tokens": args.new,
            "model": dataclasses.asdict(shape_of(args)), "weights": "random (llama_random.py), W4A16 g128"}
    if torch.cuda.is_available():
        from bench_gpu_common import device_meta
        meta.update(device_meta())
        meta["timing"] = "wall clock around the engine's step loop, one run per batch after a warm-up"
    results = []
    for recipe in args.recipes.split(","):
        results.append(run_child(args, recipe))
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    print(table(results))


if __name__ == "__main__":
    main()
