"""Where one decode step of the Llama-3-8B-shaped model (random weights, llama_random.py) spends its GPU time.

Builds the model in one recipe, prefills one (or B) 512-token prompts, then runs decode steps eagerly (no CUDA
graphs, so every kernel is a separate record) under torch.profiler and sums each kernel's device time per step.
The eager kernel times are the ones a graph replays; the difference between their sum and the graph's step time
is launch/gap overhead. The same steps are also timed with graphs on for comparison, and one prefill of the
prompts is profiled the same way.
  python3 tools/profile_gpu_step.py out.json [--recipe w4a16kv8] [--batch 1] [--layers 32] [--steps 16]
      [--overrides fused_norm_quant=off,...]
"""
import argparse
import dataclasses
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_common import kernel_times  # noqa: E402
from bench_gpu_llama8b import lowbit_model, prompt_batch  # noqa: E402
from llama_random import LLAMA3_8B  # noqa: E402


def start(eng, prompts, steps, rid0):
    """Adds the requests and runs their prefill (one chunk: max_batch_tokens covers the prompts)."""
    for i, p in enumerate(prompts):
        eng.add_request(rid0 + i, p, temperature=0.0, max_tokens=steps + 2)
    eng.step()
    torch.cuda.synchronize()


def timed_steps(eng, steps):
    """Wall time of `steps` decode-only steps."""
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def finish(eng):
    while eng.has_unfinished():
        eng.step()


def main():
    from lowbit import _core
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--recipe", default="w4a16kv8")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=0, help="0: the 8B shape's 32")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--overrides", default="", help="kernel overrides key=value,... (e.g. fused_norm_quant=off)")
    args = ap.parse_args()
    shape = dataclasses.replace(LLAMA3_8B, layers=args.layers) if args.layers else LLAMA3_8B
    overrides = dict(kv.split("=", 1) for kv in args.overrides.split(",") if kv)
    model = lowbit_model(shape, args.recipe, "cuda", "f16", overrides or None)
    kv = model.info()["kv_bytes_per_token"] * args.batch * (512 + args.steps + 64)
    prompts = prompt_batch(args.batch, shape.vocab).tolist()
    result = {"recipe": args.recipe, "overrides": overrides, "batch": args.batch, "layers": shape.layers, "steps": args.steps,
              "device": torch.cuda.get_device_name(), "commit": os.environ.get("LOWBIT_COMMIT", "")}
    for graphs in (True, False):
        eng = _core.Engine(model, max_batch_tokens=max(512 * args.batch, 512), max_seqs=max(args.batch, 1),
                           kv_cache_bytes=kv, cuda_graphs=graphs, prefix_caching=False)  # warm-up reuses the prompts
        start(eng, prompts, 4, 0)  # warm-up: kernels loaded, graphs captured
        timed_steps(eng, 4)
        finish(eng)
        start(eng, prompts, args.steps, 1000)
        dt = timed_steps(eng, args.steps)
        finish(eng)
        result[f"step_ms_{'graphs' if graphs else 'eager'}"] = 1e3 * dt / args.steps
        if graphs:
            del eng
            continue
        start(eng, prompts, args.steps, 2000)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            timed_steps(eng, args.steps)
        finish(eng)
        rows = sorted(kernel_times(prof).items(), key=lambda kv_: -kv_[1][0])
        total = sum(v[0] for _, v in rows)
        result["kernels"] = [{"kernel": k[:120], "us_per_step": round(v[0] / args.steps, 2),
                              "launches_per_step": v[1] / args.steps} for k, v in rows]
        result["kernel_ms_per_step"] = total / args.steps / 1e3
        # The prefill of the same prompts (one step over B x 512 tokens), kernel by kernel.
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            start(eng, prompts, 2, 3000)
        finish(eng)
        rows = sorted(kernel_times(prof).items(), key=lambda kv_: -kv_[1][0])
        result["prefill_kernels"] = [{"kernel": k[:120], "us": round(v[0], 1), "launches": v[1]} for k, v in rows]
        result["prefill_kernel_ms"] = sum(v[0] for _, v in rows) / 1e3
        del eng
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.recipe} B={args.batch}: step {result['step_ms_graphs']:.3f} ms with graphs, "
          f"{result['step_ms_eager']:.3f} ms eager, kernels alone {result['kernel_ms_per_step']:.3f} ms")
    print(f"{'kernel':90s} {'us/step':>9s} {'launches':>8s} {'share':>6s}")
    for r in result["kernels"][:25]:
        print(f"{r['kernel'][:90]:90s} {r['us_per_step']:9.1f} {r['launches_per_step']:8.1f} "
              f"{r['us_per_step'] / 1e3 / result['kernel_ms_per_step']:6.1%}")
    print(f"prefill of {args.batch} x 512 tokens: kernels {result['prefill_kernel_ms']:.2f} ms")
    for r in result["prefill_kernels"][:12]:
        print(f"{r['kernel'][:90]:90s} {r['us']:9.1f} {r['launches']:8d} "
              f"{r['us'] / 1e3 / result['prefill_kernel_ms']:6.1%}")


if __name__ == "__main__":
    main()
