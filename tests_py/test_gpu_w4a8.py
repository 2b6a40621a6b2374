"""GPU W4A8 (QoQ and LiquidQuant weights, int8 per-token activations): int32 accumulators bit-exact
against the s8 weights each paper's formula gives, the scaled f16 output against float64, the
linear op through the kernel registry, and clear errors."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]
SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
# Every kernel choice of gemm_w4a8 that runs here: the mma.sync kernel with split-K 0 (automatic), 1, 3;
# on sm_90 the wgmma kernel with cluster split-K 0 (automatic), 1, 2, 4, 8, each with 128- and 256-token tiles
# ('sm90:S:T') and some with its 16 / 32 / 64-token tiles (two CTAs per SM), its serial mainloop ('sm90s...'), its
# earlier one-thread producer ('sm90o...'), its multicast pairs
# ('sm90m...') and the automatic plan without them ('sm90x').
KERNELS = [("sm80", 0), ("sm80", 1), ("sm80", 3)] + (
    [("sm90", 0)] + [(f"sm90:{s}:{t}", 0) for t in (128, 256) for s in (1, 2, 4, 8)] +
    [("sm90:0:16", 0), ("sm90:1:16", 0), ("sm90:8:16", 0), ("sm90:2:32", 0), ("sm90:0:64", 0), ("sm90:4:64", 0)] +
    [("sm90s:0:128", 0), ("sm90s:2:256", 0), ("sm90s:8:128", 0)] +
    [("sm90o", 0), ("sm90o:1:128", 0), ("sm90o:2:256", 0)] +
    [("sm90m", 0), ("sm90m:128", 0), ("sm90m:256", 0), ("sm90x", 0)] if SM90 else [])


def two_level_weight(fmt, n, k, group, seed, edge=False):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, ::89] *= 8  # outlier channels
    if edge:  # every group spans [-119, 119] after level 1: the largest step (16)
        w = (torch.randint(-119, 120, (n, k), generator=g).float()) / 128
        w[:, ::group] = 119 / 128
        w[:, 1::group] = -119 / 128
    return _core.quantize_weight(w, fmt, group)


def s8_weights(qw):
    """[n, k] int64: QoQ q*s - z*s, LiquidQuant q*s + a - 128, expanded per group (independent of the packer)."""
    q = torch.from_dlpack(qw.q_values).long()
    s = torch.from_dlpack(qw.scales).long().repeat_interleave(qw.group, dim=1)[:, : qw.k]
    z = torch.from_dlpack(qw.zeros).long().repeat_interleave(qw.group, dim=1)[:, : qw.k]
    return q * s - z * s if qw.format == "qoq" else q * s + z - 128


def scaled_case(fmt, m, n, k, group):
    """A packed two-level weight, per-token s8 activations of random f16 rows with their scales, and the float64
    reference of the scaled f16 GEMM: (pw, xq, xs, ref)."""
    qw = two_level_weight(fmt, n, k, group, seed=m + 5)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).half() * 2
    xq = torch.empty(m, k, dtype=torch.int8, device="cuda")
    xs = torch.empty(m, device="cuda")
    _core.quantize_per_token_s8(x.cuda(), xq, xs)
    cs = torch.from_dlpack(qw.channel_scales).double()
    ref = (xq.cpu().double() @ s8_weights(qw).double().T) * xs.cpu().double()[:, None] * cs[None, :]
    return pw, xq, xs, ref


def check_scaled_f16_same_bits(kernel, baseline, m, n, k, group):
    """`kernel` and `baseline` on one scaled case (QoQ weights at even n, LiquidQuant at odd), y rows of n and n + 1
    halves (16-byte rows: vector stores; 2 bytes off: scalar stores), NaN-poisoned: nothing written past n, the f16
    output within its rounding of float64, and the two kernels' bits equal (the same sums and epilogue values)."""
    pw, xq, xs, ref = scaled_case("liquid" if n % 2 else "qoq", m, n, k, group)
    for ldy in (n, n + 1):
        outs = []
        for name in (kernel, baseline):
            buf = torch.full((m, ldy), float("nan"), dtype=torch.float16, device="cuda")
            y = buf[:, :n]
            _core.gemm_w4a8(xq, xs, pw, y, kernel=name)
            torch.cuda.synchronize()
            outs.append(y.cpu())
            if ldy > n:
                assert torch.isnan(buf[:, n:].cpu()).all(), name  # nothing past n
        got = outs[0].double()
        assert not torch.isnan(got).any()
        assert (got - ref).norm() / ref.norm() < 1e-3  # f16 output rounding only
        assert torch.equal(outs[0], outs[1]), f"{kernel} vs {baseline}"


# (k % 128 == 64 leaves the wgmma kernel a one-chunk last stage; n % 128 != 0 a partial weight tile;
# m past 128 and 256 partial token tiles.)
CASES = [("qoq", 1, 16, 64, 64), ("liquid", 7, 130, 576, 64), ("qoq", 65, 200, 576, 128), ("liquid", 300, 96, 1024, 64),
         ("qoq", 16, 4096, 4096, 128), ("liquid", 33, 256, 192, 64), ("qoq", 129, 48, 128, 64),
         ("liquid", 128, 136, 320, 64), ("qoq", 257, 520, 704, 128), ("liquid", 600, 1000, 1088, 64)]


@pytest.mark.parametrize("fmt,m,n,k,group", CASES)
def test_gemm_w4a8_int32_bit_exact(fmt, m, n, k, group):
    qw = two_level_weight(fmt, n, k, group, seed=m * 7 + n + k)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    g = torch.Generator().manual_seed(m + n)
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    ref = xq.long() @ s8_weights(qw).T
    for kernel, split in KERNELS:
        y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")  # poisoned
        _core.gemm_w4a8(xq.cuda(), None, pw, y, split_k=split, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), ref), f"kernel={kernel} split_k={split}"


# The split producer copies one parameter set per 128-k stage when the group is a multiple of 128 (both chunks share
# it) and two otherwise: odd token counts, weight-row and k tails (k % 128 == 64: a one-chunk last stage), groups
# 64 / 128 (the groups the quantizer takes), against the CPU reference, raw int32, bit-exact; 'sm90o' names the
# one-thread producer.
@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m", [1, 7, 65, 300])
@pytest.mark.parametrize("n,k,group", [(130, 576, 128), (4103, 640, 64), (272, 1088, 128), (17, 4160, 128)])
def test_gemm_w4a8_sm90_split_producer_groups_bit_exact(m, n, k, group):
    qw = two_level_weight("qoq" if (m + group) % 2 else "liquid", n, k, group, seed=m * 5 + n + k + group)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(m * 3 + k))
    ref = xq.long() @ s8_weights(qw).T
    for kernel in ("sm90:1:128", "sm90:1:256", "sm90:2:128", "sm90s:1:256", "sm90k:128:5", "sm90k:256",
                   "sm90o:1:256", "sm90ok:128:5"):
        y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")  # poisoned
        _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), ref), kernel


# The 16 / 32 / 64-token tiles (5-64 tokens): every split, token counts that leave a partial token tile or several,
# weight-row and k tails (k % 128 == 64: a one-chunk last stage), groups 64 / 128, raw int32 bit-exact against the CPU
# reference, y poisoned; the automatic plan's tile is the smallest that holds m, and the automatic launch is exact.
@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m", [5, 13, 16, 17, 40, 64, 100])
@pytest.mark.parametrize("n,k,group", [(130, 576, 128), (4103, 640, 64), (17, 4160, 128)])
def test_gemm_w4a8_sm90_small_tiles_bit_exact(m, n, k, group):
    qw = two_level_weight("liquid" if (m + group) % 2 else "qoq", n, k, group, seed=m * 11 + n + k)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(m + 2 * k))
    ref = xq.long() @ s8_weights(qw).T
    kernels = [f"sm90:{s}:{t}" for t in (16, 32, 64) for s in (0, 1, 2, 4, 8)] + ["", "sm90"]
    for kernel in kernels:
        y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")  # poisoned
        _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), ref), kernel
    tokens, split, head = _core.gemm_w4a8_sm90_plan(m, n, k)
    if m <= 64:
        assert tokens == (16 if m <= 16 else 32 if m <= 32 else 64) and split in (1, 2, 4, 8) and head == 0
    else:
        assert tokens == 128  # 65-127 tokens: the 128-token plans as before
    assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90:2:32")[:2] == (32, 2)


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
def test_gemm_w4a8_sm90_small_tiles_scaled_f16():
    """The small tiles' f16 epilogue (staged through smem, y rows 16-byte aligned or not, nothing written past n) within
    f16 rounding of float64 and bit-equal to the 128-token tile's (the same int32 sums and scale products)."""
    for kernel, m in (("sm90:1:16", 9), ("sm90:4:32", 30), ("sm90:2:64", 50), ("sm90:0:16", 16)):
        check_scaled_f16_same_bits(kernel, "sm90:1:128", m, 520 if m % 2 else 515, 704, 64)


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
def test_gemm_w4a8_sm90_small_tiles_refuse_other_launches():
    qw = two_level_weight("qoq", 64, 256, 128, seed=4)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (8, 256), dtype=torch.int8, generator=torch.Generator().manual_seed(4)).cuda()
    y = torch.empty(8, 64, dtype=torch.int32, device="cuda")
    for bad in ("sm90s:1:16", "sm90o:0:32", "sm90q:1:64"):
        with pytest.raises(ValueError, match="16 / 32 / 64-token tiles run the overlapped mainloop"):
            _core.gemm_w4a8(xq, None, pw, y, kernel=bad)
    for bad in ("sm90:1:8", "sm90:1:48", "sm90k:16", "sm90m:64"):
        with pytest.raises(ValueError, match=f"got '{bad}'"):
            _core.gemm_w4a8(xq, None, pw, y, kernel=bad)
    with pytest.raises(ValueError, match="16 / 32 / 64-token tiles"):
        _core.gemm_w4a8_sm90_plan(8, 64, 256, kernel="sm90s:1:16")


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
def test_gemm_w4a8_sm90_one_producer_names():
    """'sm90o...' keeps the earlier producer and the earlier plan; it runs the overlapped mainloop only."""
    for m, n, k in [(256, 6144, 4096), (1024, 6144, 4096), (1024, 28672, 4096)]:
        assert len(_core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90o")) == 3
    assert _core.gemm_w4a8_sm90_plan(1024, 6144, 4096, kernel="sm90o:1:128") == (128, 1, 0)
    qw = two_level_weight("qoq", 64, 128, 64, seed=1)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    with pytest.raises(ValueError, match="one-thread producer"):
        _core.gemm_w4a8(torch.zeros(4, 128, dtype=torch.int8, device="cuda"), None, pw,
                        torch.empty(4, 64, dtype=torch.int32, device="cuda"), kernel="sm90os:1:128")


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
def test_gemm_w4a8_sm90_strided_rows_and_automatic_choice():
    """Activation rows further apart than k (a TMA row stride), and the op-level automatic choice (the
    wgmma kernel from 128 tokens): both bit-exact."""
    m, n, k = 384, 256, 512
    qw = two_level_weight("liquid", n, k, 128, seed=9)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    wide = torch.randint(-127, 128, (m, k + 64), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    ref = wide[:, :k].long() @ s8_weights(qw).T
    for kernel in ("sm90", ""):
        y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")
        _core.gemm_w4a8(wide.cuda()[:, :k], None, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), ref), kernel


# (900, 6100, 7168): on 132 SMs whole unsplit waves, then the rest split (two launches).
@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m,n,k", [(256, 6144, 4096), (256, 4096, 4096), (1024, 6144, 4096), (900, 6100, 7168),
                                   (300, 520, 704)])
def test_gemm_w4a8_sm90_plan_is_what_runs(m, n, k):
    """The cost model's (tokens, split, head) is valid, and the automatic launch is exact (int32, any split)."""
    tokens, split, head = _core.gemm_w4a8_sm90_plan(m, n, k)
    tiles = -(-n // 128) * -(-m // tokens)
    assert tokens in (128, 256) and split in (0, 1, 2, 4) and 0 <= head < tiles and (head == 0 or split > 1)
    assert _core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90:4:256") == (256, 4, 0)  # split 0 above: stream-K
    qw = two_level_weight("qoq", n, k, 128, seed=m + n)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(k))
    y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")
    _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel="")
    torch.cuda.synchronize()
    ref = (xq.cuda().double() @ s8_weights(qw).cuda().double().T).cpu().long()  # |sums| < 2^31: exact in float64
    assert torch.equal(y.cpu().long(), ref)


@pytest.mark.parametrize("fmt", ["qoq", "liquid"])
def test_gemm_w4a8_adversarial_groups_do_not_overflow(fmt):
    qw = two_level_weight(fmt, 64, 256, 64, seed=11, edge=True)
    assert int(torch.from_dlpack(qw.scales).max()) == 16
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    xq = torch.randint(-127, 128, (5, 256), dtype=torch.int8, generator=torch.Generator().manual_seed(2))
    xq[0] = 127  # the largest |sum| per row
    for kernel in ["sm80"] + (["sm90"] if SM90 else []):
        y = torch.full((5, 64), -7, dtype=torch.int32, device="cuda")
        _core.gemm_w4a8(xq.cuda(), None, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu().long(), xq.long() @ s8_weights(qw).T), kernel


@pytest.mark.parametrize("fmt,m,n,k,group", [("qoq", 1, 64, 128, 128), ("liquid", 17, 130, 576, 64),
                                             ("qoq", 300, 256, 2048, 128)])
def test_gemm_w4a8_scaled_f16(fmt, m, n, k, group):
    pw, xq, xs, ref = scaled_case(fmt, m, n, k, group)
    for kernel in ["sm80"] + (["sm90", "sm90:2", "sm90m", "sm90x"] if SM90 else []):
        y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        _core.gemm_w4a8(xq, xs, pw, y, kernel=kernel)
        torch.cuda.synchronize()
        got = y.cpu().double()
        assert not torch.isnan(got).any(), kernel
        assert (got - ref).norm() / ref.norm() < 1e-3, kernel  # f16 output rounding only


@pytest.mark.parametrize("fmt,m", [("qoq", 23), ("liquid", 23), ("qoq", 300), ("liquid", 130)])
def test_linear_w4a8_through_the_registry_matches_the_cpu_op(fmt, m):
    """ops.linear with act=int8_per_token on the GPU (the registry picks gemm_w4a8_sm80, or from 17 tokens on sm_90
    gemm_w4a8_sm90) vs the CPU op on the same quantized weight: both quantize the same
    activations per token, so they differ only by f16 vs f32 rounding of the output and the odd int8
    code that flips at a rounding boundary."""
    n, k = 136, 320
    qw = two_level_weight(fmt, n, k, 64, seed=3)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(4))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5))
    y_cpu = torch.empty(m, n)
    _core.linear(x, _core.pack_weight(qw, "cpu"), bias, y_cpu, act="int8_per_token")
    y_gpu = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.linear(x.half().cuda(), _core.pack_weight(qw, "sm80", "cuda:0"), bias.half().cuda(), y_gpu,
                 act="int8_per_token")
    torch.cuda.synchronize()
    err = (y_gpu.cpu().double() - y_cpu.double()).norm() / y_cpu.double().norm()
    assert err < 2e-2, err


def test_gemm_w4a8_bad_inputs():
    qw = two_level_weight("qoq", 16, 128, 64, seed=1)
    pw = _core.pack_weight(qw, "sm80", "cuda:0")
    with pytest.raises(ValueError, match="'xq' has 64 features but the weight expects k=128"):
        _core.gemm_w4a8(torch.zeros(4, 64, dtype=torch.int8, device="cuda"), None, pw,
                        torch.empty(4, 16, dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match="'y' must be f16 .* or s32"):
        _core.gemm_w4a8(torch.zeros(4, 128, dtype=torch.int8, device="cuda"), None, pw,
                        torch.empty(4, 16, device="cuda"))
    with pytest.raises(TypeError, match="'xq' must have dtype s8"):
        _core.gemm_w4a8(torch.zeros(4, 128, device="cuda"), None, pw,
                        torch.empty(4, 16, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="x_scale"):  # a scaled output needs the per-token scales
        _core.gemm_w4a8(torch.zeros(4, 128, dtype=torch.int8, device="cuda"), None, pw,
                        torch.empty(4, 16, dtype=torch.float16, device="cuda"))
    w4 = _core.pack_weight(_core.quantize_weight(torch.randn(16, 128), "w4", 64), "sm80", "cuda:0")
    with pytest.raises(ValueError, match="'w' must be a qoq or liquid weight packed for sm80"):
        _core.gemm_w4a8(torch.zeros(4, 128, dtype=torch.int8, device="cuda"), None, w4,
                        torch.empty(4, 16, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="'kernel' must be '', 'sm80', 'sm90'"):
        _core.gemm_w4a8(torch.zeros(4, 128, dtype=torch.int8, device="cuda"), None, pw,
                        torch.empty(4, 16, dtype=torch.int32, device="cuda"), kernel="sm100")
    with pytest.raises(ValueError, match="the split in 'sm90:S' must be 1, 2, 4 or 8"):
        _core.gemm_w4a8(torch.zeros(4, 128, dtype=torch.int8, device="cuda"), None, pw,
                        torch.empty(4, 16, dtype=torch.int32, device="cuda"), kernel="sm90:3")
    if not SM90:
        with pytest.raises(NotImplementedError, match="sm90 kernel needs an sm_90 device"):
            _core.gemm_w4a8(torch.zeros(4, 128, dtype=torch.int8, device="cuda"), None, pw,
                            torch.empty(4, 16, dtype=torch.int32, device="cuda"), kernel="sm90")


@pytest.mark.parametrize("recipe,algo,opts", [("w4a8kv4", "qoq", {}), ("w4a8g64-liquid", "liquid", {"alpha": 0.5})])
def test_quantized_directory_runs_on_the_gpu_like_the_cpu(tmp_path, recipe, algo, opts):
    """`lowbit quantize` output for the W4A8 recipes loads on the GPU (weights packed for the W4A8
    kernel at load; the plan names the one-token GEMV on sm_90) and its logits match the CPU engine's on the same
    directory. intermediate 320 is
    not a multiple of 128: the g128 QoQ groups of down_proj end short."""
    from lowbit.llm import LLM
    from lowbit.quantize import api
    from lowbit.quantize.testing import tiny_llama

    calib = tmp_path / "calib.txt"
    calib.write_text(" ".join(["license", "software", "free", "copy", "the", "of", "program"] * 80), encoding="utf-8")
    out = tmp_path / recipe
    api.quantize(None, recipe, algo, out, calib=[calib], num_sequences=4, seq_len=48, progress=False,
                 loaded=tiny_llama(seed=3, hidden=256, intermediate=320, heads=4, kv_heads=2, layers=2), **opts)
    # 161 tokens: the prefill runs the m128+ plan (the wgmma kernel on sm_90).
    ids = torch.randint(0, 256, (161,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = torch.from_dlpack(LLM(out, device="cpu", progress=False).engine.logits(ids)).double()
    gpu = LLM(out, device="cuda", progress=False)
    gate_up = {p["role"]: p["kernel"] for p in gpu.model.plan() if p["role"].startswith("linear.gate_up")}
    large = "gemm_w4a8_sm90" if SM90 else "gemm_w4a8_sm80"
    few = "gemm_w4a8_gemv_sm80" if SM90 else "gemm_w4a8_sm80"  # the register-direct GEMV at 1-4 tokens on sm_90

    def expected(role):  # on sm_90 the wgmma kernel from 17 tokens (this model's layers are narrow: mma.sync at 5-16)
        return few if role.endswith((" m1", " m2-4")) else "gemm_w4a8_sm80" if role.endswith(" m5-16") else large
    assert gate_up and all(k == expected(r) for r, k in gate_up.items()), gate_up
    got = torch.from_dlpack(gpu.engine.logits(ids)).double()
    assert torch.isfinite(got).all()
    err = float((got - ref).norm() / ref.norm())
    assert err < 4e-2, err
