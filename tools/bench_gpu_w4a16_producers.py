"""The W4A16 wgmma GEMM's split producer (three threads) against its one-thread producer ('sm90o...' names) on the
Llama-3-8B shapes, with cuBLAS fp16 in the same process (CUDA-graph medians, weight copies past L2).

  python tools/bench_gpu_w4a16_producers.py OUT.json [--ms=128,256,1024] [--shapes=qkv,o] [--variants=sm90:1:128,...]

Per (shape, M) row: cublas_fp16_us, the plan, and for 'sm90' (the automatic plan, the same for both producers) and
each variant (forced one-launch tiles: the per-block costs the plan's model is fitted to) new_<name>_us and
old_<name>_us. Columns timed later in a row read slower in this kind of benchmark (docs/benchmarks_gpu.md), so each
pair runs twice in alternating order (new, old, old, new) and each value is the mean of its two medians.
"""
import sys

import torch

import lowbit
from lowbit import _core

from bench_gpu_common import copies_for, device_meta, graph_time_us, write_json
from bench_gpu_sm90_tiles import SHAPES, w4a16_weights

MS = [128, 256, 1024]
VARIANTS = ["sm90:1:128", "sm90:1:256"]


def old_name(kernel):
    return "sm90o" + kernel[4:]


def bench_shape(name, n, k, ms, l2, variants):
    rows = []
    stream = torch.cuda.current_stream
    wf16 = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, l2))]
    _, w16 = w4a16_weights(n, k, copies_for(n * k // 2, l2))
    for m in ms:
        row = {"shape": name, "n": n, "k": k, "m": m}
        x = torch.randn(m, k, device="cuda").half()
        row["cublas_fp16_us"] = graph_time_us([lambda w=w: torch.matmul(x, w.T) for w in wf16])
        y = torch.empty(m, n, device="cuda").half()
        lx, ly = lowbit.from_dlpack(x), lowbit.from_dlpack(y)
        row["plan"] = list(_core.gemm_w4a16_sm90_plan(m, n, k))
        row["plan_rows"] = _core.gemm_w4a16_sm90_plan_rows(m, n, k)
        row["plan_old"] = list(_core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90o"))

        def fns(kn):
            return [lambda w=w: _core.gemm_w4a16(lx, w[0], w[1], w[2], n, k, 128, ly, 0, None, stream().cuda_stream,
                                                 kernel=kn) for w in w16]

        for kernel in ["sm90"] + variants:
            times = {"new": [], "old": []}
            for order in (("new", "old"), ("old", "new")):
                for which in order:
                    kn = kernel if which == "new" else old_name(kernel)
                    try:
                        times[which].append(graph_time_us(fns(kn)))
                    except Exception as e:  # noqa: BLE001 - record why
                        row[f"{which}_{kernel}_error"] = str(e).splitlines()[0][:160]
            for which, ts in times.items():
                if ts:
                    row[f"{which}_{kernel}_us"] = sum(ts) / len(ts)
                    row[f"{which}_{kernel}_runs"] = ts
        rows.append(row)
        cb, nw, od = row["cublas_fp16_us"], row.get("new_sm90_us", float("nan")), row.get("old_sm90_us", float("nan"))
        forced = " ".join(f"{v} {row.get(f'old_{v}_us', float('nan')):.1f}->{row.get(f'new_{v}_us', float('nan')):.1f}"
                          for v in variants)
        print(f"{name:8s} M={m:5d} cuBLAS {cb:7.1f} | plan {tuple(row['plan'])} r{row['plan_rows']} one-thread "
              f"{od:7.1f} split {nw:7.1f} ({od / nw:4.2f}x) {cb / nw:5.2f}x cuBLAS (was {cb / od:5.2f}x) | {forced}",
              flush=True)
    return rows


def main():
    out = sys.argv[1]
    ms = next((a[5:] for a in sys.argv[2:] if a.startswith("--ms=")), None)
    ms = [int(v) for v in ms.split(",")] if ms else MS
    names = next((a[9:].split(",") for a in sys.argv[2:] if a.startswith("--shapes=")), list(SHAPES))
    variants = next(([v for v in a[11:].split(",") if v] for a in sys.argv[2:] if a.startswith("--variants=")), VARIANTS)
    meta = device_meta()
    rows = []
    for name in names:
        rows += bench_shape(name, *SHAPES[name], ms, meta["l2_bytes"], variants)
        write_json(out, {"meta": meta, "gemm": rows})


if __name__ == "__main__":
    main()
