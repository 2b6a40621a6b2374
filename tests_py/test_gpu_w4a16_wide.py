"""GPU: the wide tile of the W4A16 wgmma GEMM (gemm_w4a16_sm90 with 256 weight rows x 128 tokens per CTA, each
consumer warpgroup two m64 wgmmas on one activation tile), forced by name: 'sm90w:S' (one launch, split-K cluster S),
'sm90wk[:G]' (stream-K over G CTAs). Against float64, the small mma.sync kernel (same dequantized weights), and bit
for bit the 128-row kernel at 128 tokens where the sums run in the same order (one launch, same split)."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w4a16 import check, check_same_weights, gemm_forced, gemm_forced_mins, half_chunk_problem, w4_problem

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")]
WIDE = ["sm90w:1", "sm90w:2", "sm90w:4", "sm90w:8", "sm90wk"]


# m odd, one and past one and two 128-token tiles; n: partial 16-row tiles (17, 4103), a partial 256-row CTA
# whose parameter copy is short (272: 17 tiles), a whole one plus a partial one (1000); k: one chunk, a short last
# g128 group (576), 65 chunks (uneven split ranks); y with a padded, NaN-poisoned row stride.
@pytest.mark.parametrize("m", [1, 7, 65, 129, 300])
@pytest.mark.parametrize("n,k,group,y_pad", [(272, 64, 64, 0), (17, 576, 128, 3), (4103, 576, 64, 1),
                                             (272, 4160, 128, 0), (1000, 2048, 64, 2)])
def test_wide_matches_float64_small_and_narrow(m, n, k, group, y_pad):
    x, packed, ref, ref_abs = w4_problem(m, n, k, group, seed=11 * m + n + k + group)
    y_small = gemm_forced("small", x, packed, n, k, group, y_pad)
    check(y_small, ref)
    for kernel in WIDE:
        y = gemm_forced(kernel, x, packed, n, k, group, y_pad)
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)
        if kernel.startswith("sm90w:"):  # same wgmma shape, k ranges and reduction order as 128 rows x 128 tokens
            split = kernel[-1]
            assert torch.equal(y, gemm_forced(f"sm90:{split}:128", x, packed, n, k, group, y_pad)), kernel


# g32 (two groups per chunk), g96 (groups straddling chunks), and w = q*s + m weights.
@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("m", [9, 130, 300])
@pytest.mark.parametrize("n,k,group", [(272, 576, 32), (4103, 640, 96), (17, 4160, 32)])
def test_wide_half_chunk_groups_and_mins(with_mins, m, n, k, group):
    x, packed, ref, ref_abs = half_chunk_problem(m, n, k, group, with_mins, seed=m + n + k + group + 3 * with_mins)
    y_small = gemm_forced_mins("small", x, packed, n, k, group, with_mins)
    for kernel in ("sm90w:1", "sm90w:2", "sm90wk", "sm90wk:5"):
        y = gemm_forced_mins(kernel, x, packed, n, k, group, with_mins)
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)


# Stream-K fix-up paths with 256-row tiles: one tile over several CTAs (an owner and contributors), more CTAs than
# work (empty ranges), ranges crossing tile ends, one CTA walking several tiles, two token tiles.
PATHS = [(65, 100, 576, 3), (65, 300, 576, 9), (65, 600, 640, 4), (7, 17, 128, 5), (300, 600, 640, 1),
         (300, 600, 640, 7), (129, 4103, 576, 13)]


@pytest.mark.parametrize("m,n,k,ctas", PATHS)
def test_wide_streamk_every_fixup_path(m, n, k, ctas):
    x, packed, ref, ref_abs = w4_problem(m, n, k, 64, seed=m + n + k + 5 * ctas)
    y_small = gemm_forced("small", x, packed, n, k, 64, 3)
    kernel = f"sm90wk:{ctas}"
    y = gemm_forced(kernel, x, packed, n, k, 64, 3)
    check(y, ref)
    check_same_weights(y, y_small, ref_abs)
    assert torch.equal(y, gemm_forced(kernel, x, packed, n, k, 64, 3)), kernel


@pytest.mark.parametrize("m,n,k", [(256, 6144, 4096), (256, 4096, 4096), (300, 1000, 2048)])
def test_wide_resident_grid_and_splits_deterministic(m, n, k):
    """The benchmark's launches on 8B shapes: match float64, bit-identical across runs."""
    x, packed, ref, _ = w4_problem(m, n, k, 128, seed=m + n + 3)
    for kernel in ("sm90wk", "sm90w:2", "sm90w"):
        y = gemm_forced(kernel, x, packed, n, k, 128)
        check(y, ref)
        assert torch.equal(y, gemm_forced(kernel, x, packed, n, k, 128)), kernel


def test_wide_plan_and_names():
    assert _core.gemm_w4a16_sm90_plan(256, 6144, 4096, kernel="sm90w:2") == (128, 2, 0)
    assert _core.gemm_w4a16_sm90_plan(256, 6144, 4096, kernel="sm90wk") == (128, 0, 0)
    tokens, split, head = _core.gemm_w4a16_sm90_plan(1024, 6144, 4096, kernel="sm90w")
    assert tokens == 128 and split in (1, 2, 4) and head >= 0
    x, packed, _, _ = w4_problem(2, 32, 128, 64, seed=1)
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    for bad in ("sm90w:3", "sm90w:", "sm90wx", "sm90wk:", "sm90wk:x", "sm90w:2:128"):
        with pytest.raises(ValueError, match=f"'sm90w:S'.*got '{bad}'"):
            _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel=bad)
    with pytest.raises(ValueError, match="at most"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="sm90wk:9999")
