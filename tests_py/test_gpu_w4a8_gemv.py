"""GPU register-direct W4A8 GEMV (gemm_w4a8 kernel "gemv[:rDbB]", 1-16 tokens): the raw int32 accumulators bit-exact
against the s8 weights each paper's formula gives (independent of the packer) and against the mma.sync kernel, the
scaled f16 output bit-exact against the mma.sync kernel and close to float64, for QoQ and LiquidQuant weights on odd
n and k, group tails, k splits over CTAs, every compiled configuration, strided x, poisoned outputs, x written by the
kernel before it (programmatic dependent launch, eager and in a CUDA graph), the registry's choice and clear errors."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w4a8 import s8_weights, two_level_weight

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]
SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
CONFIGS = ["r4b4", "r6b3", "r8b2", "r6b4", "r3b5"]

# (fmt, m, n, k, group): one chunk (7 of 8 k slices empty), partial 16-row tiles (n % 16 != 0), group tails (k % group
# == 64), 2-8 tokens, k longer than one CTA's x budget (split over CTAs: 8 tokens at k 8192 under r4b4, 14336 under the
# automatic r6b3), the 8B down shape; 9-16 tokens (the second 8-token tile: a zero row for its columns past m at 9-15,
# none at 16; 16 tokens at k 4096 unsplit under r6b3, at 14336 split).
CASES = [("qoq", 1, 16, 64, 64), ("liquid", 1, 130, 576, 64), ("qoq", 1, 200, 576, 128), ("liquid", 3, 4103, 640, 64),
         ("qoq", 8, 272, 1088, 128), ("liquid", 5, 96, 8256, 64), ("qoq", 8, 40, 14336, 128),
         ("liquid", 2, 17, 192, 64), ("qoq", 1, 4096, 14336, 128), ("liquid", 7, 33, 8192, 128),
         ("qoq", 9, 130, 576, 64), ("liquid", 12, 4103, 640, 64), ("qoq", 15, 33, 8256, 128),
         ("liquid", 16, 272, 4096, 128), ("qoq", 16, 40, 14336, 128), ("liquid", 13, 17, 64, 64)]


def problem(fmt, m, n, k, group, seed):
    qw = two_level_weight(fmt, n, k, group, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    xs = torch.rand(m, generator=g) * 0.05 + 0.01
    return qw, _core.pack_weight(qw, "sm80", "cuda:0"), xq, xs


def run(pw, xq, xs, n, kernel, raw, split_k=0, ldy_pad=0, ldx_pad=0):
    """gemm_w4a8 into a poisoned output `ldy_pad` columns wider than n (checks nothing past n is written)."""
    m, k = xq.shape
    x_full = torch.zeros(m, k + ldx_pad, dtype=torch.int8)
    x_full[:, :k] = xq
    x = x_full.cuda()[:, :k]
    if raw:
        y_full = torch.full((m, n + ldy_pad), -7, dtype=torch.int32, device="cuda")
    else:
        y_full = torch.full((m, n + ldy_pad), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    _core.gemm_w4a8(x, None if raw else xs.cuda(), pw, y, split_k=split_k, kernel=kernel)
    torch.cuda.synchronize()
    if ldy_pad:
        pad = y_full[:, n:].cpu()
        assert (pad == -7).all() if raw else torch.isnan(pad).all(), f"{kernel}: wrote past n"
    return y.cpu()


@pytest.mark.parametrize("fmt,m,n,k,group", CASES)
def test_gemv_int32_bit_exact(fmt, m, n, k, group):
    qw, pw, xq, xs = problem(fmt, m, n, k, group, seed=m * 7 + n + k)
    ref = xq.long() @ s8_weights(qw).T
    # '' = the op's choice: the gemv at 1-4 tokens on sm_90, its width by shape; 'gemvw': 4 weight tiles per CTA (n past
    # the last tile: idle warps), k split over CTAs
    for kernel in ["gemv", "gemvw"] + ([""] if m <= 4 else []):
        got = run(pw, xq, xs, n, kernel, raw=True, ldy_pad=5)
        assert torch.equal(got.long(), ref), kernel
    assert torch.equal(run(pw, xq, xs, n, "sm80", raw=True).long(), ref)


@pytest.mark.parametrize("fmt,m,n,k,group", CASES)
def test_gemv_scaled_matches_sm80_bit_for_bit_and_float64(fmt, m, n, k, group):
    qw, pw, xq, xs = problem(fmt, m, n, k, group, seed=m + n * 3 + k)
    got = run(pw, xq, xs, n, "gemv", raw=False, ldy_pad=3)
    assert not torch.isnan(got).any(), "unwritten outputs"
    assert torch.equal(got, run(pw, xq, xs, n, "sm80", raw=False))
    assert torch.equal(got, run(pw, xq, xs, n, "gemvw", raw=False, ldy_pad=3))
    cs = torch.from_dlpack(qw.channel_scales).double()
    ref = (xq.double() @ s8_weights(qw).double().T) * xs.double()[:, None] * cs[None, :]
    assert (got.double() - ref).norm() / ref.norm() < 1e-3  # f16 output rounding only


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("fmt,m,n,k,group", [("liquid", 1, 130, 576, 64), ("qoq", 8, 272, 8192, 128),
                                              ("qoq", 1, 48, 14336, 128), ("liquid", 16, 130, 1088, 64),
                                              ("qoq", 11, 48, 8192, 128)])
def test_gemv_configs_int32_bit_exact(cfg, fmt, m, n, k, group):
    qw, pw, xq, xs = problem(fmt, m, n, k, group, seed=n + k)
    want = xq.long() @ s8_weights(qw).T
    assert torch.equal(run(pw, xq, xs, n, f"gemv:{cfg}", raw=True, ldy_pad=2).long(), want)
    assert torch.equal(run(pw, xq, xs, n, f"gemvw:{cfg}", raw=True, ldy_pad=2).long(), want)


def test_gemv_strided_x():
    qw, pw, xq, xs = problem("liquid", 4, 136, 1024, 64, seed=11)
    got = run(pw, xq, xs, 136, "gemv", raw=True, ldx_pad=48)
    assert torch.equal(got.long(), xq.long() @ s8_weights(qw).T)


def test_gemv_reads_x_after_the_kernel_that_wrote_it():
    """Launched as a programmatic dependent of the quantizer, the first weight loads leave before the wait but x must
    be the codes the quantizer wrote: eagerly and in a CUDA graph."""
    m, n, k = 1, 4096, 4096
    qw, pw, _, _ = problem("qoq", m, n, k, 128, seed=5)
    sources = [torch.randn(m, k, generator=torch.Generator().manual_seed(i)).half().cuda() for i in range(6)]
    xq = torch.empty(m, k, dtype=torch.int8, device="cuda")
    xs = torch.empty(m, device="cuda")
    ys = [torch.empty(m, n, dtype=torch.int32, device="cuda") for _ in sources]

    def step():
        s = torch.cuda.current_stream().cuda_stream
        for src, y in zip(sources, ys):
            _core.quantize_per_token_s8(src, xq, xs, s)
            _core.gemm_w4a8(xq, None, pw, y, stream=s, kernel="gemv")

    w8 = s8_weights(qw).T
    want = []
    for src in sources:
        q, sc = torch.empty(m, k, dtype=torch.int8, device="cuda"), torch.empty(m, device="cuda")
        _core.quantize_per_token_s8(src, q, sc)
        torch.cuda.synchronize()
        want.append((q.cpu().long() @ w8).int())
    step()
    torch.cuda.synchronize()
    assert all(torch.equal(y.cpu(), w) for y, w in zip(ys, want))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for y in ys:
        y.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(y.cpu(), w) for y, w in zip(ys, want))


@pytest.mark.parametrize("fmt,m,n", [("qoq", 1, 4103), ("liquid", 1, 16400), ("liquid", 2, 8200), ("qoq", 3, 5130),
                                     ("liquid", 4, 4103), ("qoq", 5, 5130)])
def test_linear_at_few_tokens_runs_the_gemv_choice(fmt, m, n):
    """ops.linear with int8_per_token activations at 1-4 tokens: the registry names gemm_w4a8_gemv_sm80 on sm_90 (the
    mma.sync kernel elsewhere and from 5 tokens on layers under 16384 rows), and its f16 output is the quantizer + the
    op's own choice bit for bit
    (the shapes reach both widths: one tile at 1 token and 4103 rows, the wide plan at 16400 / 8200 x 8256 / 5130)."""
    k = 8256 if m == 2 else 1088
    qw, pw, _, _ = problem(fmt, m, n, k, 64 if fmt == "liquid" else 128, seed=21 + m)
    sm = torch.cuda.get_device_capability()
    r = _core.kernels.select_gemm(device="cuda", sm=sm[0] * 10 + sm[1], act="int8_per_token", x="f16", y="f16",
                                  weight=fmt, packed="sm80", group=qw.group, n=n, k=k, m=m)
    wide = n >= 16384  # at 5-16 tokens the wgmma kernel's 16-token tile on layers this wide, else mma.sync
    assert r["kernel"] == ("gemm_w4a8_sm80" if not SM90 else "gemm_w4a8_gemv_sm80" if m <= 4 else
                           "gemm_w4a8_sm90" if wide else "gemm_w4a8_sm80"), r
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(22)).half().cuda()
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.linear(x, pw, None, y, act="int8_per_token")
    xq, xs = torch.empty(m, k, dtype=torch.int8, device="cuda"), torch.empty(m, device="cuda")
    _core.quantize_per_token_s8(x, xq, xs)
    want = torch.empty(m, n, dtype=torch.float16, device="cuda")
    _core.gemm_w4a8(xq, xs, pw, want, kernel="")  # the op's automatic choice: the registry's rule
    torch.cuda.synchronize()
    assert torch.equal(y, want)


def test_gemv_bad_names_and_token_counts():
    qw, pw, xq, _ = problem("qoq", 17, 32, 128, 64, seed=1)
    y = torch.empty(17, 32, dtype=torch.int32, device="cuda")
    with pytest.raises(Exception, match="1-16 tokens"):
        _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel="gemv")
    y1 = torch.empty(1, 32, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="no configuration r5b5"):
        _core.gemm_w4a8(xq[:1].cuda(), None, pw, y1, kernel="gemv:r5b5")
    with pytest.raises(ValueError, match="'gemv' takes an optional ':rDbB'"):
        _core.gemm_w4a8(xq[:1].cuda(), None, pw, y1, kernel="gemv:4")
    with pytest.raises(ValueError, match="'gemv' takes an optional ':rDbB'"):
        _core.gemm_w4a8(xq[:1].cuda(), None, pw, y1, kernel="gemvw:4")
