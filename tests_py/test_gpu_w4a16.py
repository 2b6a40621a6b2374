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
    ws = torch.full((_core.gemm_w4a16_workspace_elems(37, 1000, 8),), float("nan"), device="cuda")
    ws[8 * 37 * 1000:] = 0  # the per-tile arrival counters at the tail must start at zero
    y, ref = run_gemm(37, 1000, 2048, 128, 8, seed=5, workspace=ws)
    check(y, ref)


def test_gemm_w4a16_workspace_layout():
    """Partials [split, m, n], then one counter per (block_m x 128) output tile."""
    assert _core.gemm_w4a16_workspace_elems(37, 1000, 1) == 0
    assert _core.gemm_w4a16_workspace_elems(1, 4096, 8) == 8 * 4096 + 32  # 8-token blocks
    assert _core.gemm_w4a16_workspace_elems(37, 1000, 8) == 8 * 37 * 1000 + 8  # 64-token blocks
    assert _core.gemm_w4a16_workspace_elems(300, 1000, 2) == 2 * 300 * 1000 + 3 * 8  # 128-token blocks


def gemm_operands(m, n, k, group, seed):
    q, s, z = random_w4(n, k, group, seed)
    packed = tuple(torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, group))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).half()
    return x, packed, x.double() @ reference_weight(q, s, z, k, group).T


# The last block of each tile sums the partials in a fixed order and resets the tile's counter: many
# back-to-back split launches (own and caller workspaces, the caller's reused and oversized) must all
# give the first launch's y bit for bit, and agree with split 1 and the float64 reference.
@pytest.mark.parametrize("m,n,k,split", [(1, 4096, 4096, 8), (3, 1000, 2048, 6), (16, 4103, 576, 3),
                                         (37, 1000, 2048, 8), (129, 389, 1216, 2)])
def test_gemm_w4a16_split_k_counters_reset(m, n, k, split):
    group = 64
    x, (data, ps, pz), ref = gemm_operands(m, n, k, group, seed=m + n)
    xc = x.cuda()

    def gemm(split_k, workspace=None):
        y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        _core.gemm_w4a16(xc, data, ps, pz, n, k, group, y, split_k=split_k, workspace=workspace)
        return y

    first = gemm(split)
    check(first.cpu().double(), ref)
    check(gemm(1).cpu().double(), ref)
    elems = _core.gemm_w4a16_workspace_elems(m, n, split)
    for ws in (torch.zeros(elems, device="cuda"), torch.zeros(elems + 1000, device="cuda")):
        outs = [gemm(split) for _ in range(20)] + [gemm(split, ws) for _ in range(20)]
        torch.cuda.synchronize()
        for i, y in enumerate(outs):
            assert torch.equal(y, first), f"launch {i} differs from the first split launch"
        assert torch.count_nonzero(ws[-(elems - split * m * n):]) == 0, "counters not left zero"


def test_gemm_w4a16_shared_workspace_across_shapes():
    """One zeroed workspace sized for the largest problem serves GEMMs of other shapes in any order."""
    shapes = [(1, 4096, 4096, 8), (37, 1000, 2048, 8), (5, 4103, 576, 3), (1, 256, 1024, 4)]
    ws = torch.zeros(max(_core.gemm_w4a16_workspace_elems(m, n, s) for m, n, _, s in shapes), device="cuda")
    runs = []
    for i, (m, n, k, split) in enumerate(shapes):
        x, (data, ps, pz), ref = gemm_operands(m, n, k, 64, seed=100 + i)
        runs.append((x.cuda(), data, ps, pz, m, n, k, split, ref))
    for _ in range(3):
        for xc, data, ps, pz, m, n, k, split, ref in runs:
            y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
            own = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
            _core.gemm_w4a16(xc, data, ps, pz, n, k, 64, y, split_k=split, workspace=ws)
            _core.gemm_w4a16(xc, data, ps, pz, n, k, 64, own, split_k=split)
            assert torch.equal(y, own)
            check(y.cpu().double(), ref)


def test_gemm_w4a16_workspace_too_small():
    x, (data, ps, pz), _ = gemm_operands(4, 256, 1024, 64, seed=3)
    y = torch.empty(4, 256, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="'workspace' needs"):
        _core.gemm_w4a16(x.cuda(), data, ps, pz, 256, 1024, 64, y, split_k=4,
                         workspace=torch.zeros(4 * 4 * 256, device="cuda"))  # partials only, no counters


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
