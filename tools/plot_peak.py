#!/usr/bin/env python3
"""Draws the peak-throughput results (tools/bench_gpu_peak.py JSONs) as decode and end-to-end tokens/s against
batch size, one line per engine and recipe, the peak batch of each marked. Later files win where two files hold
the same engine and recipe.

  python3 tools/plot_peak.py docs/img/peak_throughput_h100.png bench/results/h100-...-peak-*.json
Needs matplotlib (pip install 'lowbit[plot]' or matplotlib).
"""
import json
import sys


def label_of(part):
    if part.get("engine") == "torch" or part.get("part") == "torch":
        return "torch.compile f16"
    return f"lowbit {part.get('recipe') or part['part'].split(':', 1)[-1]}"


def series(paths):
    """{label: {"batch": [...], "decode": [...], "e2e": [...], "peak": batch or None, "commit": str}} from the
    parts that ran (failed parts are left out), batches ascending."""
    out = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for part in doc["parts"]:
            cases = [c for c in part.get("cases") or [] if c.get("decode_tok_s")]
            if part.get("error") or not cases:
                continue
            cases.sort(key=lambda c: c["batch"])
            peak = [c["batch"] for c in cases if c.get("peak_search")]
            out[label_of(part)] = {"batch": [c["batch"] for c in cases], "decode": [c["decode_tok_s"] for c in cases],
                                   "e2e": [c["e2e_tok_s"] for c in cases], "peak": peak[0] if peak else None,
                                   "commit": part.get("commit") or doc["meta"].get("commit", "?")}
    return out


def draw(data, device, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True)
    for ax, key, title in ((axes[0], "decode", "decode tokens/s (the papers' figure)"),
                           (axes[1], "e2e", "end-to-end tokens/s (prefill included)")):
        for label, s in sorted(data.items(), key=lambda kv: -max(kv[1]["decode"])):
            style = "--" if label.startswith("torch") else "-"
            (line,) = ax.plot(s["batch"], s[key], style, marker="o", label=label)
            if s["peak"] is not None:
                i = s["batch"].index(s["peak"])
                ax.plot([s["peak"]], [s[key][i]], marker="*", markersize=14, color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (requests of 1024 in / 512 out; * = largest that fits)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("tokens/s")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Llama-3-8B shape, random weights, {device}")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    out_png, paths = argv[0], argv[1:]
    data = series(paths)
    if not data:
        print("plot_peak: no part with results in", ", ".join(paths))
        return 1
    with open(paths[-1]) as f:
        device = json.load(f)["meta"].get("device", "GPU")
    draw(data, device, out_png)
    for label, s in data.items():
        print(f"{label:24s} batches {s['batch']}  decode {s['decode']}  (commit {s['commit']})")
    print("wrote", out_png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
