"""GPU: the W4A16 wgmma GEMM's split-K reduction through L2 ('sm90g...': partials in a per-CTA workspace slot,
published by the cluster barrier) against the one through cluster shared memory ('sm90c...'): the same sums in the
same order, so bit-identical, and both match float64 and the small mma.sync kernel."""
import pytest
import torch

import lowbit
from test_gpu_w4a16 import check, check_same_weights, gemm_forced, gemm_forced_mins, half_chunk_problem, w4_problem

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")]
SPLITS = [f":{s}:{t}" for t in (128, 256) for s in (2, 4, 8)] + ["w:2", "w:4", "w:8"]


# m: one token, partial and several token tiles; n: partial 16-row tiles and partial 128/256-row CTAs; k: one chunk
# (a forced split above it shrinks), a short last group, 65 chunks (uneven ranks); y with a padded row stride.
@pytest.mark.parametrize("m", [1, 65, 129, 300])
@pytest.mark.parametrize("n,k,group,y_pad", [(4103, 576, 64, 1), (272, 4160, 128, 0), (17, 1088, 64, 3),
                                             (1000, 64, 64, 2)])
def test_l2_reduce_bit_identical_to_dsmem(m, n, k, group, y_pad):
    x, packed, ref, ref_abs = w4_problem(m, n, k, group, seed=13 * m + n + k)
    y_small = gemm_forced("small", x, packed, n, k, group, y_pad)
    for tail in SPLITS:
        y_g = gemm_forced("sm90g" + tail, x, packed, n, k, group, y_pad)
        check(y_g, ref)
        check_same_weights(y_g, y_small, ref_abs)
        assert torch.equal(y_g, gemm_forced("sm90c" + tail, x, packed, n, k, group, y_pad)), tail
        assert torch.equal(y_g, gemm_forced("sm90" + tail, x, packed, n, k, group, y_pad)), tail


@pytest.mark.parametrize("with_mins", [False, True])
def test_l2_reduce_half_chunk_groups_and_mins(with_mins):
    x, packed, ref, _ = half_chunk_problem(300, 4103, 640, 96, with_mins, seed=41 + with_mins)
    for tail in (":2:128", ":4:256", "w:2"):
        y_g = gemm_forced_mins("sm90g" + tail, x, packed, 4103, 640, 96, with_mins)
        check(y_g, ref)
        assert torch.equal(y_g, gemm_forced_mins("sm90c" + tail, x, packed, 4103, 640, 96, with_mins)), tail


@pytest.mark.parametrize("m,n,k", [(256, 6144, 4096), (256, 4096, 14336), (1024, 6144, 4096)])
def test_l2_reduce_8b_shapes_and_graph_capture(m, n, k):
    """The automatic plan (split at M = 256, two launches at qkv 1024) with each reduction; then inside a CUDA graph
    captured on a fresh stream (no workspace there yet: the launch falls back to cluster shared memory, same bits)."""
    x, packed, ref, _ = w4_problem(m, n, k, 128, seed=m + n + 9)
    y_g = gemm_forced("sm90g", x, packed, n, k, 128)
    check(y_g, ref)
    assert torch.equal(y_g, gemm_forced("sm90c", x, packed, n, k, 128))
    xc = x.cuda()
    y = torch.empty(m, n, dtype=torch.float16, device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        lowbit._core.gemm_w4a16(xc, *packed, n, k, 128, y, 0, None, stream.cuda_stream, kernel="sm90g")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.cpu().double(), y_g)


def test_l2_reduce_names():
    x, packed, _, _ = w4_problem(2, 32, 128, 64, seed=1)
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    for bad in ("sm90g:3", "sm90gx", "sm90cs:2", "sm90g:2:64"):
        with pytest.raises(ValueError, match=f"got '{bad}'"):
            lowbit._core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel=bad)
