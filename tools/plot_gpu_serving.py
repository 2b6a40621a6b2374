"""Latency against request rate from a tools/bench_gpu_serving.py JSON: TTFT and TPOT (P50 and P99) at each
Poisson rate and at saturation (all requests at once), as one PNG.

    python3 tools/plot_gpu_serving.py bench/results/h100-...-serving-....json docs/img/serving_latency_h100.png
"""
import json
import sys


def main(src: str, png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.load(open(src))
    runs = sorted(d["rates"], key=lambda r: r["request_rate"]) + [d["saturation"]]
    labels = [f"{r['request_rate']:g}" for r in runs[:-1]] + ["all at once"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, title in ((axes[0], "ttft", "time to first token"), (axes[1], "tpot", "time per output token")):
        for q, style in (("p50_ms", "o-"), ("p99_ms", "s--")):
            ax.plot(labels, [r[metric][q] for r in runs], style, label=q.split("_")[0].upper())
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    p = d["parameters"]
    fig.suptitle(f"lowbit serve, {p['recipe']}, Llama-3-8B shape (random weights), {p['input_len']} in / "
                 f"{p['output_len']} out, {d['device']}, commit {d['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print("wrote", png)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
