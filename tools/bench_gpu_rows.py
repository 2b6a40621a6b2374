"""Device time of the row-wise forward kernels (RMSNorm, residual add + RMSNorm, SiLU·mul) at decode and
prefill shapes, beside the same math in torch, from the profiler's kernel records (CUDA-graph timing does
not apply: these ops launch on lowbit's current stream). Prints one line per case; JSON to argv[1].
  python3 tools/bench_gpu_rows.py out.json
"""
import json
import sys

import torch

import lowbit  # noqa: F401
from lowbit import _core as lb

from bench_gpu_common import device_meta, profiled_kernel_us

# decode rows, then a peak-protocol decode step (1536) and a prefill-phase step (8192 tokens), 8B and 70B widths
CASES = [(1, 576), (1, 4096), (1, 8192), (64, 4096), (512, 4096), (1536, 4096), (8192, 4096), (8192, 8192)]
REPS = 50


def kernel_us(fn):
    """Mean device microseconds per call of fn, summed over the kernels it launches."""
    return profiled_kernel_us(fn, REPS, warmup=3)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench_rows.json"
    rows = []
    for t, h in CASES:
        for wdt in (torch.float16,):
            x = torch.randn(t, h, device="cuda").half()
            res = torch.randn(t, h, device="cuda").half()
            w = (torch.rand(h, device="cuda") + 0.5).to(wdt)
            o = torch.empty_like(x)
            r = {"rows": t, "cols": h, "weight": str(wdt).split(".")[-1]}
            r["lowbit_rms_norm_us"] = kernel_us(lambda: lb.rms_norm(x, w, 1e-5, o))
            r["lowbit_add_rms_norm_us"] = kernel_us(lambda: lb.add_rms_norm(res, x, w, 1e-5, o))
            # bytes moved: x, residual in and out, the output (f16), the weight once
            r["lowbit_add_rms_norm_tbps"] = (4 * t * h * 2 + h * w.element_size()) / r["lowbit_add_rms_norm_us"] / 1e6
            r["torch_rms_norm_us"] = kernel_us(lambda: torch.nn.functional.rms_norm(x, (h,), w.half(), 1e-5))
            gu = torch.randn(t, 3 * h, device="cuda").half()
            act = torch.empty(t, gu.shape[1] // 2, device="cuda").half()
            r["lowbit_silu_mul_us"] = kernel_us(lambda: lb.silu_mul(gu, act))
            r["torch_silu_mul_us"] = kernel_us(
                lambda: torch.nn.functional.silu(gu[:, :act.shape[1]]) * gu[:, act.shape[1]:])
            rows.append(r)
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)
    with open(out, "w") as f:
        json.dump({"meta": {**device_meta(), "timing": "profiler kernel time, mean of 50 calls"}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
