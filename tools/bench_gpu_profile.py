"""One W4A16 call (gate_up, M=1) and u4 and u8 decode-attention calls (B=64, L=8K) to run under
Nsight Compute: ncu --kernel-name regex:... python3 tools/bench_gpu_profile.py"""
import math

import torch

import lowbit  # noqa: F401
from lowbit import _core

n, k, g = 28672, 4096, 128
q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
s = (torch.rand(n, k // g) * 0.02).half()
z = (torch.rand(n, k // g) * 15).half()
data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, g))
x = torch.randn(1, k, device="cuda").half()
y = torch.empty(1, n, device="cuda").half()
for _ in range(2):
    _core.gemm_w4a16(x, data, ps, pz, n, k, g, y)

b, length, hkv, hq, d = 64, 8192, 8, 32, 128
nblk = b * length // 16
for kv, width in (("u4", d // 2), ("u8", d)):
    kd = torch.randint(0, 256, (nblk, hkv, 16, width), dtype=torch.uint8, device="cuda")
    vd = torch.randint(0, 256, (nblk, hkv, 16, width), dtype=torch.uint8, device="cuda")
    kp = torch.rand(nblk, hkv, 16, 2, device="cuda")
    vp = torch.rand(nblk, hkv, 16, 2, device="cuda")
    table = torch.randperm(nblk, device="cuda", dtype=torch.int32).view(b, -1)
    qa = torch.randn(b, hq, d, device="cuda").half()
    out = torch.empty_like(qa)
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    for _ in range(2):
        _core.decode_attention(qa, kd, vd, kp, vp, table, lens, length, 1 / math.sqrt(d), out, kv_dtype=kv)
    torch.cuda.synchronize()
    del kd, vd
