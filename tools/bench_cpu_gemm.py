"""Times lowbit's CPU linear for the SmolLM2-135M decode shapes (M=1) in every weight format against
torch's f32 matmul, and estimates the decode GEMM throughput of one token (30 layers + lm_head).

    LOWBIT_DEV_BUILD=build/<dir>/python_ext PYTHONPATH=python python tools/bench_cpu_gemm.py [--threads 2]

Each entry is the median of many calls after warm-up (calls repeat until --seconds per entry have passed).
"""
import argparse
import os
import statistics
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--m", type=int, default=1, help="tokens per call (1 = decode)")
    p.add_argument("--seconds", type=float, default=0.3, help="time spent timing each entry")
    p.add_argument("--formats", default="f32,f16,bf16,w8,e4m3,w4,qoq,liquid,w8:a8,qoq:a8,liquid:a8")
    return p.parse_args()


ARGS = parse_args()
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))  # before the extension loads OpenMP

import torch  # noqa: E402

from lowbit import _core as C  # noqa: E402

# (name, k, n, uses per token): SmolLM2-135M, hidden 576, 9 q / 3 kv heads of 64, intermediate 1536.
SHAPES = [
    ("q_proj/o_proj 576->576", 576, 576, 60),
    ("k_proj/v_proj 576->192", 576, 192, 60),
    ("gate+up 576->3072", 576, 3072, 30),
    ("down 1536->576", 1536, 576, 30),
    ("lm_head 576->49152", 576, 49152, 1),
]


def median_seconds(fn):
    for _ in range(3):
        fn()
    times = []
    deadline = time.perf_counter() + ARGS.seconds
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 2000):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    torch.set_num_threads(ARGS.threads)
    torch.manual_seed(0)
    entries = [f.split(":") + ["float"] for f in ARGS.formats.split(",")]
    columns = [(e[0], "int8_per_token" if e[1] == "a8" else "float") for e in entries]
    results = {}
    for name, k, n, _ in SHAPES:
        w = torch.randn(n, k) * 0.05
        x = torch.randn(ARGS.m, k)
        out = torch.empty(ARGS.m, n)
        results[(name, "torch")] = median_seconds(lambda: torch.matmul(x, w.T, out=out))
        for fmt, act in columns:
            qw = C.quantize_weight(w, fmt, 128 if fmt in ("w4", "qoq") else 64 if fmt == "liquid" else 0)
            pw = C.pack_weight(qw, "cpu", "cpu")
            results[(name, fmt, act)] = median_seconds(lambda: C.linear(x, pw, out=out, act=act))

    labels = ["torch f32"] + [f + ("a8" if a != "float" else "") for f, a in columns]
    print(f"M={ARGS.m}, threads={ARGS.threads}; median microseconds per call")
    print(f"{'shape':26s}" + "".join(f"{lab:>10s}" for lab in labels))
    for name, *_ in SHAPES:
        row = [results[(name, "torch")]] + [results[(name, f, a)] for f, a in columns]
        print(f"{name:26s}" + "".join(f"{s * 1e6:10.1f}" for s in row))
    print(f"{'token GEMMs (ms)':26s}", end="")
    totals = []
    for key in [("torch",)] + [(f, a) for f, a in columns]:
        total = sum(uses * results[(name,) + key] for name, _, _, uses in SHAPES)
        totals.append(total)
        print(f"{total * 1e3:10.2f}", end="")
    print()
    print(f"{'-> tokens/s (GEMM only)':26s}" + "".join(f"{1 / t:10.1f}" for t in totals))


if __name__ == "__main__":
    main()
