"""GPU W4A16: dequantize kernel (bit-exact) and the mma.sync GEMM vs a float64 reference."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


def random_w4(n, k, group, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    groups = (k + group - 1) // group
    scales = (torch.rand(n, groups, generator=g) * 0.02 + 0.002).half()
    zeros = (torch.rand(n, groups, generator=g) * 15).half()
    return q, scales, zeros


def unpack_nibbles(q, k):
    """uint8 [n, k/2] -> int64 [n, k], low nibble first."""
    lo, hi = (q & 0xF).long(), (q >> 4).long()
    return torch.stack([lo, hi], dim=-1).reshape(q.shape[0], k)


def reference_weight(q, scales, zeros, k, group):
    vals = unpack_nibbles(q, k).double()
    idx = torch.arange(k) // group
    z = 8.0 if zeros is None else zeros.double()[:, idx]
    return (vals - z) * scales.double()[:, idx]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,k,group,symmetric", [(33, 576, 128, False), (7, 100, 32, False), (64, 256, 64, True)])
def test_dequantize_w4_bit_exact(dtype, n, k, group, symmetric):
    q, s, z = random_w4(n, k, group, n + k)
    z = None if symmetric else z
    out = torch.full((n, k), float("nan"), dtype=dtype, device="cuda")
    _core.dequantize_w4(q.cuda(), s.cuda(), None if z is None else z.cuda(), group, out)
    torch.cuda.synchronize()
    ref = reference_weight(q, s, z, k, group).to(dtype)  # exact product, one rounding
    assert torch.equal(out.cpu(), ref)


def run_gemm(m, n, k, group, split_k, seed, x_stride=None, workspace=None):
    q, s, z = random_w4(n, k, group, seed)
    data, ps, pz = _core.pack_w4_sm80(q, s, z, group)
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in (data, ps, pz))
    x_full = torch.randn(m, x_stride or k, generator=torch.Generator().manual_seed(seed + 1)).half()
    x = x_full[:, :k]
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.gemm_w4a16(x_full.cuda()[:, :k], data, ps, pz, n, k, group, y, split_k=split_k, workspace=workspace)
    torch.cuda.synchronize()
    ref = x.double() @ reference_weight(q, s, z, k, group).T
    return y.cpu().double(), ref


def check(y, ref, bound=2e-3):
    assert not torch.isnan(y).any(), "unwritten outputs"
    rel = (y - ref).norm() / ref.norm()
    assert rel < bound, f"relative error {rel:.2e}"
    # every row is right, not just the bulk (a wrong token tile would hide in the Frobenius norm)
    row_rel = (y - ref).norm(dim=1) / ref.norm(dim=1)
    assert row_rel.max() < 4 * bound, f"worst row relative error {row_rel.max():.2e}"


# Weights are rounded to f16 once (q*s - z*s, ~2^-11 relative), products accumulate in f32 and the
# output is rounded to f16: a relative Frobenius error of a few 1e-4 is expected, 2e-3 is the bound.
# m covers every block shape (<= 8, <= 16, <= 32, <= 64 tokens, 128-token tiles) and their edges.
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 33, 64, 65, 100, 129])
@pytest.mark.parametrize("n,k,group", [(33, 576, 128), (256, 1024, 64), (1000, 2048, 128)])
@pytest.mark.parametrize("split_k", [0, 1, 3])
def test_gemm_w4a16_matches_float64(m, n, k, group, split_k):
    y, ref = run_gemm(m, n, k, group, split_k, seed=m * 7 + n + split_k)
    check(y, ref)


# Odd token counts up to 1100 (several 128-token tiles, a partial last one), odd n (partial 16-row
# tile and partial 128-row block), k = 64 (one chunk), a short last group (k = 576, g128), strided x.
@pytest.mark.parametrize("m", [5, 47, 255, 513, 1100])
@pytest.mark.parametrize("n,k,group,x_stride", [(4103, 576, 64, 584), (17, 64, 64, 64), (389, 1216, 128, 1216)])
@pytest.mark.parametrize("split_k", [0, 2])
def test_gemm_w4a16_odd_shapes(m, n, k, group, x_stride, split_k):
    y, ref = run_gemm(m, n, k, group, split_k, seed=m + n + k, x_stride=x_stride)
    check(y, ref)


def test_gemm_w4a16_poisoned_workspace():
    """Split-K partials must all be written: a NaN-filled workspace may not leak into y."""
    ws = torch.full((8 * 37 * 1000,), float("nan"), device="cuda")
    y, ref = run_gemm(37, 1000, 2048, 128, 8, seed=5, workspace=ws)
    check(y, ref)


@pytest.mark.parametrize("m,n,k", [(1, 4096, 14336), (16, 4096, 14336), (16, 28672, 4096), (64, 4096, 4096),
                                   (300, 1536, 4096)])
def test_gemm_w4a16_llama_shapes(m, n, k):
    y, ref = run_gemm(m, n, k, 128, 0, seed=11 + m)
    check(y, ref)


def test_gemm_w4a16_bad_inputs():
    q, s, z = random_w4(32, 128, 64, 1)
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, 64))
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(NotImplementedError, match="'x' must be f16"):
        _core.gemm_w4a16(torch.randn(2, 128, device="cuda", dtype=torch.bfloat16), data, ps, pz, 32, 128, 64, y)
    with pytest.raises(ValueError, match="x.*100 features but the weight expects k=128"):
        _core.gemm_w4a16(torch.randn(2, 100, device="cuda").half(), data, ps, pz, 32, 128, 64, y)
    with pytest.raises(TypeError, match="'x' must be a CUDA tensor"):
        _core.gemm_w4a16(torch.randn(2, 128).half(), data, ps, pz, 32, 128, 64, y)
    with pytest.raises(ValueError, match="'y'"):
        _core.gemm_w4a16(torch.randn(2, 128, device="cuda").half(), data, ps, pz, 32, 128, 64, y[:, :16])
