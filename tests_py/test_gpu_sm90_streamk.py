"""GPU stream-K of the wgmma GEMMs (gemm_w4a16_sm90 / gemm_w4a8_sm90's persistent launch: every resident CTA an equal
range of tile x k blocks, split tiles fixed up through a workspace in CTA order). W4A16 vs a float64 reference and the
small mma.sync kernel (the same dequantized weights), W4A8 exact in int32; each fix-up path reached by pinning the CTA
count ('sm90k:T:G'); bit-determinism."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w4a16 import check, check_same_weights, gemm_forced, w4_problem
from test_gpu_w4a8 import s8_weights, scaled_case, two_level_weight

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")]


# m odd and past one and two tiles; n with partial 16-row and 128-row tiles; k with a short last g128 group and 65
# chunks; g64 and g128; y with a padded, NaN-poisoned row stride (gemm_forced checks the padding).
@pytest.mark.parametrize("m", [1, 7, 65, 129, 256, 300])
@pytest.mark.parametrize("n,k,group", [(4103, 576, 64), (272, 4160, 128), (17, 1088, 64)])
def test_streamk_matches_float64_and_small(m, n, k, group):
    x, packed, ref, ref_abs = w4_problem(m, n, k, group, seed=7 * m + n + k)
    y_small = gemm_forced("small", x, packed, n, k, group, 1)
    check(y_small, ref)
    for kernel in ("sm90k:128", "sm90k:256"):
        y = gemm_forced(kernel, x, packed, n, k, group, 1)
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)


# (m, n, k, ctas): one 100-row tile of 9 k blocks over 3 CTAs (an owner, two contributors) and over 9 (one block
# each: eight partials into one owner); 3 row tiles x 10 blocks over 4 CTAs (ranges 7, 8, 7, 8: CTAs covering one
# tile's end and the next one's start); 2 blocks over 5 CTAs (more CTAs than work: empty ranges between the owner and
# its contributor); one CTA walking several whole tiles (the pipeline runs on across segments); two token tiles.
PATHS = [(65, 100, 576, 3), (65, 100, 576, 9), (65, 272, 640, 4), (7, 17, 128, 5), (300, 272, 640, 1),
         (300, 272, 640, 7), (129, 4103, 576, 13)]


@pytest.mark.parametrize("m,n,k,ctas", PATHS)
@pytest.mark.parametrize("tokens", [128, 256])
def test_streamk_every_fixup_path(m, n, k, ctas, tokens):
    x, packed, ref, ref_abs = w4_problem(m, n, k, 64, seed=m + n + k + ctas)
    y_small = gemm_forced("small", x, packed, n, k, 64, 3)
    kernel = f"sm90k:{tokens}:{ctas}"
    y = gemm_forced(kernel, x, packed, n, k, 64, 3)
    check(y, ref)
    check_same_weights(y, y_small, ref_abs)
    # Same partition, same sums in the same order: bit-identical on a second run (the flags were cleared).
    assert torch.equal(y, gemm_forced(kernel, x, packed, n, k, 64, 3)), kernel


@pytest.mark.parametrize("m,n,k", [(256, 6144, 4096), (256, 4096, 4096), (300, 1000, 2048)])
def test_streamk_resident_grid_deterministic(m, n, k):
    """Every resident CTA (the benchmark's launch) on 8B shapes: matches float64, bit-identical across runs."""
    x, packed, ref, _ = w4_problem(m, n, k, 128, seed=m + n + 1)
    for tokens in (128, 256):
        y = gemm_forced(f"sm90k:{tokens}", x, packed, n, k, 128)
        check(y, ref)
        assert torch.equal(y, gemm_forced(f"sm90k:{tokens}", x, packed, n, k, 128))


def test_streamk_plan_and_names():
    tokens, split, head = _core.gemm_w4a16_sm90_plan(256, 6144, 4096, kernel="sm90k:256")
    assert (tokens, split, head) == (256, 0, 0)
    assert _core.gemm_w4a16_sm90_plan(256, 6144, 4096, kernel="sm90k")[1:] == (0, 0)
    # The automatic plan takes stream-K up to 128 tokens; 'sm90n' is the plan without it.
    assert _core.gemm_w4a16_sm90_plan(128, 4096, 14336) == (128, 0, 0)
    assert _core.gemm_w4a16_sm90_plan(128, 4096, 14336, kernel="sm90n")[1] > 0
    x, packed, _, _ = w4_problem(2, 32, 128, 64, seed=1)
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    for bad in ("sm90k:64", "sm90k:128:", "sm90k:128:x", "sm90kk"):
        with pytest.raises(ValueError, match=f"'sm90k:T:G'.*got '{bad}'"):
            _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel=bad)
    with pytest.raises(ValueError, match="resident"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="sm90k:128:9999")


# ---- W4A8 (int32 accumulators: exact whatever the partition) ----
@pytest.mark.parametrize("m,n,k,ctas", [(65, 100, 1152, 3), (65, 100, 1152, 9), (65, 272, 1280, 4), (7, 17, 256, 5),
                                        (300, 272, 1280, 1), (300, 272, 1280, 7), (129, 4103, 576, 13),
                                        (257, 520, 704, 0), (1, 48, 64, 0)])
@pytest.mark.parametrize("tokens", [128, 256])
def test_w4a8_streamk_int32_exact(m, n, k, ctas, tokens):
    qw = two_level_weight("qoq" if m % 2 else "liquid", n, k, 64, seed=m + n + k)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(m + k))
    ref = xq.long() @ s8_weights(qw).T
    kernel = f"sm90k:{tokens}:{ctas}" if ctas else f"sm90k:{tokens}"
    for _ in range(2):  # the second run finds the flags cleared
        y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")  # poisoned
        _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), ref), kernel


@pytest.mark.parametrize("m,n,k", [(17, 130, 576), (300, 256, 2048), (256, 4096, 4096)])
def test_w4a8_streamk_scaled_f16(m, n, k):
    pw, xq, xs, ref = scaled_case("liquid", m, n, k, 64)
    for kernel in ("sm90k:128", "sm90k:256", "sm90k:128:5"):
        y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")  # poisoned
        _core.gemm_w4a8(xq, xs, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        got = y.cpu().double()
        assert not torch.isnan(got).any(), kernel
        assert (got - ref).norm() / ref.norm() < 1e-3, kernel  # f16 output rounding only


def test_w4a8_streamk_plan_and_names():
    assert _core.gemm_w4a8_sm90_plan(256, 6144, 4096, kernel="sm90k:128") == (128, 0, 0)
    # Automatic: stream-K up to 128 tokens and in place of a split-K cluster plan ('sm90n': the plan without it).
    assert _core.gemm_w4a8_sm90_plan(128, 6144, 4096) == (128, 0, 0)
    tokens, split, head = _core.gemm_w4a8_sm90_plan(256, 4096, 14336, kernel="sm90n")
    assert _core.gemm_w4a8_sm90_plan(256, 4096, 14336) == ((tokens, 0, 0) if split > 1 and not head else
                                                           (tokens, split, head))
    qw = two_level_weight("qoq", 48, 128, 64, seed=1)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.zeros(2, 128, dtype=torch.int8, device="cuda")
    y = torch.empty(2, 48, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="'sm90k:T:G'.*got 'sm90k:64'"):
        _core.gemm_w4a8(xq, None, pw, y, kernel="sm90k:64")


def test_w4a8_streamk_two_streams_in_flight():
    """Each stream has its own stream-K scratch: launches queued on two streams at once (many CTAs contributing to
    split tiles on both) stay exact in int32; a CUDA graph captured on one stream replays exactly after the other
    stream's launches."""
    problems = []
    for seed, (m, n, k) in enumerate([(129, 4103, 1152), (65, 2056, 2304)]):
        qw = two_level_weight("liquid", n, k, 64, seed=40 + seed)
        pw = _core.pack_weight(qw, "sm80", "cuda:0")
        xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(seed)).cuda()
        problems.append((xq, pw, (xq.cpu().long() @ s8_weights(qw).T), n))
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [torch.full((p[0].shape[0], p[3]), -7, dtype=torch.int32, device="cuda") for p in problems]
    torch.cuda.synchronize()
    for _ in range(6):  # interleaved: both streams' stream-K launches in flight together
        for (xq, pw, _, _), y, s in zip(problems, outs, streams):
            _core.gemm_w4a8(xq, None, pw, y, stream=s.cuda_stream, kernel="sm90k:128")
    torch.cuda.synchronize()
    for (_, _, ref, _), y in zip(problems, outs):
        assert torch.equal(y.cpu().long(), ref)

    xq, pw, ref, _ = problems[0]
    y = outs[0]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(streams[0]):
        _core.gemm_w4a8(xq, None, pw, y, stream=streams[0].cuda_stream, kernel="sm90k:128")  # scratch exists
        streams[0].synchronize()
        with torch.cuda.graph(graph, stream=streams[0]):
            _core.gemm_w4a8(xq, None, pw, y, stream=streams[0].cuda_stream, kernel="sm90k:128")
    y.fill_(-7)
    xq1, pw1, ref1, _ = problems[1]
    y1 = outs[1]
    with torch.cuda.stream(streams[1]):
        _core.gemm_w4a8(xq1, None, pw1, y1, stream=streams[1].cuda_stream, kernel="sm90k:256")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.cpu().long(), ref)
    assert torch.equal(y1.cpu().long(), ref1)
