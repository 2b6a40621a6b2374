"""GPU W4A8 wgmma persistent tile loop ('sm90p[:T[:G]]': the resident CTAs, or G of them, each walk whole tiles with
one running pipeline across tile boundaries): raw int32 bit-exact against the CPU reference and against the
one-tile-per-CTA kernel ('sm90:1:T', same tile, same sums); the scaled f16 output bit-identical to that kernel's; few
CTAs walking many tiles reach each tile-transition path (a tile's first stage in every pipeline slot, tiles shorter
and longer than the pipeline, the epilogue's staging reused tile after tile); clear errors for bad names."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w4a8 import s8_weights, scaled_case, two_level_weight

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")]


def run_raw(xq, pw, m, n, kernel):
    y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")  # poisoned
    _core.gemm_w4a8(xq, None, pw, y, kernel=kernel)
    torch.cuda.synchronize()
    return y.cpu()


def run_f16(xq, xs, pw, m, n, kernel, pad=0):
    """f16 y, rows n + pad apart (pad % 8 != 0: the epilogue's scalar stores); the NaN-poisoned padding must stay."""
    buf = torch.full((m, n + pad), float("nan"), dtype=torch.float16, device="cuda")
    y = buf[:, :n]
    _core.gemm_w4a8(xq, xs, pw, y, kernel=kernel)
    torch.cuda.synchronize()
    if pad:
        assert torch.isnan(buf[:, n:]).all(), f"{kernel} wrote past n"
    return y.cpu()


def ref_int32(xq, qw):
    """x · Wᵀ of the s8 codes in float64 BLAS (exact: |sums| < 2^31 < 2^53), as int64; xq on the CPU."""
    return (xq.double() @ s8_weights(qw).double().T).long()


def problem(fmt, m, n, k, group, seed):
    qw = two_level_weight(fmt, n, k, group, seed=seed)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(seed + 1))
    return qw, pw, xq


# Odd token counts past one and several 128 / 256-token tiles; n with partial 16-row and 128-row tiles; k with a
# one-chunk last stage (k % 128 == 64); g64 and g128 (one parameter copy per stage or two).
@pytest.mark.parametrize("m", [1, 7, 65, 300, 1100])
@pytest.mark.parametrize("n,k,group", [(130, 576, 128), (4103, 640, 64), (272, 1088, 128), (17, 4160, 64)])
def test_persistent_int32_bit_exact(m, n, k, group):
    qw, pw, xq = problem("qoq" if (m + group) % 2 else "liquid", m, n, k, group, seed=m * 5 + n + k + group)
    ref = ref_int32(xq, qw)
    xq = xq.cuda()
    for tokens in (128, 256):
        before = run_raw(xq, pw, m, n, f"sm90:1:{tokens}")
        assert torch.equal(before.long(), ref), f"sm90:1:{tokens}"
        for kernel in (f"sm90p:{tokens}", f"sm90p:{tokens}:3"):
            assert torch.equal(run_raw(xq, pw, m, n, kernel), before), kernel
    assert torch.equal(run_raw(xq, pw, m, n, "sm90p").long(), ref), "sm90p"


# (m, n, k, ctas): k blocks per tile 1 (k = 64: every stage a tile's first and last), 2, 3, 5, 6, 9 and 32, against
# 8 (128 tokens) and 5 (256) pipeline stages, so tile starts land in every slot and phase; g64 at k % 128 == 64 (a
# one-chunk last stage), g128 at k = 4096; tiles not a multiple of the CTAs (some CTAs walk one tile more); one CTA
# walking every tile; more CTAs than tiles (the grid shrinks to the tiles).
PATHS = [(300, 272, 64, 2), (1100, 130, 320, 3), (300, 4103, 1088, 5), (1100, 520, 4096, 7), (65, 1000, 704, 1),
         (7, 17, 192, 5), (257, 260, 576, 4)]


@pytest.mark.parametrize("m,n,k,ctas", PATHS)
@pytest.mark.parametrize("tokens", [128, 256])
def test_persistent_tile_transitions(m, n, k, ctas, tokens):
    group = 64 if k % 128 else 128
    qw, pw, xq = problem("liquid" if m % 2 else "qoq", m, n, k, group, seed=m + n + k + ctas)
    ref = ref_int32(xq, qw)
    xq = xq.cuda()
    kernel = f"sm90p:{tokens}:{ctas}"
    assert torch.equal(run_raw(xq, pw, m, n, kernel).long(), ref), kernel
    # The f16 epilogue stages each tile's 64-token slices in one region, tile after tile: same bits as the
    # one-tile-per-CTA kernel's staging.
    xs = (torch.rand(m, generator=torch.Generator().manual_seed(m)) * 0.01 + 1e-3).cuda()
    for pad in (0, 3):
        y = run_f16(xq, xs, pw, m, n, kernel, pad)
        assert not torch.isnan(y).any(), kernel
        assert torch.equal(y, run_f16(xq, xs, pw, m, n, f"sm90:1:{tokens}", pad)), (kernel, pad)


@pytest.mark.parametrize("m,n,k", [(17, 130, 576), (300, 4103, 2048), (1100, 1000, 1088), (256, 4096, 4096)])
def test_persistent_scaled_f16(m, n, k):
    """Scaled f16 y from quantized activations: bit-identical to 'sm90:1:T', within f16 rounding of float64."""
    pw, xq, xs, ref = scaled_case("liquid", m, n, k, 64)
    for tokens in (128, 256):
        before = run_f16(xq, xs, pw, m, n, f"sm90:1:{tokens}")
        for kernel in (f"sm90p:{tokens}", f"sm90p:{tokens}:5"):
            got = run_f16(xq, xs, pw, m, n, kernel)
            assert torch.equal(got, before), kernel
            assert (got.double() - ref).norm() / ref.norm() < 1e-3, kernel  # f16 output rounding only


def test_persistent_plan_and_names():
    assert _core.gemm_w4a8_sm90_plan(1024, 6144, 4096, kernel="sm90p:128") == (128, 1, 0)
    assert _core.gemm_w4a8_sm90_plan(1024, 6144, 4096, kernel="sm90p:256:5") == (256, 1, 0)
    for m, n, k in [(256, 6144, 4096), (1024, 28672, 4096), (512, 4096, 14336)]:
        tokens, split, head = _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90p")
        assert tokens in (128, 256) and (split, head) == (1, 0)
    qw = two_level_weight("qoq", 64, 128, 64, seed=1)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.zeros(4, 128, dtype=torch.int8, device="cuda")
    y = torch.empty(4, 64, dtype=torch.int32, device="cuda")
    for bad in ("sm90p:64", "sm90p:128:", "sm90p:128:x", "sm90pp", "sm90p:256:12345"):
        with pytest.raises(ValueError, match=f"'sm90p:T:G'.*got '{bad}'"):
            _core.gemm_w4a8(xq, None, pw, y, kernel=bad)
    with pytest.raises(ValueError, match="resident"):
        _core.gemm_w4a8(xq, None, pw, y, kernel="sm90p:128:9999")
    with pytest.raises(ValueError, match="persistent kernel"):  # 'o' + 'p': the one-thread producer is not in it
        _core.gemm_w4a8(xq, None, pw, y, kernel="sm90op")
