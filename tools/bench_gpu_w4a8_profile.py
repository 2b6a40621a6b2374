"""The W4A8 wgmma GEMM (gemm_w4a8_sm90) once per Llama-3-8B shape and kernel name in argv, the workload the ncu step of
tools/gpu_run.sh (w4a8_profile) profiles: gate_up and qkv at M = 1024 by default, each as 'sm90:1:256' (one launch,
256-token tiles, no split: the mainloop alone) unless names follow the shapes (e.g. gate_up qkv -- sm90 sm90:1:128);
--m=256 sets the tokens."""
import sys

import torch

import lowbit
from lowbit import _core

from bench_gpu_sm90_tiles import SHAPES, w4a8_weights


def main():
    args = sys.argv[1:]
    m = next((int(a[4:]) for a in args if a.startswith("--m=")), 1024)  # tokens (default 1024)
    args = [a for a in args if not a.startswith("--m=")]
    split = args.index("--") if "--" in args else len(args)
    shapes, kernels = args[:split] or ["gate_up", "qkv"], args[split + 1:] or ["sm90:1:256"]
    for name in shapes:
        n, k = SHAPES[name]
        (w,) = w4a8_weights(n, k, 1)
        xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
        xs = torch.rand(m, device="cuda") * 0.01
        y = torch.empty(m, n, device="cuda").half()
        for kn in kernels:
            _core.gemm_w4a8(lowbit.from_dlpack(xq), lowbit.from_dlpack(xs), w, lowbit.from_dlpack(y), 0,
                            torch.cuda.current_stream().cuda_stream, kn)
            torch.cuda.synchronize()
            print(name, m, kn, "ran; finite:", bool(torch.isfinite(y).all()), flush=True)


if __name__ == "__main__":
    main()
