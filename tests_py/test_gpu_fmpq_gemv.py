"""GPU COMET W4Ax GEMV (gemm_fmpq kernel "gemv" / "gemv1" / "gemvw": the register-direct W4A8 GEMV over FMPQ
activations, one f32 flush per 128-channel block): the scaled output against a float64 reference built from the
paper's s8 weights and the exact block sums (independent of every kernel), and against the mma.sync FMPQ kernel to
f32 rounding; odd n, k with a one-chunk last block, 1-16 tokens, both widths, k splits (f32 partials), f16 and f32
outputs, poisoned outputs past n; the plan's choice at 1-4 tokens through ops.linear_fmpq; clear refusals."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_fmpq import block_map, blocked_ref, fmpq_codes, nblocks, s8_weights, two_level_weight

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]
SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)

# (fmt, m, n, k, group, int8 fraction): one block (64 k: a one-chunk block), odd n and partial 16-row tiles, k with a
# half last block (576, 1088, 8256), 2-16 tokens, k long enough to split over CTAs (14336 at 8-16 tokens), the wide
# plan's shapes (n >= 5120 at 3-4 tokens, 16400 at one).
CASES = [("qoq", 1, 16, 64, 64, 0.0), ("liquid", 1, 130, 576, 64, 0.2), ("qoq", 2, 200, 1088, 128, 1.0),
         ("liquid", 3, 5130, 640, 64, 0.1), ("qoq", 4, 272, 4096, 128, 0.5), ("liquid", 8, 40, 14336, 64, 0.1),
         ("qoq", 16, 96, 14336, 128, 0.3), ("liquid", 1, 16400, 576, 64, 0.1), ("qoq", 2, 8200, 8256, 128, 0.1),
         ("liquid", 13, 33, 192, 64, 0.7)]


def problem(fmt, m, n, k, group, frac, seed):
    qw = two_level_weight(fmt, n, k, group, seed=seed)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    q, s = fmpq_codes(m, k, block_map(k, frac, seed=seed + 1), seed=seed + 2)
    # float64: sum over blocks of the exact block sum x the token's block scale, times the channel scale
    sums = blocked_ref(q, s8_weights(qw)).double()  # [m, blocks, n]
    ch = torch.from_dlpack(qw.channel_scales).double().reshape(-1)[:n]
    return pw, q, s, (sums * s.double()[:, :, None]).sum(dim=1) * ch[None, :]


def run(pw, q, s, n, kernel, dtype=torch.float16, pad=5):
    m = q.shape[0]
    y_full = torch.full((m, n + pad), float("nan"), dtype=dtype, device="cuda")  # poisoned
    y = y_full[:, :n]
    _core.gemm_fmpq(q.cuda(), s.cuda(), pw, y, kernel=kernel)
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:].cpu()).all(), f"{kernel}: wrote past n"
    return y.cpu()


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("fmt,m,n,k,group,frac", CASES)
def test_gemv_matches_float64_and_the_mma_kernel(fmt, m, n, k, group, frac):
    pw, q, s, ref = problem(fmt, m, n, k, group, frac, seed=m * 11 + n + k)
    want32 = run(pw, q, s, n, "sm80", torch.float32)
    assert rel(want32, ref) < 1e-5
    for kernel in ["gemv", "gemv1", "gemvw"]:
        got32 = run(pw, q, s, n, kernel, torch.float32)
        assert rel(got32, ref) < 1e-5, kernel
        assert rel(got32, want32) < 1e-5, kernel
        got16 = run(pw, q, s, n, kernel)
        assert torch.isfinite(got16).all(), kernel
        assert rel(got16, ref) < 2e-3, kernel  # f16 rounding of the outputs
        # deterministic: the same bits on a second call
        assert torch.equal(got16, run(pw, q, s, n, kernel)), kernel


@pytest.mark.parametrize("fmt,m,n", [("qoq", 1, 4103), ("liquid", 1, 272), ("liquid", 3, 5130), ("qoq", 4, 5130),
                                     ("qoq", 2, 272), ("liquid", 5, 5130)])
def test_linear_fmpq_takes_the_gemv_at_few_tokens(fmt, m, n):
    """The registry names gemm_fmpq_gemv_sm80 on sm_90 at one token and at 2-4 tokens but on down-like layers
    (k >= 1.75 n: here 272 x 1088), gemm_fmpq_sm80 otherwise below 128 tokens, and linear_fmpq's output through the
    plan equals the op's own choice bit for bit."""
    k, group = 1088, 64 if fmt == "liquid" else 128
    pw, q, s, _ = problem(fmt, m, n, k, group, 0.1, seed=31 + m)
    sm = torch.cuda.get_device_capability()
    r = _core.kernels.select_gemm(device="cuda", sm=sm[0] * 10 + sm[1], act="fmpq_mixed", x="s8", y="f16",
                                  weight=fmt, packed="sm80", group=group, n=n, k=k, m=m)
    gemv = SM90 and (m == 1 or (m <= 4 and 4 * k < 7 * n))
    assert (r["kernel"] == "gemm_fmpq_gemv_sm80") == gemv, r
    want = run(pw, q, s, n, "gemv" if gemv else "")
    assert torch.equal(run(pw, q, s, n, ""), want)  # the op's own choice
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.linear_fmpq(q.cuda(), s.cuda(), pw, out=y)  # through the registry
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), want)


def test_gemv_refusals():
    pw, q, s, _ = problem("qoq", 17, 32, 256, 128, 0.0, seed=1)
    y = torch.empty(17, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(NotImplementedError, match="1-16 tokens"):
        _core.gemm_fmpq(q.cuda(), s.cuda(), pw, y, kernel="gemv")
    q1, s1, y1 = q[:1].cuda(), s[:1].cuda(), y[:1]
    with pytest.raises(ValueError, match="picks its own k split"):
        _core.gemm_fmpq(q1, s1, pw, y1, split_k=2, kernel="gemv")
    raw = torch.empty(1, nblocks(256), 32, dtype=torch.int32, device="cuda")
    with pytest.raises(NotImplementedError, match="scaled f16/f32 rows only"):
        _core.gemm_fmpq(q1, None, pw, raw, kernel="gemvw")
    with pytest.raises(ValueError, match="'gemv', 'gemv1' or 'gemvw'"):
        _core.gemm_fmpq(q1, s1, pw, y1, kernel="gemv2")
