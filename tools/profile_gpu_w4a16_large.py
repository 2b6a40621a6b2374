"""W4A16 at a serving batch (gate_up 28672x4096, M=1024) with each large-M kernel forced, to run under Nsight
Compute: ncu -k regex:"gemm_w4a16_sm90|gemm_w4a16_large" python3 tools/profile_gpu_w4a16_large.py [m]"""
import sys

import torch

import lowbit  # noqa: F401
from lowbit import _core

m = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
n, k, g = 28672, 4096, 128
q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
s = (torch.rand(n, k // g) * 0.02 + 0.002).half()
z = (torch.rand(n, k // g) * 15).half()
data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, g))
x = torch.randn(m, k, device="cuda").half()
y = torch.empty(m, n, device="cuda").half()
for kernel in ("sm90", "large"):
    _core.gemm_w4a16(x, data, ps, pz, n, k, g, y, kernel=kernel)
torch.cuda.synchronize()
