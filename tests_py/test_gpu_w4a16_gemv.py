"""GPU W4A16 register-direct GEMV (gemm_w4a16_gemv_sm80.cu, "gemv[:T[:rDbB]]"): 1-8 tokens, weights streamed into
registers. Against float64 on odd shapes (the same bound as the other W4A16 kernels), against the small kernel (the
same f16 weights, another f32 summation order), with zero points and mins, strided x, NaN-poisoned y, every tile
count, every compiled ring depth / CTAs-per-SM configuration, the k split of long rows, and right after the kernel
that writes x (programmatic dependent launch)."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w4a16 import check, check_same_weights, gemm_forced_mins, half_chunk_problem, random_w4, reference_weight

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


# m: 1..8 (tokens past m read the zero row); n: a partial 16-row tile (17), partial CTAs (4103); k: one chunk,
# a short last g128 group (576), 65 chunks (4160); g32 and g96 put two groups in one chunk; T: CTA tiles.
@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n,k,group", [(17, 64, 64), (272, 576, 128), (4103, 640, 96), (1000, 4160, 32),
                                       (130, 4160, 128)])
@pytest.mark.parametrize("tiles", [0, 1, 8])
def test_gemv_matches_float64(with_mins, m, n, k, group, tiles):
    x, packed, ref, _ = half_chunk_problem(m, n, k, group, with_mins, seed=m + n + k + group + tiles + with_mins)
    kernel = "gemv" if tiles == 0 else f"gemv:{tiles}"
    check(gemm_forced_mins(kernel, x, packed, n, k, group, with_mins), ref)


# Every compiled configuration (gemm_w4a16_gemv_sm80.h: D chunks in flight per warp, B CTAs per SM). Cases: runs of
# one to two chunks per warp (k 640 over 8 slices: shorter than every ring), 8-9 per warp (4160 / 8) and 193 per warp
# (T = 8: one warp streams the whole 12352-k row, the ring wraps many times); g32 / g96 (two groups per chunk: the
# other ring depth) and g64 / g128; mins and zero points; 5 tokens over 14336 k (x split over CTAs whatever the
# budget); y NaN-poisoned with a column past n.
GEMV_CONFIGS = ["r8b2", "r4b2", "r12b1", "r6b3", "r4b4", "r3b5", "r2b6"]


@pytest.mark.parametrize("cfg", GEMV_CONFIGS)
@pytest.mark.parametrize("m,n,k,group,with_mins,tiles", [(8, 17, 640, 96, False, 8), (1, 4103, 4160, 128, False, 1),
                                                         (3, 1000, 4160, 32, True, 1), (5, 272, 14336, 64, True, 2),
                                                         (1, 130, 12352, 32, False, 8), (2, 4103, 640, 96, True, 4)])
def test_gemv_configs_match_float64(cfg, m, n, k, group, with_mins, tiles):
    x, packed, ref, _ = half_chunk_problem(m, n, k, group, with_mins, seed=m + n + k + group + tiles)
    check(gemm_forced_mins(f"gemv:{tiles}:{cfg}", x, packed, n, k, group, with_mins), ref)


def test_gemv_config_plan_and_names():
    """x's shared-memory budget follows the CTAs per SM: 14336 k at one token fits one CTA at 2 per SM, not at 6."""
    assert _core.gemm_w4a16_gemv_plan(1, 4096, 14336, kernel="gemv:1:r8b2") == (1, 1)
    assert _core.gemm_w4a16_gemv_plan(1, 4096, 14336, kernel="gemv:1:r2b6")[1] > 1
    assert _core.gemm_w4a16_gemv_plan(1, 4096, 4096, kernel="gemv:2:r4b4") == (2, 1)
    x, packed, _, _ = half_chunk_problem(1, 32, 128, 64, False, seed=2)
    y = torch.empty(1, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(Exception, match="no configuration r5b5"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="gemv:1:r5b5")
    for bad in ["gemv:1:", "gemv:1:r4", "gemv:1:r4b4x", "gemv:r4b4"]:
        with pytest.raises(ValueError, match="gemv:T:rDbB"):
            _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel=bad)


@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("tiles", [1, 2, 4, 8])
def test_gemv_matches_small_kernel(m, tiles):
    n, k, group = 4103, 4160, 64
    x, packed, ref, ref_abs = half_chunk_problem(m, n, k, group, False, seed=tiles * 31 + m)
    y_small = gemm_forced_mins("small", x, packed, n, k, group, False)
    y = gemm_forced_mins(f"gemv:{tiles}", x, packed, n, k, group, False)
    check(y, ref)
    check_same_weights(y, y_small, ref_abs)


@pytest.mark.parametrize("m,k,group", [(3, 14336, 128), (8, 8192, 64), (4, 12352, 32)])
def test_gemv_splits_long_rows_over_ctas(m, k, group):
    """x of the whole k would not fit in shared memory: the k range is split over CTAs and their partials summed."""
    n = 100
    _, split = _core.gemm_w4a16_gemv_plan(m, n, k)
    assert split > 1
    x, packed, ref, _ = half_chunk_problem(m, n, k, group, True, seed=k + m)
    check(gemm_forced_mins("gemv", x, packed, n, k, group, True), ref)


def test_gemv_plan():
    """One 16-row tile per CTA (8 k slices) unless T is named; a k split over CTAs only when x would not fit."""
    for n, k in [(28672, 4096), (4096, 4096), (4096, 14336), (6144, 4096), (28672, 8192)]:
        assert _core.gemm_w4a16_gemv_plan(1, n, k) == (1, 1), (n, k)
    assert _core.gemm_w4a16_gemv_plan(1, 4096, 4096, kernel="gemv:2") == (2, 1)
    assert _core.gemm_w4a16_gemv_plan(8, 4096, 14336)[1] > 1


def test_gemv_strided_x_and_poisoned_y():
    """x rows ldx apart; y NaN-filled with an odd row stride: every output written, nothing past n."""
    m, n, k, group, ldx = 3, 4103, 1216, 64, 1288
    q, s, z = random_w4(n, k, group, 4)
    packed = tuple(torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, group))
    x_full = torch.randn(m, ldx, generator=torch.Generator().manual_seed(5)).half()
    ref = x_full[:, :k].double() @ reference_weight(q, s, z, k, group).T
    y_full = torch.full((m, n + 3), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    _core.gemm_w4a16(x_full.cuda()[:, :k], *packed, n, k, group, y, kernel="gemv:2")
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:]).all(), "wrote past n"
    assert not torch.isnan(y).any(), "unwritten outputs"
    check(y.cpu().double(), ref)


def test_gemv_reads_x_after_the_kernel_that_wrote_it():
    """Launched as a programmatic dependent, the first weight loads leave before the wait but x must be the value the
    copy before it wrote: eagerly and in a CUDA graph."""
    m, n, k, group = 1, 4096, 4096, 128
    _, packed, _, _ = half_chunk_problem(m, n, k, group, False, seed=9)
    sources = [torch.randn(m, k, generator=torch.Generator().manual_seed(i)).half().cuda() for i in range(6)]
    x = torch.empty(m, k, dtype=torch.float16, device="cuda")
    ys = [torch.empty(m, n, dtype=torch.float16, device="cuda") for _ in sources]

    def step():
        for src, y in zip(sources, ys):
            x.copy_(src)
            _core.gemm_w4a16(x, *packed, n, k, group, y, stream=torch.cuda.current_stream().cuda_stream,
                             kernel="gemv")

    want = []
    for src in sources:
        y = torch.empty(m, n, dtype=torch.float16, device="cuda")
        _core.gemm_w4a16(src, *packed, n, k, group, y, kernel="gemv")
        want.append(y)
    step()
    torch.cuda.synchronize()
    assert all(torch.equal(y, w) for y, w in zip(ys, want))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for y in ys:
        y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(y, w) for y, w in zip(ys, want))


def test_gemv_bad_names_and_token_counts():
    x, packed, _, _ = half_chunk_problem(9, 32, 128, 64, False, seed=1)
    y = torch.empty(9, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="gemv:T.*1, 2, 4 or 8.*gemv:3"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="gemv:3")
    with pytest.raises(Exception, match="1-8 tokens"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="gemv")
