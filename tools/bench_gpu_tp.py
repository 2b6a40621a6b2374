"""Tensor parallelism on GPUs (issue 20's targets): the Llama-3-70B layer shape with random weights, TP=1 beside TP=2
(or --tp ...), per recipe:
  batch 1     decode tokens/s of one request (128-token prompt, 256 new), its ms per token, and the weight-bytes
              floor: the bytes one rank streams per token (its packed weights but the embedding) / the GPU's peak
              memory bandwidth; "floor share" = floor / measured (1.0 = at the floor);
  peak        the papers' protocol (1024 in / 512 out, greedy, EOS ignored) at the largest batch whose KV cache the
              *whole 80-layer model* would leave room for on each GPU (gpu_memory_fraction 0.9, the full model's
              weights per rank and a 2 GiB reserve subtracted, the rest scaled to the layers loaded here): decode-phase
              tok/s and the full-batch steady state (the median step in which every sequence decodes, with the
              replayed graph's device ms and the host walls of Engine.stats());
  allreduce   the all-reduce share (NCCL or one-shot kernels) of an eager decode step at batch 1 and at the peak
              batch (torch.profiler, rank 0's GPU; the fused kernel counts whole, its norm included); TP>1 runs once
              per --allreduce path: "fused" (the default group: the all-reduce after o / down pushed to the peers
              and fused with the residual add and RMSNorm after it, other small all-reduces one-shot over peer
              memory), "oneshot" (LOWBIT_TP_FUSED_NORM=0: one-shot all-reduce, then add_rms_norm) and "nccl"
              (oneshot_max_bytes=0), for A/B timing;
  identity    whether TP=N's greedy tokens of request 0 equal TP=1's.
Only --layers of the 80 layers are loaded (a 70B model per case would take minutes to draw and pack): per-token costs
scale with the layers, the vocabulary projection is whole. Each case runs in its own child process.
  python3 tools/bench_gpu_tp.py out.json [--recipes w4a16kv8,w4a8kv4] [--tp 1,2] [--layers 10]
                                         [--allreduce fused,oneshot,nccl] [--no-batch1 | --no-peak] [--no-profile]
tools/tp_layer_fit.py fits runs at two --layers to the 80-layer model.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
from bench_gpu_common import kernel_times  # noqa: E402
from bench_gpu_llama8b import core_config, core_weight, full_batch, graph_split, lowbit_run  # noqa: E402
from llama_random import LlamaShape, weight, weight_names  # noqa: E402

LLAMA3_70B = LlamaShape(vocab=128256, hidden=8192, inter=28672, layers=80, heads=64, kv_heads=8, head_dim=128)
FULL_LAYERS = 80
PEAK_BW = {"H100": 3.35e12, "H200": 4.8e12}  # bytes/s of HBM (SXM parts)
LADDER = (16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024)


def build(shape, recipe, tp, allreduce="fused"):
    """The group's models, rank r on cuda:r; every weight drawn and quantized once on cuda:0, each rank keeps its
    shard. allreduce "nccl": NCCL only; "fused": the default group (the all-reduce pushed to the peers, fused with the
    residual add and RMSNorm: cuda/allreduce_norm_push.h); "oneshot": LOWBIT_TP_FUSED_NORM=0 (the one-shot kernel for
    small messages, then add_rms_norm)."""
    from lowbit import _core
    c = core_config(shape)
    bound = 0 if allreduce == "nccl" else -1
    os.environ["LOWBIT_TP_FUSED_NORM"] = "1" if allreduce == "fused" else "0"  # read when the group is made
    comms = _core.make_nccl_communicators(list(range(tp)), oneshot_max_bytes=bound) if tp > 1 else [None]
    models = []
    for r, comm in enumerate(comms):
        m = _core.Model(c, recipe, f"cuda:{r}", "f16")
        if comm is not None:
            m.set_tensor_parallel(comm)
        models.append(m)
    for name, shp, linear in weight_names(shape):
        w = weight(name, shp, "cuda:0")
        value = core_weight(name, w, recipe, "f16") if linear else w.cpu()
        del w
        for m in models:
            (m.set_quantized_weight if linear else m.set_weight)(name, value)
    torch.cuda.empty_cache()
    for m in models:
        m.finalize()
    return models


def weight_bytes_per_token(model):
    pb = model.info()["parameter_bytes"]
    return sum(v for k, v in pb.items() if k != "embedding")


def peak_bandwidth():
    name = torch.cuda.get_device_name(0)
    return next((bw for key, bw in PEAK_BW.items() if key in name), PEAK_BW["H100"]), name


def emulated_kv_bytes(models, layers):
    """Per rank: what the whole 80-layer model would leave for KV at gpu_memory_fraction 0.9, scaled to `layers`."""
    total = min(torch.cuda.get_device_properties(r).total_memory for r in range(len(models)))
    worst = max(range(len(models)), key=lambda r: weight_bytes_per_token(models[r]))
    pb = models[worst].info()["parameter_bytes"]
    per_layer = (pb["attention"] + pb["mlp"] + pb["norms"]) / layers
    full = per_layer * FULL_LAYERS + pb["embedding"] + pb["lm_head"]
    budget = 0.9 * total - full - (2 << 30)
    return int(budget * layers / FULL_LAYERS), int(full)


def decode_profile(models, batch, shape, steps=3):
    """Eager decode steps at `batch`; device ms per step and rank (all ranks' kernels / ranks), the NCCL share."""
    from lowbit import _core
    eng = _core.Engine(models if len(models) > 1 else models[0], max_batch_tokens=8192, max_seqs=batch,
                       kv_cache_bytes=models[0].info()["kv_bytes_per_token"] * batch * 288, cuda_graphs=False,
                       prefix_caching=False)
    g = torch.Generator().manual_seed(3)
    for i in range(batch):  # long enough that the first requests still decode when the last prefill chunk is done
        eng.add_request(i, torch.randint(0, shape.vocab, (128,), generator=g).tolist(), temperature=0.0,
                        max_tokens=128)
    for _ in range(200):  # until a step decodes every request (prefill chunks done)
        if sum(ev.token >= 0 for ev in eng.step()) == batch:
            break
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    classes = {"allreduce": 0.0, "other": 0.0}
    # kernels only: an eager step's logits download is a copy that graph steps (which sample on the GPU) never make
    times = {k: v for k, v in kernel_times(prof).items() if not k.lower().startswith(("memcpy", "memset"))}
    for name, (us, _) in times.items():
        collective = "nccl" in name.lower() or "oneshot_kernel" in name or "oneshot_norm_kernel" in name
        classes["allreduce" if collective else "other"] += us
    total = sum(classes.values())
    top = sorted(times.items(), key=lambda kv: -kv[1][0])[:8]
    return {"step_kernel_ms": round(total / steps / 1e3 / len(models), 3),
            "allreduce_share": round(classes["allreduce"] / total, 4) if total else None,
            "top_kernels_us_per_step_rank": [[k[:70], round(v[0] / steps / len(models), 1)] for k, v in top]}


def copy_bandwidth():
    """Bytes read + written per second by a 2 GiB device-to-device copy on cuda:0 (the achievable HBM rate)."""
    a = torch.empty(1 << 30, dtype=torch.float16, device="cuda:0")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    bw = 10 * 2 * a.numel() * 2 / (start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return bw


def run_case(args, recipe, tp, allreduce):
    from lowbit import _core
    shape = LlamaShape(**{**LLAMA3_70B.__dict__, "layers": args.layers})
    out = {"recipe": recipe, "tp": tp, "layers": args.layers}
    t = time.perf_counter()
    models = build(shape, recipe, tp, allreduce)
    out["allreduce"] = models[0].tp_all_reduce if tp > 1 else "-"
    out["load_s"] = round(time.perf_counter() - t, 1)
    bw, name = peak_bandwidth()
    out["device"] = name
    wbytes = max(weight_bytes_per_token(m) for m in models)
    out["weight_bytes_per_rank"] = wbytes
    if not args.no_batch1:
        run_batch1(args, out, models, shape, wbytes, bw)
    run_peak(args, out, models, shape)
    return out


def run_batch1(args, out, models, shape, wbytes, bw):
    from lowbit import _core
    group = models if len(models) > 1 else models[0]
    eng = _core.Engine(group, max_batch_tokens=2048, max_seqs=4, kv_cache_bytes=models[0].info()["kv_bytes_per_token"]
                       * 4 * 512, prefix_caching=False)
    prompt = torch.randint(0, shape.vocab, (1, 128), generator=torch.Generator().manual_seed(5)).tolist()
    lowbit_run(eng, prompt, 16, 0)  # warm-up: kernels, graphs of the small buckets
    runs = [lowbit_run(eng, prompt, 256, 100 + i) for i in range(args.repeats)]
    best = min(runs, key=lambda r: r["decode_s"])
    ms = best["decode_s"] / best["decode_steps"] * 1e3
    floor_ms = wbytes / bw * 1e3
    copy_bw = copy_bandwidth()
    out["copy_bandwidth"] = round(copy_bw)
    out["batch1"] = {"floor_ms_copy_bw": round(wbytes / copy_bw * 1e3, 3),
                     "floor_share_copy_bw": round(wbytes / copy_bw * 1e3 / ms, 3),
                     "decode_tok_s": round(best["decode_tokens"] / best["decode_s"], 1), "ms_per_token": round(ms, 3),
                     "floor_ms": round(floor_ms, 3), "floor_share": round(floor_ms / ms, 3),
                     "first_tokens": runs[0]["first_tokens"]}
    out["batch1"].update(graph_split(ms, [best]))  # rank 0's replayed graphs on its GPU; the rest is host time
    # the next-token logits of a fixed prompt: the parent compares them across TP sizes
    logits = torch.from_dlpack(eng.logits(prompt[0][:32]))[-1].float().clone()
    torch.save(logits, f"{args.out}.logits.pt")
    del eng
    out["batch1"]["profile"] = decode_profile(models, 1, shape)
    print(json.dumps({"recipe": out["recipe"], "tp": out["tp"], "allreduce": out["allreduce"], "batch1": out["batch1"]}),
          flush=True)


def run_peak(args, out, models, shape):
    from lowbit import _core
    group = models if len(models) > 1 else models[0]
    kv_bytes, full = emulated_kv_bytes(models, args.layers)
    out["full_model_weight_bytes_per_rank"] = full
    per_seq = models[0].info()["kv_bytes_per_token"] * (1024 + 512 + 16)
    ladder = [int(b) for b in args.ladder.split(",")] if args.ladder else LADDER
    fits = [b for b in ladder if b * per_seq <= kv_bytes]
    out["peak"] = {"kv_cache_bytes": kv_bytes, "batch": fits[-1] if fits else 0}
    if fits and not args.no_peak:
        B = fits[-1]
        prompts = torch.randint(0, shape.vocab, (B, 1024), generator=torch.Generator().manual_seed(7)).tolist()
        # "peak": the first --overlap mode; each mode's figures under "by_overlap" (the same models, one process)
        for i, mode in enumerate(args.overlap.split(",")):
            eng = _core.Engine(group, max_batch_tokens=8192, max_seqs=B, kv_cache_bytes=kv_bytes, prefix_caching=False,
                               overlap_steps=mode == "on")
            r = lowbit_run(eng, prompts, 512, 10_000 * (i + 1), per_step=True)
            figures = {"decode_tok_s": round(r["decode_tokens"] / r["decode_s"], 1),
                       "e2e_tok_s": round(r["tokens"] / r["total_s"], 1), "prefill_s": round(r["prefill_s"], 2),
                       "decode_s": round(r["decode_s"], 2), "full_batch": full_batch(r["steps"], B),
                       "overlapped_steps": eng.stats()["overlapped_steps"]}
            if i == 0:
                out["peak"].update(figures)
            out["peak"].setdefault("by_overlap", {})[mode] = figures
            del eng
        if not args.no_profile:
            out["peak"]["profile"] = decode_profile(models, B, shape)
        print(json.dumps({"recipe": out["recipe"], "tp": out["tp"], "peak": out["peak"]}), flush=True)


def compare_logits(results, part, base_part, tp):
    """TP=N's next-token logits against TP=1's of the same recipe: relative error, top-1 agreement, top-1 margin."""
    if tp == 1:
        return
    if not (os.path.exists(base_part + ".logits.pt") and os.path.exists(part + ".logits.pt")):
        return
    a, b = torch.load(base_part + ".logits.pt"), torch.load(part + ".logits.pt")
    top2 = torch.topk(a, 2).values
    results[-1]["logits_vs_tp1"] = {"rel_err": float((a - b).abs().max() / a.abs().max()),
                                    "top1_same": bool(a.argmax() == b.argmax()),
                                    "tp1_top1_margin": float(top2[0] - top2[1]),
                                    "max_abs_diff": float((a - b).abs().max())}


def table(results):
    lines = ["| recipe | TP | all-reduce | batch-1 tok/s | ms/token | floor ms | floor share | speed-up | all-reduce share"
             " b1 | peak batch | peak decode tok/s | speed-up | full-batch step ms (graph) | full-batch tok/s | speed-up |"
             " all-reduce share peak | greedy = TP1 (leading tokens) |",
             "|" + "---|" * 17]
    base = {r["recipe"]: r for r in results if r.get("tp") == 1 and "peak" in r and r["layers"] == results[0]["layers"]}
    ratio = lambda a, b: round(a / b, 2) if a and b else None  # noqa: E731
    for r in results:
        if "error" in r:
            lines.append(f"| {r['recipe']} | {r['tp']} | {r.get('allreduce_path', '')} | error: {r['error'][:80]} |"
                         + " |" * 13)
            continue
        b1, pk, b = r.get("batch1", {}), r["peak"], base.get(r["recipe"], {})
        bb1, bpk = b.get("batch1", {}), b.get("peak", {})
        fb, bfb = pk.get("full_batch", {}), bpk.get("full_batch", {})
        ft, bt = b1.get("first_tokens", []), bb1.get("first_tokens", [])
        lead = next((i for i, (x, y) in enumerate(zip(ft, bt)) if x != y), min(len(ft), len(bt)))
        same = f"{lead}/{len(ft)}" if ft and bt else None
        lines.append(f"| {r['recipe']} | {r['tp']} | {r.get('allreduce_path', '-')} | {b1.get('decode_tok_s')} | "
                     f"{b1.get('ms_per_token')} | {b1.get('floor_ms')} | {b1.get('floor_share')} | "
                     f"{ratio(b1.get('decode_tok_s'), bb1.get('decode_tok_s'))} | "
                     f"{b1.get('profile', {}).get('allreduce_share')} | {pk['batch']} | {pk.get('decode_tok_s')} | "
                     f"{ratio(pk.get('decode_tok_s'), bpk.get('decode_tok_s'))} | "
                     f"{fb.get('step_ms')} ({fb.get('graph_device_ms')}) | {fb.get('decode_tok_s')} | "
                     f"{ratio(fb.get('decode_tok_s'), bfb.get('decode_tok_s'))} | "
                     f"{pk.get('profile', {}).get('allreduce_share')} | {same} |"
                     + (f" host gap {b1['host_gap_ms_per_step']} ms/step" if "host_gap_ms_per_step" in b1 else ""))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--recipes", default="w4a16kv8,w4a8kv4")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-peak", action="store_true", help="batch 1 only")
    ap.add_argument("--no-batch1", action="store_true", help="the peak only")
    ap.add_argument("--no-profile", action="store_true", help="no eager profile of the peak batch")
    ap.add_argument("--ladder", default="", help="batch rungs for the peak search (default: 16 .. 1024)")
    ap.add_argument("--allreduce", default="fused,oneshot,nccl", help="TP>1 all-reduce paths, each its own case")
    ap.add_argument("--overlap", default="on", help="peak: overlap_steps modes, each run on the same models (on,off)")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # recipe:tp:allreduce, run in this process
    args = ap.parse_args()
    if args.case:
        recipe, tp, allreduce = args.case.split(":")
        with open(args.out, "w") as f:
            json.dump(run_case(args, recipe, int(tp), allreduce), f)
        return
    results = []
    for recipe in args.recipes.split(","):
        for tp in (int(t) for t in args.tp.split(",")):
            for path in (args.allreduce.split(",") if tp > 1 else ["-"]):
                if tp > torch.cuda.device_count():
                    results.append({"recipe": recipe, "tp": tp, "allreduce_path": path,
                                    "error": f"{torch.cuda.device_count()} GPU(s) visible"})
                    continue
                part = f"{args.out}.{recipe}.tp{tp}{'' if tp == 1 else '-' + path}.json"
                flags = [f for f, on in (("--no-peak", args.no_peak), ("--no-batch1", args.no_batch1),
                                          ("--no-profile", args.no_profile)) if on]
                cmd = [sys.executable, __file__, part, "--case", f"{recipe}:{tp}:{path}", "--layers", str(args.layers),
                       "--repeats", str(args.repeats), "--ladder", args.ladder, "--overlap", args.overlap] + flags
                rc = subprocess.run(cmd).returncode
                if rc == 0 and os.path.exists(part):
                    with open(part) as f:
                        results.append({**json.load(f), "allreduce_path": path})
                    compare_logits(results, part, f"{args.out}.{recipe}.tp1.json", tp)
                else:
                    results.append({"recipe": recipe, "tp": tp, "allreduce_path": path,
                                    "error": f"child exited with {rc}"})
            payload = {"bench": "tensor_parallel", "shape": "llama3-70b", "layers": args.layers,
                       "date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("LOWBIT_COMMIT", "unknown"),
                       "results": results}
            with open(args.out, "w") as f:
                json.dump(payload, f, indent=1)
    print(table(results))


if __name__ == "__main__":
    main()
