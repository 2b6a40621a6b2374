"""Row clusters (sm_90): silu_mul_quantize spreads each of a few rows over a cluster of CTAs (cpp/cuda/rows_cuda.cu),
and sample_rows scans each row with a cluster of 8 (cpp/cuda/sampling_cuda.cu). The quantizer's codes and scales must
be the bytes of the one-block-per-row kernel (_row_cluster_mode 0 vs 1 in one process), and within its rounding of
float64 references: rows 1..300, widths 4096 / 8192 / 14336 and odd widths, s8 and e4m3 codes, PDL on and off. The
quantizing norm (rms_norm_quantize) keeps one block per row in every mode (its cluster form measured slower); its
tests hold both modes to the same bytes and to float64, f16 and f32 weights. The sampler must pick the same tokens (ties:
the lower index, also across chunk boundaries) with the logprob within f32 summation-order noise of one block's and
of a float64 log-softmax. On GPUs before sm_90 both modes take the one-block kernels and the comparisons are
trivially equal (the float64 checks still run)."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


def with_mode(mode, fn):
    prev = _core._row_cluster_mode(mode)
    try:
        out = fn()
        torch.cuda.synchronize()
        return out
    finally:
        _core._row_cluster_mode(prev)


def codes_f64(q, fp8):
    return q.cpu().view(torch.float8_e4m3fn).double() if fp8 else q.cpu().double()


def check_quantized(q, s, y, fp8):
    """q * s recovers the float64 rows y within the quantizer's half step plus the f16 rounding of y."""
    s = s.double().cpu()
    amax = y.abs().amax(dim=1)
    s64 = torch.where(amax > 0, amax / (448.0 if fp8 else 127.0), torch.ones_like(amax))
    assert ((s - s64).abs() <= s64 * 2e-3).all()
    err = (codes_f64(q, fp8) * s[:, None] - y).abs()
    bound = (y.abs() * 2.0**-4 + s[:, None] * 2.0**-9) if fp8 else s[:, None] * 0.5
    bound = bound * 1.001 + y.abs() * 2.0**-9 + 1e-30
    assert (err <= bound).all(), f"max excess {(err - bound).max().item()}"


# ---- rms_norm_quantize ---------------------------------------------------------------------------------------------

NORM_SHAPES = [(1, 4096), (2, 4096), (4, 8192), (1, 8192), (3, 2056), (1, 1000), (16, 4096), (5, 6000), (33, 4096),
               (300, 512), (1, 8), (7, 8191)]


def norm_run(res0, x, w, eps, fp8, mode):
    t, c = res0.shape
    res = res0.clone()
    q = torch.full((t, c), 0x7F, dtype=torch.uint8 if fp8 else torch.int8, device="cuda")  # poison
    s = torch.full((t,), float("nan"), device="cuda")
    with_mode(mode, lambda: _core.rms_norm_quantize(res, x, w, eps, q, s))
    return res, q, s


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize("wdtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("t,c", NORM_SHAPES)
def test_norm_quantize_same_bytes_in_every_mode_and_float64(t, c, wdtype, add, fp8):
    g = torch.Generator().manual_seed(t * 7919 + c + 2 * add + fp8)
    scale = torch.rand(t, 1, generator=g) * 4 + 0.05
    res0 = (torch.randn(t, c, generator=g) * scale).half().cuda()
    x = (torch.randn(t, c, generator=g) * scale).half().cuda() if add else None
    w = (torch.rand(c, generator=g) + 0.5).to(wdtype).cuda()
    eps = 1e-5
    r1, q1, s1 = norm_run(res0, x, w, eps, fp8, mode=0)
    r2, q2, s2 = norm_run(res0, x, w, eps, fp8, mode=1)
    assert torch.equal(r1.cpu(), r2.cpu())
    assert torch.equal(s1.cpu(), s2.cpu())
    assert torch.equal(q1.cpu(), q2.cpu())
    # float64: the residual is res0 + x rounded to f16; the normed rows are quantized within their rounding.
    h = (res0.double() + x.double()).cpu() if add else res0.double().cpu()
    assert torch.equal(r2.cpu(), h.half()) if add else torch.equal(r2.cpu(), res0.cpu())
    h = h.half().double()
    y = h / torch.sqrt((h * h).mean(dim=1, keepdim=True) + eps) * w.double().cpu()
    check_quantized(q2, s2, y, fp8)


# ---- silu_mul_quantize ---------------------------------------------------------------------------------------------

# Past 16384 channels mode 0 takes the two-kernel fallback and mode 1 the cluster kernel with two groups per thread.
SILU_SHAPES = [(1, 14336), (2, 14336), (4, 14336), (16, 14336), (1, 4096), (3, 8192), (1, 2056), (5, 6008),
               (1, 16384), (33, 4104), (300, 256), (1, 28672), (4, 28672), (1, 32768), (5, 16392), (40, 20008)]


def silu_run(gu, fp8, pdl, mode):
    t, i = gu.shape[0], gu.shape[1] // 2
    q = torch.full((t, i), 0x7F, dtype=torch.uint8 if fp8 else torch.int8, device="cuda")
    s = torch.full((t,), float("nan"), device="cuda")
    with_mode(mode, lambda: _core.silu_mul_quantize(gu, q, s, pdl=pdl))
    return q, s


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("t,i", SILU_SHAPES)
def test_silu_mul_quantize_clusters_match_one_block_and_float64(t, i, fp8, pdl):
    g = torch.Generator().manual_seed(t * 131 + i + fp8)
    full = (torch.randn(t, 2 * i + 8, generator=g) * (torch.rand(t, 1, generator=g) * 6 + 0.1)).half().cuda()
    gu = full[:, : 2 * i]  # a row stride past 2I
    if t > 2:
        gu[1].zero_()  # an all-zero row: scale 1, codes 0
    q1, s1 = silu_run(gu, fp8, pdl, mode=0)
    q2, s2 = silu_run(gu, fp8, pdl, mode=1)
    assert torch.equal(s1.cpu(), s2.cpu())
    assert torch.equal(q1.cpu(), q2.cpu())
    g64, u64 = gu[:, :i].double().cpu(), gu[:, i:].double().cpu()
    check_quantized(q2, s2, g64 / (1 + torch.exp(-g64)) * u64, fp8)


@pytest.mark.parametrize("recipe", ["w4a8kv8", "w4a16kv8"])
def test_engine_greedy_identical_with_row_clusters(recipe):
    """A small random Llama decoded greedily under CUDA graphs (batch 1 and 3, the decode steps' few rows) and its
    prefill logits: row clusters forced on (mode 1; inter 2304 takes clusters of 2 in SiLU·mul) give the tokens,
    logprobs and logits of the one-block kernels (mode 0). W4A16 uses neither fused quantizer: a control."""
    from test_gpu_engine import random_llama, run_events
    ids = torch.randint(0, 1000, (61,), generator=torch.Generator().manual_seed(4)).tolist()
    runs = []
    for mode in (0, 1):
        prev = _core._row_cluster_mode(mode)
        try:
            model = random_llama(recipe, "cuda", "f16", seed=11, inter=2304)
            logits = torch.from_dlpack(_core.Engine(model, max_batch_tokens=32).logits(ids)).clone()
            single = run_events(_core.Engine(model, max_batch_tokens=256, cuda_graphs=True), [ids[:20]], 12,
                                dict(temperature=0.0))
            batch = run_events(_core.Engine(model, max_batch_tokens=256, cuda_graphs=True),
                               [ids[:7], ids[:33], ids], 10, dict(temperature=0.0))
            torch.cuda.synchronize()
        finally:
            _core._row_cluster_mode(prev)
        runs.append((logits, single, batch))
    assert not torch.isnan(runs[0][0]).any()
    assert torch.equal(runs[0][0], runs[1][0])
    for a, b in ((runs[0][1], runs[1][1]), (runs[0][2], runs[1][2])):  # same tokens; the sampler's logprob may
        assert [[t for t, _ in s] for s in a] == [[t for t, _ in s] for s in b]  # differ by summation order
        assert max(abs(la - lb) for sa, sb in zip(a, b) for (_, la), (_, lb) in zip(sa, sb)) < 1e-5


# ---- sample_rows ---------------------------------------------------------------------------------------------------

SAMPLE_SHAPES = [(1, 128256), (4, 128256), (16, 128256), (3, 32000), (5, 5003), (2, 7), (1, 1), (300, 1000),
                 (1, 128257)]
PARAMS = [(0.0, 0, 1.0, 0.0), (0.8, 50, 0.95, 0.05), (1.0, 0, 1.0, 0.0), (0.7, 40, 0.9, 0.0)]


def sample(logits, prm, mode):
    n = logits.shape[0]
    tokens = torch.full((n,), -7, dtype=torch.int32, device="cuda")
    logprobs = torch.full((n,), float("nan"), device="cuda")
    with_mode(mode, lambda: _core.sample_rows(logits, prm.view(torch.int64), tokens, logprobs))
    return tokens.cpu(), logprobs.cpu()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("t,v", SAMPLE_SHAPES)
def test_sample_rows_cluster_same_tokens_and_float64_logprob(t, v, dtype):
    g = torch.Generator().manual_seed(t * 977 + v)
    rows = (torch.randn(t, v, generator=g) * (torch.rand(t, 1, generator=g) * 4 + 0.5)).to(dtype)
    chunk = (v + 7) // 8
    for r in range(t):
        kind = r % 5
        if kind == 1 and v > 2:  # a maximum tied across chunks: the lower index wins
            m = rows[r].max() + 1
            for i in sorted({v - 1, min(v - 1, 2 * chunk + 3), min(v - 1, chunk)}):
                rows[r, i] = m
        elif kind == 2 and v > 60:
            rows[r, torch.randint(0, v, (50,), generator=g)] = float("-inf")
        elif kind == 3 and v > 1:  # ties inside one chunk, the best at its last column
            m = rows[r].max() + 1
            rows[r, min(v - 1, chunk - 1)] = m
            rows[r, min(v - 1, chunk + 5)] = m
    if t >= 5:
        rows[4] = float("-inf")  # an all -inf row: token 0, as one block gives
    logits = rows.cuda()
    prm = torch.tensor([list(PARAMS[r % len(PARAMS)]) + [float(torch.rand((), generator=g))] for r in range(t)],
                       dtype=torch.float64).cuda()
    tok0, lp0 = sample(logits, prm, mode=0)
    tok1, lp1 = sample(logits, prm, mode=1)
    assert torch.equal(tok0, tok1)
    finite = torch.isfinite(lp0)
    assert torch.equal(finite, torch.isfinite(lp1))
    assert ((lp0[finite] - lp1[finite]).abs() <= 1e-5 * (1 + lp0[finite].abs())).all()
    ref = torch.log_softmax(rows.double(), dim=1)
    for r in range(t):
        if PARAMS[r % len(PARAMS)][0] == 0.0 and bool(torch.isfinite(rows[r]).any()):
            row = rows[r].double()
            assert int(tok1[r]) == int(torch.nonzero(row == row.max())[0])  # the first index of the maximum
        if bool(torch.isfinite(rows[r]).any()):
            want = float(ref[r, int(tok1[r])])
            assert abs(float(lp1[r]) - want) <= 1e-4 * (1 + abs(want))
