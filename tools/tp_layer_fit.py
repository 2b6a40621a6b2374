"""Tensor-parallel figures of the whole 80-layer Llama-3-70B from runs of a few of its layers (bench_gpu_tp.py at two
or more --layers): per case (recipe, TP, all-reduce path), a least-squares line t = a + b * layers through
  batch 1      ms per token, and
  peak         the full-batch decode step's ms (every sequence of the peak batch decoding: the static batch of the
               papers' protocol; the peak batch is sized for the 80-layer model, so it is the same at every count),
then t(80) and the TP speed-ups at 80 layers. Each layer streams its own ~0.2-0.4 GB of weights, so layers do not share
the L2 and the per-layer cost is a constant; the intercept holds the embedding, lm_head, sampling and host time.
  python3 tools/tp_layer_fit.py out.json run_4layers.json run_10layers.json
"""
import argparse
import json

FULL_LAYERS = 80


def fit(points):
    """Least squares through (layers, value) points: (a, b) of a + b * layers."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def cases(runs):
    """{(recipe, tp, path): {layers: result}} over the runs' results."""
    out = {}
    for run in runs:
        for r in run["results"]:
            if "error" in r:
                continue
            key = (r["recipe"], r["tp"], r.get("allreduce_path", "-"))
            out.setdefault(key, {})[r["layers"]] = r
    return out


def figures(by_layers):
    """The 80-layer fit of one case: batch-1 ms/token and the full-batch peak step."""
    out = {"layers": sorted(by_layers)}
    b1 = [(n, r["batch1"]["ms_per_token"]) for n, r in by_layers.items() if "batch1" in r]
    if len(b1) >= 2:
        a, b = fit(b1)
        out["batch1"] = {"points": b1, "ms_per_layer": round(b, 4), "intercept_ms": round(a, 3),
                         "ms_per_token_80": round(a + b * FULL_LAYERS, 3),
                         "tok_s_80": round(1e3 / (a + b * FULL_LAYERS), 1)}
    pk = [(n, r["peak"]["full_batch"]["step_ms"], r["peak"]["batch"]) for n, r in by_layers.items()
          if r.get("peak", {}).get("full_batch", {}).get("steps")]
    if len(pk) >= 2 and len({p[2] for p in pk}) == 1:
        a, b = fit([(n, ms) for n, ms, _ in pk])
        batch = pk[0][2]
        step = a + b * FULL_LAYERS
        out["peak"] = {"batch": batch, "points": [(n, ms) for n, ms, _ in pk], "ms_per_layer": round(b, 3),
                       "intercept_ms": round(a, 3), "step_ms_80": round(step, 2),
                       "decode_tok_s_80": round(batch / step * 1e3, 1)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    fits = {key: figures(by) for key, by in cases(runs).items()}
    lines = ["| recipe | TP | all-reduce | layers | b1 ms/layer | b1 ms/token at 80 | b1 speed-up | peak batch |"
             " peak ms/layer | peak step ms at 80 | peak tok/s at 80 | peak speed-up |", "|" + "---|" * 12]
    rows = []
    for (recipe, tp, path), f in sorted(fits.items()):
        base = fits.get((recipe, 1, "-"), {})
        b1, pk = f.get("batch1", {}), f.get("peak", {})
        up1 = base.get("batch1", {}).get("ms_per_token_80", 0) / b1["ms_per_token_80"] if b1 and base.get("batch1") else None
        upk = pk["decode_tok_s_80"] / base["peak"]["decode_tok_s_80"] if pk and base.get("peak") else None
        rows.append({"recipe": recipe, "tp": tp, "allreduce_path": path, **f,
                     "speedup_batch1_80": up1 and round(up1, 3), "speedup_peak_80": upk and round(upk, 3)})
        lines.append(f"| {recipe} | {tp} | {path} | {','.join(map(str, f['layers']))} | {b1.get('ms_per_layer')} | "
                     f"{b1.get('ms_per_token_80')} | {up1 and round(up1, 2)} | {pk.get('batch')} | "
                     f"{pk.get('ms_per_layer')} | {pk.get('step_ms_80')} | {pk.get('decode_tok_s_80')} | "
                     f"{upk and round(upk, 2)} |")
    payload = {"bench": "tensor_parallel_layer_fit", "full_layers": FULL_LAYERS,
               "sources": [{"file": p, "layers": r.get("layers"), "commit": r.get("commit"), "date": r.get("date")}
                           for p, r in zip(args.runs, runs)], "fits": rows}
    with open(args.out, "w") as f:
        json.dump(payload, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
