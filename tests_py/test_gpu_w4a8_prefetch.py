"""The W4A8 wgmma kernel's 'sm90q...' launches (opt-in): the weight and parameter producers prefetch later stages into
L2, group rows come from a shift, and the unsplit f16 epilogue reads the tile's scales from smem; 'sm90r...' also walks
each weight-row tile's k blocks from its own start (rotated: the int32 sums do not depend on the order). The sums are
checked bit-exact against the CPU reference on odd shapes (token, row and k tails, one-chunk last stages, g64 / g128,
split-K clusters, stream-K with few CTAs), the f16 output against float64 and bit-identical to the same launch without
'q', and the names and plans."""
import pytest
import torch

import lowbit
from lowbit import _core

from test_gpu_w4a8 import check_scaled_f16_same_bits, s8_weights, two_level_weight

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")]

NAMES = ("sm90q", "sm90q:1:128", "sm90q:1:256", "sm90q:2:128", "sm90q:4:256", "sm90qk:128", "sm90qk:256:5",
         "sm90qk:128:3", "sm90r", "sm90r:1:128", "sm90r:1:256", "sm90r:2:128", "sm90r:8:128")

# (m, n, k, group): k % 128 == 64 a one-chunk last stage, n past whole 128-row tiles, m past 128 / 256, k long enough
# that the prefetch distance (8 / 5 stages) lands inside and past the k range.
CASES = [(1, 16, 64, 64), (7, 130, 576, 64), (65, 200, 2112, 128), (129, 520, 704, 128), (300, 96, 1024, 64),
         (257, 4103, 640, 64), (33, 256, 4160, 128)]


@pytest.mark.parametrize("m,n,k,group", CASES)
def test_gemm_w4a8_sm90q_int32_bit_exact(m, n, k, group):
    qw = two_level_weight("qoq" if (m + n) % 2 else "liquid", n, k, group, seed=m * 13 + n + k)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(m + 3 * k))
    ref = xq.long() @ s8_weights(qw).T
    for kernel in NAMES:
        y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")  # poisoned
        _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), ref), kernel


# f16 y: 16-byte rows (vector stores) and rows 2 bytes off (scalar stores); the staged scales give the same bits.
@pytest.mark.parametrize("m,n,k,group", [(17, 130, 576, 64), (300, 520, 2048, 128), (129, 4103, 640, 64)])
@pytest.mark.parametrize("name", ["sm90q:1:128", "sm90q:1:256", "sm90q:2:128", "sm90qk:128", "sm90q", "sm90r:1:128",
                                  "sm90r:1:256", "sm90r:2:128"])
def test_gemm_w4a8_sm90q_scaled_f16(m, n, k, group, name):
    check_scaled_f16_same_bits(name, "sm90" + name[5:], m, n, k, group)  # the same launch untuned


def test_gemm_w4a8_sm90q_plans_and_names():
    """'sm90q...' / 'sm90r...' plan as the name without the letter; the serial, one-thread, persistent and pair launches
    refuse them."""
    for m, n, k in [(256, 6144, 4096), (1024, 4096, 14336), (256, 4096, 4096), (1024, 6144, 4096)]:
        assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90q") == _core.gemm_w4a8_sm90_plan(m, n, k)
        assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90q:1:128") == (128, 1, 0)
        assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90qk:256") == (256, 0, 0)
        assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90r") == _core.gemm_w4a8_sm90_plan(m, n, k)
    qw = two_level_weight("qoq", 64, 128, 64, seed=1)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    x, y = torch.zeros(4, 128, dtype=torch.int8, device="cuda"), torch.empty(4, 64, dtype=torch.int32, device="cuda")
    for bad in ("sm90qs:1:128", "sm90qm", "sm90qp", "sm90oq", "sm90rs:2:256", "sm90rm:128"):
        with pytest.raises(ValueError):
            _core.gemm_w4a8(x, None, pw, y, kernel=bad)


# Full Llama-3-8B layers (qkv at M = 256, o at M = 1024: unsplit one-launch plans on an H200) and an odd one: the
# tuned launches at the automatic plan and at its tile give the same int32 sums and f16 values as the untuned ones.
@pytest.mark.parametrize("m,n,k", [(256, 6144, 4096), (1024, 4096, 4096), (200, 4103, 1088)])
def test_gemm_w4a8_tuned_matches_untuned_at_the_plan(m, n, k):
    qw = two_level_weight("qoq", n, k, 128, seed=m + n + k)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    g = torch.Generator().manual_seed(m + k)
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g).cuda()
    xs = (torch.rand(m, generator=g) * 0.01 + 1e-4).cuda()
    tokens = _core.gemm_w4a8_sm90_plan(m, n, k)[0]
    for dtype, scales in ((torch.int32, None), (torch.float16, xs)):
        outs = []
        for kernel in ("sm90", "sm90q", "sm90r", f"sm90:1:{tokens}", f"sm90q:1:{tokens}", f"sm90r:1:{tokens}"):
            y = torch.full((m, n), -7, dtype=dtype, device="cuda")
            _core.gemm_w4a8(xq, scales, pw, y, kernel=kernel)
            torch.cuda.synchronize()
            outs.append(y.cpu())
        for kernel, out in zip(("sm90q", "sm90r", "1:T", "q:1:T", "r:1:T"), outs[1:]):
            assert torch.equal(outs[0], out), (dtype, kernel)
