"""CPU ops from Python against torch float64 references: linear for every weight format and both
activation modes, norms, elementwise ops, sampling helpers, and the errors bad arguments raise."""
import math

import pytest

import lowbit
from lowbit import _core as C

torch = pytest.importorskip("torch")

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# Half an ulp of each output dtype (one rounding of the f32 result) plus f32 accumulation slack.
OUT_REL = {"f32": 1e-5, "f16": 2.0**-11 + 1e-5, "bf16": 2.0**-8 + 1e-5}


def t(x):
    return torch.from_dlpack(x)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def packed(fmt, n, k, group=32, symmetric=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.1
    # w8 takes a group only when grouped (GGUF Q8_0's layout, float activations); these tests mean per channel
    qw = C.quantize_weight(w, fmt, 0 if fmt == "w8" else group, symmetric)
    return qw, C.pack_weight(qw, "cpu", "cpu")


def s8_weight(qw):
    """The per-group s8 weight of w8 / qoq (q*s - z*s) / liquid ((q*s + a) XOR 0x80), as int64."""
    if qw.format == "w8":
        return t(qw.q).to(torch.int64)
    q = t(qw.q_values).to(torch.int64)
    s = t(qw.scales).to(torch.int64).repeat_interleave(qw.group, dim=1)[:, : qw.k]
    z = t(qw.zeros).to(torch.int64).repeat_interleave(qw.group, dim=1)[:, : qw.k]
    v = (q * s - z * s) if qw.format == "qoq" else ((q * s + z) & 0xFF) ^ 0x80
    v = v & 0xFF
    return torch.where(v >= 128, v - 256, v)


FORMATS = ["f32", "f16", "bf16", "w8", "e4m3", "w4", "qoq", "liquid"]
SHAPES = [(1, 40, 96), (1, 13, 130), (3, 24, 64), (7, 9, 200)]  # (m, n, k): tails, short last group, m > 4


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_linear_float_activations_match_torch(fmt, dt, m, n, k):
    qw, pw = packed(fmt, n, k, symmetric=(m == 3 and fmt == "w4"))
    x = torch.randn(m, k).to(DTYPES[dt])
    bias = torch.randn(n)
    out = poisoned((m, n), DTYPES[dt])
    got = C.linear(x, pw, bias=bias, out=out)
    assert got is out
    w = t(C.dequantize_weight(qw)).double()
    ref = x.double() @ w.T + bias.double()
    mag = x.double().abs() @ w.abs().T + bias.double().abs()
    assert torch.all((out.double() - ref).abs() <= 1e-5 * mag + OUT_REL[dt] * ref.abs() + 1e-7)


@pytest.mark.parametrize("fmt", ["w8", "qoq", "liquid"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_linear_int8_activations_accumulate_exactly(fmt, m, n, k):
    qw, pw = packed(fmt, n, k, group=64)
    x = torch.randn(m, k)
    y = t(C.linear(x, pw, act="int8_per_token"))
    sx = x.abs().amax(dim=1, keepdim=True) / 127
    xq = torch.round(x / sx).clamp(-127, 127).to(torch.int64)  # torch.round is half-to-even
    acc = xq @ s8_weight(qw).T  # exact integer reference
    sw = t(qw.scales if fmt == "w8" else qw.channel_scales).double()
    ref = acc.double() * sx.double() * sw
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-9)


def e4m3_per_token(x):
    """Per-token e4m3 codes (as float64) and scales: s = max|x| / 448 in f32, codes rounded to nearest
    even; clamping first keeps torch's float8 cast (which does not saturate) inside the finite range."""
    s = x.abs().amax(dim=1, keepdim=True) / 448
    q = (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).double()
    return q, s.double()


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_linear_fp8_activations_are_exact_products_summed_in_f32(m, n, k):
    qw, pw = packed("e4m3", n, k)
    x = torch.randn(m, k) * 3
    bias = torch.randn(n)
    y = t(C.linear(x, pw, bias=bias, act="fp8_per_token"))
    xq, sx = e4m3_per_token(x)
    w = t(C.dequantize_weight(qw)).double()  # e4m3 value * channel scale, exact in f32
    ref = sx * (xq @ w.T) + bias.double()
    mag = sx * (xq.abs() @ w.abs().T) + bias.double().abs()
    assert torch.all((y.double() - ref).abs() <= 2e-6 * mag + 1e-7)
    with pytest.raises(NotImplementedError, match="act=fp8_per_token needs an e4m3 weight, got w8"):
        C.linear(x, packed("w8", n, k)[1], act="fp8_per_token")


@pytest.mark.parametrize("fmt", ["qoq", "liquid", "w8"])
def test_linear_fmpq_scales_each_block(fmt):
    m, n, k = 3, 21, 300
    qw, pw = packed(fmt, n, k, group=64)
    x = torch.randn(m, k)
    q, scales = C.quantize_fmpq(x, [8, 4, 8])
    q, scales = t(q), t(scales)
    bias = torch.randn(n)
    y = t(C.linear_fmpq(q, scales, pw, bias=bias))
    w8 = s8_weight(qw)
    ref = torch.zeros(m, n, dtype=torch.float64)
    for b in range(3):
        acc = q[:, b * 128 : (b + 1) * 128].to(torch.int64) @ w8[:, b * 128 : (b + 1) * 128].T  # exact
        ref += acc.double() * scales[:, b : b + 1].double()
    sw = t(qw.scales if fmt == "w8" else qw.channel_scales).double()
    ref = ref * sw + bias.double()
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="linear_fmpq: FMPQ activations need a weight with s8 values"):
        C.linear_fmpq(q, scales, packed("w4", n, k)[1])
    with pytest.raises(ValueError, match=r"linear_fmpq: argument 'x.scales'"):
        C.linear_fmpq(q, scales[:, :2].contiguous(), pw)


def test_linear_allocates_output_and_handles_no_tokens():
    _, pw = packed("w4", 16, 64)
    y = t(C.linear(torch.randn(2, 64, dtype=torch.bfloat16), pw))
    assert y.shape == (2, 16) and y.dtype == torch.bfloat16
    assert t(C.linear(torch.randn(0, 64), pw)).shape == (0, 16)


def test_linear_rejects_bad_arguments():
    _, pw = packed("w4", 16, 64)
    with pytest.raises(ValueError, match=r"linear: argument 'x' \[2, 63\] must have k = 64"):
        C.linear(torch.randn(2, 63), pw)
    with pytest.raises(TypeError, match=r"linear: argument 'y' must have the dtype of 'x' \(f32\), got f16"):
        C.linear(torch.randn(2, 64), pw, out=torch.empty(2, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="linear: argument 'y'"):
        C.linear(torch.randn(2, 64), pw, out=torch.empty(2, 15))
    with pytest.raises(ValueError, match="linear: argument 'bias'"):
        C.linear(torch.randn(2, 64), pw, bias=torch.randn(17))
    with pytest.raises(TypeError, match="linear: argument 'x' must be f32, f16 or bf16, got s32"):
        C.linear(torch.zeros(2, 64, dtype=torch.int32), pw)
    with pytest.raises(NotImplementedError, match="act=int8_per_token needs a w8, qoq or liquid weight, got w4"):
        C.linear(torch.randn(2, 64), pw, act="int8_per_token")
    with pytest.raises(NotImplementedError, match="act=fmpq"):
        C.linear(torch.randn(2, 64), pw, act="fmpq")
    with pytest.raises(ValueError, match="argument 'act' must be one of"):
        C.linear(torch.randn(2, 64), pw, act="int3")


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_rms_norm_and_fused_residual_match_torch(dt):
    x = torch.randn(5, 577).to(DTYPES[dt])
    w = torch.rand(577) + 0.5
    out = poisoned(x.shape, DTYPES[dt])
    C.rms_norm(x, w, 1e-5, out=out)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert torch.allclose(out.double(), ref, rtol=OUT_REL[dt] * 2, atol=1e-6)

    residual = torch.randn(5, 577).to(DTYPES[dt])
    expect_res = (residual.double() + xd).to(DTYPES[dt])
    out2 = t(C.add_rms_norm(residual, x, w, 1e-6))
    assert torch.equal(residual, expect_res)  # updated in place, rounded once to its dtype
    rd = residual.double()
    ref2 = rd * torch.rsqrt(rd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert torch.allclose(out2.double(), ref2, rtol=OUT_REL[dt] * 2, atol=1e-6)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_silu_mul_embedding_softmax_match_torch(dt):
    gu = (torch.randn(3, 2 * 37) * 4).to(DTYPES[dt])
    y = t(C.silu_mul(gu))
    g, u = gu.double().chunk(2, dim=-1)
    assert torch.allclose(y.double(), torch.nn.functional.silu(g) * u, rtol=OUT_REL[dt] * 2, atol=1e-6)

    table = torch.randn(50, 19).to(DTYPES[dt])
    ids = torch.tensor([3, 49, 0, 3], dtype=torch.int32)
    assert torch.equal(t(C.embedding(ids, table)), table[ids.long()])

    x = (torch.randn(4, 1000) * 10).to(DTYPES[dt])
    p = t(C.softmax(x))
    assert p.dtype == torch.float32
    assert torch.allclose(p.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_gather_columns_is_an_exact_gather(dt):
    x = (torch.randn(5, 2 * 131) * 3).to(DTYPES[dt])[:, 7:7 + 131]  # strided rows, odd k
    perm = torch.randperm(131, generator=torch.Generator().manual_seed(2)).to(torch.int32)
    assert torch.equal(t(C.gather_columns(x, perm)), x[:, perm.long()])


def test_gather_columns_errors_name_the_problem():
    x = torch.randn(3, 8)
    with pytest.raises(IndexError, match=r"gather_columns: perm\[2\] = 8 is out of range for rows of 8 columns"):
        C.gather_columns(x, torch.tensor([0, 1, 8, 3, 4, 5, 6, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match="gather_columns: argument 'perm'"):
        C.gather_columns(x, torch.arange(7, dtype=torch.int32))
    with pytest.raises(ValueError, match="must not alias"):
        C.gather_columns(x, torch.arange(8, dtype=torch.int32), out=x)


def test_elementwise_errors_name_op_and_argument():
    with pytest.raises(IndexError, match=r"embedding: ids\[1\] = 50 is out of range for a table of 50 rows"):
        C.embedding(torch.tensor([1, 50], dtype=torch.int32), torch.randn(50, 8))
    with pytest.raises(TypeError, match="embedding: argument 'ids'"):
        C.embedding(torch.tensor([1, 2]), torch.randn(50, 8))
    with pytest.raises(ValueError, match="rms_norm: argument 'weight'"):
        C.rms_norm(torch.randn(2, 8), torch.ones(7))
    with pytest.raises(ValueError, match="silu_mul: argument 'gate_up' must have an even last dimension"):
        C.silu_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="add_rms_norm: arguments 'residual'"):
        C.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8))
    with pytest.raises(ValueError, match="softmax: argument 'x' must be contiguous in its last dimension"):
        C.softmax(torch.randn(8, 4).T)


def test_penalties_follow_hf_and_openai():
    logits = torch.tensor([2.0, -2.0, 0.5, -0.25, 3.0])
    C.apply_penalties(logits, [0, 1, 1, 3, 0], repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    expect = torch.tensor([2.0 / 2 - 0.5 - 0.5, -2.0 * 2 - 0.5 - 0.5, 0.5, -0.25 * 2 - 0.5 - 0.25, 3.0])
    assert torch.allclose(logits, expect)
    with pytest.raises(IndexError, match=r"apply_penalties: history\[0\] = 5 is out of range"):
        C.apply_penalties(logits, [5], repetition_penalty=1.1)


def test_sampling_and_logprobs_match_torch():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(49152, generator=g) * 3
    assert C.sample_token(logits, temperature=0.0) == int(torch.argmax(logits))
    assert C.sample_token(logits, top_k=1, uniform=0.99) == int(torch.argmax(logits))
    # inverse CDF over the descending order: u = 0 gives the most likely token
    assert C.sample_token(logits, temperature=0.7, top_p=0.9, uniform=0.0) == int(torch.argmax(logits))
    # top-k: whatever u, the token is among the k best
    top5 = set(torch.topk(logits, 5).indices.tolist())
    for u in [0.01, 0.3, 0.6, 0.999]:
        assert C.sample_token(logits, top_k=5, uniform=u) in top5
    # plain temperature sampling: u walks the sorted softmax CDF
    probs = torch.softmax(logits.double() / 0.8, -1)
    order = torch.argsort(probs, descending=True, stable=True)
    cdf = torch.cumsum(probs[order], 0)
    for u in [0.05, 0.5, 0.95]:
        expect = int(order[int(torch.searchsorted(cdf, torch.tensor(u, dtype=torch.float64), right=True))])
        assert C.sample_token(logits, temperature=0.8, uniform=u) == expect

    lp = torch.log_softmax(logits.double(), -1)
    assert math.isclose(C.token_logprob(logits, 123), float(lp[123]), abs_tol=1e-5)
    top = C.top_logprobs(logits, 4)
    ref = torch.topk(lp, 4)
    assert [i for i, _ in top] == ref.indices.tolist()
    assert all(math.isclose(v, float(r), abs_tol=1e-5) for (_, v), r in zip(top, ref.values))


def test_sampling_errors():
    logits = torch.randn(10)
    with pytest.raises(ValueError, match="sample_token: temperature must be >= 0"):
        C.sample_token(logits, temperature=-1.0)
    with pytest.raises(ValueError, match=r"sample_token: top_p must be in \(0, 1\]"):
        C.sample_token(logits, top_p=0.0)
    with pytest.raises(ValueError, match=r"sample_token: uniform must be in \[0, 1\)"):
        C.sample_token(logits, uniform=1.0)
    with pytest.raises(IndexError, match="token_logprob: token 10 is out of range for a vocabulary of 10"):
        C.token_logprob(logits, 10)
    with pytest.raises(TypeError, match="sample_token: argument 'logits'"):
        C.sample_token(logits.half())
