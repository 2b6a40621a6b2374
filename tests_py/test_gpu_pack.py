"""sm80 W4 packing from Python (host code: runs in CI without a GPU)."""
import pytest
import torch

import lowbit
from lowbit import _core


def random_w4(n, k, group, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    groups = (k + group - 1) // group
    scales = (torch.rand(n, groups, generator=g) * 0.02 + 0.001).half()
    zeros = (torch.rand(n, groups, generator=g) * 15).half()
    return q, scales, zeros


@pytest.mark.parametrize("n,k,group", [(1, 64, 64), (33, 576, 128), (64, 256, 64), (17, 1024, 128)])
def test_pack_roundtrip_bit_exact(n, k, group):
    q, s, z = random_w4(n, k, group, n * 1000 + k)
    data, ps, pz = _core.pack_w4_sm80(q, s, z, group)
    assert tuple(data.shape) == ((n + 15) // 16, k // 64 * 512)
    q2, s2, z2 = _core.unpack_w4_sm80(data, ps, pz, n, k, group)
    assert torch.equal(torch.from_dlpack(q2), q)
    assert torch.equal(torch.from_dlpack(s2), s)
    assert torch.equal(torch.from_dlpack(z2), z)


def test_pack_symmetric_has_no_zeros():
    q, s, _ = random_w4(16, 128, 64, 3)
    data, ps, pz = _core.pack_w4_sm80(q, s, None, 64, symmetric=True)
    q2, s2, z2 = _core.unpack_w4_sm80(data, ps, pz, 16, 128, 64, symmetric=True)
    assert z2 is None and torch.equal(torch.from_dlpack(q2), q) and torch.equal(torch.from_dlpack(s2), s)


def test_pack_errors_name_the_problem():
    q, s, z = random_w4(16, 96, 32, 4)
    with pytest.raises(ValueError, match="k must be a multiple of 64, got k=96"):
        _core.pack_w4_sm80(q, s, z, 32)
    q, s, z = random_w4(16, 128, 64, 5)
    with pytest.raises(ValueError, match="scales"):
        _core.pack_w4_sm80(q, s[:, :1].contiguous(), z, 64)
    with pytest.raises(TypeError, match="q"):
        _core.pack_w4_sm80(q.to(torch.int32), s, z, 64)


@pytest.mark.skipif(lowbit.cuda_available(), reason="checks the no-GPU behaviour")
def test_gpu_entry_points_fail_clearly_without_gpu():
    with pytest.raises((RuntimeError, NotImplementedError), match="cuda_device_info|CUDA"):
        _core.cuda_device_info()
    x = torch.randn(1, 64).half()
    q, s, z = random_w4(16, 64, 64, 6)
    data, ps, pz = _core.pack_w4_sm80(q, s, z, 64)
    with pytest.raises((TypeError, NotImplementedError), match="gemm_w4a16"):
        _core.gemm_w4a16(x, data, ps, pz, 16, 64, 64, torch.empty(1, 16).half())
