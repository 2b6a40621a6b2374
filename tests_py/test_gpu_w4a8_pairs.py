"""The W4A8 wgmma kernel's multicast pairs ('sm90m', 'sm90m:T'; gemm_w4a8_sm90_pair_kernel): two CTAs on neighbouring
weight-row tiles share one activation tile, each loading half of it for both. The int32 sums are checked bit-exact
against the CPU reference on odd shapes (one row tile: a pair with a spare CTA; odd row-tile counts; token, row and k
tails; g64 / g128), the f16 epilogue against float64 and bit-identical to the unpaired one-launch kernel, and the
names and plans ('sm90x': the automatic plan without pairs)."""
import pytest
import torch

import lowbit
from lowbit import _core

from test_gpu_w4a8 import check_scaled_f16_same_bits, s8_weights, two_level_weight

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="the wgmma kernel's pairs need sm_90")]


# (m, n, k, group): n <= 128 one row tile (a spare CTA in the pair), 520 / 4103 odd row-tile counts, k % 128 == 64 a
# one-chunk last stage, m past 64 / 128 / 256 partial halves and tiles.
CASES = [(1, 16, 64, 64), (7, 130, 576, 64), (65, 200, 576, 128), (129, 520, 704, 128), (300, 96, 1024, 64),
         (257, 4103, 640, 64), (600, 272, 1088, 128), (33, 256, 4160, 128)]


@pytest.mark.parametrize("m,n,k,group", CASES)
def test_gemm_w4a8_pairs_int32_bit_exact(m, n, k, group):
    qw = two_level_weight("qoq" if (m + n) % 2 else "liquid", n, k, group, seed=m * 11 + n + k)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(m + 2 * k))
    ref = xq.long() @ s8_weights(qw).T
    for kernel in ("sm90m", "sm90m:128", "sm90m:256", "sm90x", "sm90"):
        y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")  # poisoned
        _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), ref), kernel


# f16 y through the staged epilogue: 16-byte rows (vector stores) and a y whose rows are 2 bytes off (scalar stores).
@pytest.mark.parametrize("m,n,k,group", [(17, 130, 576, 64), (300, 520, 2048, 128), (129, 4103, 640, 64)])
@pytest.mark.parametrize("tokens", [128, 256])
def test_gemm_w4a8_pairs_scaled_f16(m, n, k, group, tokens):
    check_scaled_f16_same_bits(f"sm90m:{tokens}", f"sm90:1:{tokens}", m, n, k, group)  # the unpaired launch


def test_gemm_w4a8_pairs_plans_and_names():
    """'sm90m:T' is one unsplit launch at T tokens; 'sm90x' is the plan without pairs; bad names raise."""
    for m, n, k in [(256, 6144, 4096), (1024, 4096, 14336), (256, 4096, 4096)]:
        assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90m:128") == (128, 1, 0)
        assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90m:256") == (256, 1, 0)
        tokens, split, head = _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90m")
        assert tokens in (128, 256) and split == 1 and head == 0
        assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90x") == _core.gemm_w4a8_sm90_plan(m, n, k)
    qw = two_level_weight("qoq", 64, 128, 64, seed=1)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    x, y = torch.zeros(4, 128, dtype=torch.int8, device="cuda"), torch.empty(4, 64, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="multicast pairs"):
        _core.gemm_w4a8(x, None, pw, y, kernel="sm90m:64")
    with pytest.raises(ValueError, match="multicast pairs"):
        _core.gemm_w4a8(x, None, pw, y, kernel="sm90om")
