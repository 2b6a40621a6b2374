"""GPU: the W4A16 wgmma GEMM's split producer (three threads, one copy kind each) against the one-thread producer it
replaced ('sm90o...' names), bit for bit: the consumers and the sums are the same, only who issues the copies differs.
Every launch kind that shares the producer: one launch (128 / 256 tokens, split-K clusters through DSMEM and L2), the
two-launch plan, stream-K, the wide tile (one launch, split, stream-K); each also against float64."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w4a16 import check, gemm_forced, gemm_forced_mins, half_chunk_problem, w4_problem

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")]

# The new name; its one-thread twin is the same name with 'sm90o' for 'sm90'.
KINDS = ["sm90", "sm90:1:128", "sm90:1:256", "sm90:2:128", "sm90:8:256", "sm90g:2:128", "sm90k:128:5", "sm90k:256",
         "sm90w:1", "sm90w:2", "sm90wk:5"]


def old_name(kernel):
    return "sm90o" + kernel[4:]


# m odd, past one and two 128-token tiles; n: a partial 128-row CTA with a short parameter copy (272), a partial
# 16-row tile (4103, 17); k: a short last g128 group (576), 65 chunks (uneven split ranks); y with a padded row stride.
@pytest.mark.parametrize("m", [1, 7, 65, 129, 300])
@pytest.mark.parametrize("n,k,group", [(272, 576, 128), (4103, 640, 64), (17, 4160, 128), (1000, 2048, 64)])
def test_split_producer_bit_identical_to_one_producer(m, n, k, group):
    x, packed, ref, _ = w4_problem(m, n, k, group, seed=13 * m + n + k + group)
    for kernel in KINDS:
        if kernel == "sm90" and m <= 64:
            continue  # the free plan takes a small tile there, which has no one-thread-producer twin
        y = gemm_forced(kernel, x, packed, n, k, group, y_pad=3)
        check(y, ref)
        y_old = gemm_forced(old_name(kernel), x, packed, n, k, group, y_pad=3)
        assert torch.equal(y, y_old), kernel


# g32 (two parameter rows per stage: the parameter part issues four copies) and mins, and groups straddling stages.
@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("m", [9, 130, 300])
@pytest.mark.parametrize("n,k,group", [(272, 576, 32), (4103, 640, 96)])
def test_split_producer_half_chunk_groups_and_mins(with_mins, m, n, k, group):
    x, packed, ref, _ = half_chunk_problem(m, n, k, group, with_mins, seed=m + n + k + group + 7 * with_mins)
    for kernel in ("sm90:1:128", "sm90:2:256", "sm90k:128:3", "sm90w:2", "sm90wk:3"):
        y = gemm_forced_mins(kernel, x, packed, n, k, group, with_mins)
        check(y, ref)
        assert torch.equal(y, gemm_forced_mins(old_name(kernel), x, packed, n, k, group, with_mins)), kernel


def test_split_producer_two_launch_plan():
    """The automatic plan's two launches (whole unsplit waves, then the rest split) on a shape where it takes them."""
    shapes = [(1024, 6144, 4096), (1024, 14336, 4096), (512, 28672, 4096)]
    picked = [s for s in shapes if _core.gemm_w4a16_sm90_plan(*s, kernel="sm90n")[2] > 0]
    if not picked:
        pytest.skip("no two-launch plan among the shapes on this device")
    m, n, k = picked[0]
    x, packed, ref, _ = w4_problem(m, n, k, 128, seed=5)
    y = gemm_forced("sm90n", x, packed, n, k, 128)
    check(y, ref)
    assert torch.equal(y, gemm_forced("sm90on", x, packed, n, k, 128))


def test_one_producer_names_and_plan():
    """'sm90o...' keeps the same plan (the costs were not refitted unless measured) and the overlapped mainloop only."""
    for m, n, k in [(128, 6144, 4096), (256, 6144, 4096), (256, 4096, 14336), (1024, 28672, 4096)]:
        assert _core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90o") == _core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90")
        assert _core.gemm_w4a16_sm90_plan_rows(m, n, k, kernel="sm90o") == \
            _core.gemm_w4a16_sm90_plan_rows(m, n, k, kernel="sm90")
    assert _core.gemm_w4a16_sm90_plan(256, 6144, 4096, kernel="sm90ow:2") == (128, 2, 0)
    x, packed, _, _ = w4_problem(4, 64, 128, 64, seed=2)
    y = torch.empty(4, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="one-thread producer"):
        _core.gemm_w4a16(x.cuda(), *packed, 64, 128, 64, y, kernel="sm90os:1:128")
