"""Device time of the fused SiLU·mul + quantizer (silu_mul_quantize) at 1 / 4 / 16 rows (Llama-3-8B width 14336) and
the greedy sampler (sample_rows over 128256 f16 logits, temperature 0: argmax + log-softmax), one block per row (row
cluster mode 0) vs a cluster of CTAs per row on sm_90 (mode 1), in one process; and the quantizing norm
(rms_norm_quantize: residual add + RMSNorm + per-token int8, width 4096), one block per row in both modes, for scale. Median of each launch's kernel
record in the torch profiler (these ops launch on lowbit's current stream, which a CUDA-graph capture refuses).
Also SiLU·mul + quantizer at Llama-3-70B's width 28672 (one GPU), where mode 0 runs the two kernels the fused op
replaces (silu_mul, then the per-token quantizer: no one-block kernel holds 28672 channels) and mode 1 the cluster
kernel with two groups per thread; there the figure is every kernel of a call, summed.
  python3 tools/bench_gpu_row_clusters.py out.json
"""
import json
import os
import statistics
import sys

import torch

import lowbit  # noqa: F401
from lowbit import _core as lb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_common import device_meta  # noqa: E402

REPS = 200
ROWS = (1, 4, 16)


def kernel_records(fn):
    """(name, device us) of every kernel of REPS calls of fn, after 5 warm-up calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    return [(ev.name, getattr(ev, "device_time_total", None) or ev.cuda_time_total) for ev in prof.events()
            if ev.device_type == torch.autograd.DeviceType.CUDA and not ev.name.startswith("Memcpy")]


def median_kernel_us(fn, name_part):
    times = [t for name, t in kernel_records(fn) if name_part in name]
    if not times:
        raise RuntimeError(f"no kernel named like {name_part!r}")
    return statistics.median(times), len(times)


def per_call_us(fn):
    """Every kernel's device time per call, summed (the fallback is two kernels)."""
    return sum(t for _, t in kernel_records(fn)) / REPS


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench_row_clusters.json"
    rows = []
    for t in ROWS:
        x = torch.randn(t, 4096, device="cuda").half()
        res = torch.randn(t, 4096, device="cuda").half()
        w = (torch.rand(4096, device="cuda") + 0.5).half()
        qn, sn = torch.empty(t, 4096, dtype=torch.int8, device="cuda"), torch.empty(t, device="cuda")
        gu = torch.randn(t, 2 * 14336, device="cuda").half()
        qs, ss = torch.empty(t, 14336, dtype=torch.int8, device="cuda"), torch.empty(t, device="cuda")
        gu70 = torch.randn(t, 2 * 28672, device="cuda").half()
        qs70, ss70 = torch.empty(t, 28672, dtype=torch.int8, device="cuda"), torch.empty(t, device="cuda")
        for mode in (0, 1):
            lb._row_cluster_mode(mode)
            r = {"rows": t, "mode": "one block per row" if mode == 0 else "cluster per row"}
            r["add_norm_quantize_4096_us"], _ = median_kernel_us(
                lambda: lb.rms_norm_quantize(res, x, w, 1e-5, qn, sn), "norm")
            r["silu_mul_quantize_14336_us"], _ = median_kernel_us(
                lambda: lb.silu_mul_quantize(gu, qs, ss, pdl=False), "silu_mul_quantize")
            r["silu_mul_quantize_28672_us"] = per_call_us(lambda: lb.silu_mul_quantize(gu70, qs70, ss70, pdl=False))
            logits = torch.randn(t, 128256, device="cuda").half()
            prm = torch.tensor([[0.0, 0, 1.0, 0.0, 0.5]] * t, dtype=torch.float64, device="cuda").view(torch.int64)
            tok, lp = torch.empty(t, dtype=torch.int32, device="cuda"), torch.empty(t, device="cuda")
            r["sample_greedy_128256_us"], _ = median_kernel_us(lambda: lb.sample_rows(logits, prm, tok, lp), "sample")
            rows.append(r)
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)
    lb._row_cluster_mode(-1)
    with open(out, "w") as f:
        json.dump({"meta": {**device_meta(), "timing": f"profiler kernel records, median of {REPS} launches"},
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
