"""A few W4A16 decode GEMM calls for ncu (tools/gpu_run.sh step decode90_profile): Llama-3-8B down (32 CTAs of
128 rows: the per-CTA pipeline alone) and gate_up at one token, on the Hopper decode kernel unsplit and with a
4-CTA cluster, and on the sm80 small kernel; then the read bandwidth of a 2 GiB f16 sum, the roofline a GEMV
can reach (printed)."""
import torch

import lowbit
from lowbit import _core

GROUP = 128


def run(n, k, kernel, m=1, calls=3):
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    s = (torch.rand(n, k // GROUP) * 0.02 + 0.002).half()
    z = (torch.rand(n, k // GROUP) * 15).half()
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, GROUP))
    x, y = torch.randn(m, k, device="cuda").half(), torch.empty(m, n, device="cuda").half()
    for _ in range(calls):
        _core.gemm_w4a16(x, data, ps, pz, n, k, GROUP, y, kernel=kernel)
    torch.cuda.synchronize()


def read_bandwidth_gbs(nbytes=2 << 30):
    a = torch.randn(nbytes // 2, device="cuda").half()
    for _ in range(3):
        a.sum()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(10):
        a.sum()
    end.record()
    end.synchronize()
    return nbytes * 10 / (start.elapsed_time(end) * 1e-3) / 1e9


if __name__ == "__main__":
    assert lowbit.cuda_available()
    run(4096, 14336, "decode90:1")
    run(4096, 14336, "decode90:4")
    run(28672, 4096, "decode90:1")
    run(4096, 14336, "small")
    print(f"read bandwidth (f16 sum of 2 GiB): {read_bandwidth_gbs():.0f} GB/s")
