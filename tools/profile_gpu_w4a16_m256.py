"""W4A16 on wgmma at a serving batch (M = 256) on the qkv and o layers of Llama-3-8B, one launch per kernel name, to
run under Nsight Compute (the plan before the wide tile, stream-K at 128 / 256 tokens, the wide tile one launch and stream-K):
  ncu -k regex:"gemm_w4a16_sm90" python3 tools/profile_gpu_w4a16_m256.py [m] [kernel,kernel,...]
Prints each launch's shape and name in order (ncu lists the kernels in the same order)."""
import sys

import torch

import lowbit
from lowbit import _core

m = int(sys.argv[1]) if len(sys.argv) > 1 else 256
kernels = sys.argv[2].split(",") if len(sys.argv) > 2 else ["sm90nw", "sm90k:128", "sm90k:256", "sm90w:2", "sm90wk"]
for name, (n, k) in {"qkv": (6144, 4096), "o": (4096, 4096)}.items():
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    s = (torch.rand(n, k // 128) * 0.02 + 0.002).half()
    z = (torch.rand(n, k // 128) * 15).half()
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, 128))
    x = torch.randn(m, k, device="cuda").half()
    y = torch.empty(m, n, device="cuda").half()
    lx, ly = lowbit.from_dlpack(x), lowbit.from_dlpack(y)
    for kernel in kernels:
        plan = _core.gemm_w4a16_sm90_plan(m, n, k, kernel=kernel)
        print(f"{name} M={m} kernel={kernel} plan={plan}", flush=True)
        _core.gemm_w4a16(lx, lowbit.from_dlpack(data), lowbit.from_dlpack(ps), lowbit.from_dlpack(pz), n, k, 128, ly,
                         kernel=kernel)
    torch.cuda.synchronize()
