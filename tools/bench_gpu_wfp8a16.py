"""Weight-only FP8 (lowbit gemm_wfp8a16: e4m3 weights per channel x f16 activations) at decode token counts on
Llama-3-8B layer shapes, beside cuBLAS fp16 (torch.matmul) and lowbit W8A16 (int8 weights, the same kernel with
another code conversion) in the same process. CUDA-graph replay, median of 20, weight copies past 3x L2.
usage: bench_gpu_wfp8a16.py OUT.json [--ms=1,16]"""
import sys

import torch

import lowbit
from lowbit import _core

from bench_gpu_common import copies_for, device_meta, graph_time_us, write_json

SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def lowbit_time(x, n, k, l2, fp8):
    """One 8-bit weight kernel over rotating weight copies: e4m3 (fp8) or int8 codes, f32 scales per channel."""
    def codes():
        if fp8:
            return (torch.randn(n, k, device="cuda") * 30).clamp(-448, 448).to(torch.float8_e4m3fn)
        return torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    ws = [(codes(), torch.rand(n, device="cuda") * 0.01) for _ in range(copies_for(n * k, l2))]
    m = x.shape[0]
    y = torch.empty(m, n, device="cuda").half()
    work = torch.empty(64 * m * n, device="cuda")  # split-K partials: no allocation inside the graph
    lx, ly, lwork = lowbit.from_dlpack(x), lowbit.from_dlpack(y), lowbit.from_dlpack(work)
    lws = [(lowbit.from_dlpack(q), lowbit.from_dlpack(s)) for q, s in ws]
    cs = torch.cuda.current_stream
    if fp8:
        return graph_time_us([lambda w=w: _core.gemm_wfp8a16(lx, w[0], w[1], ly, workspace=lwork,
                                                             stream=cs().cuda_stream) for w in lws])
    return graph_time_us([lambda w=w: _core.gemm_w8a16(lx, w[0], w[1], 0, ly, workspace=lwork,
                                                       stream=cs().cuda_stream) for w in lws])


def main():
    out = sys.argv[1]
    ms = [1, 16]
    for a in sys.argv[2:]:
        if a.startswith("--ms="):
            ms = [int(v) for v in a[5:].split(",")]
    meta = device_meta()
    rows = []
    for name, (n, k) in SHAPES.items():
        for m in ms:
            x = torch.randn(m, k, device="cuda").half()
            fs = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, meta["l2_bytes"]))]
            row = {"shape": name, "n": n, "k": k, "m": m,
                   "cublas_fp16_us": graph_time_us([lambda w=w: torch.matmul(x, w.T) for w in fs])}
            del fs
            row["lowbit_wfp8a16_us"] = lowbit_time(x, n, k, meta["l2_bytes"], True)
            row["lowbit_w8a16_us"] = lowbit_time(x, n, k, meta["l2_bytes"], False)
            row["wfp8a16_speedup_vs_cublas"] = row["cublas_fp16_us"] / row["lowbit_wfp8a16_us"]
            row["wfp8a16_weight_gbs"] = (n * k + 4 * n) / row["lowbit_wfp8a16_us"] / 1e3
            rows.append(row)
            print(f"{name:8s} m={m:3d} cuBLAS fp16 {row['cublas_fp16_us']:8.1f} us | wfp8a16 "
                  f"{row['lowbit_wfp8a16_us']:8.1f} us ({row['wfp8a16_speedup_vs_cublas']:.2f}x, "
                  f"{row['wfp8a16_weight_gbs']:.0f} GB/s) | w8a16 {row['lowbit_w8a16_us']:8.1f} us", flush=True)
    write_json(out, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
