"""GPU FP8 W8A8 (e4m3 x e4m3 on tensor cores, sm_89+): the per-token e4m3 quantizer (bit-exact against
torch's float8 rounding) and the GEMM (raw f32 sums of exact products against float64)."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


def has_fp8_mma():
    return lowbit.cuda_available() and torch.cuda.get_device_capability() >= (8, 9)


needs_fp8 = pytest.mark.skipif(not has_fp8_mma(), reason="needs compute capability 8.9+")


def reference_quantize(x):
    """s = max|x| / 448 in f32 (1 for a zero row); codes rounded to nearest even. Clamping first keeps
    torch's float8 cast (which does not saturate) in range, as the kernel's saturating cast is."""
    amax = x.float().abs().amax(dim=1)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (x.float() / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def random_e4m3(shape, seed, spread=60.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * spread).clamp(-448, 448).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("m,k", [(1, 64), (5, 200), (33, 1000), (2, 4096)])
def test_quantize_per_token_e4m3_bit_exact(m, k):
    g = torch.Generator().manual_seed(m * 7 + k)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 30).half()
    x[0, : min(k, 5)] = 0
    if m > 2:
        x[2] = 0  # an all-zero row: scale 1, codes 0
    q = torch.full((m, k), 0x7F, dtype=torch.uint8, device="cuda")  # poison (NaN codes)
    s = torch.full((m,), float("nan"), device="cuda")
    _core.quantize_per_token_e4m3(x.cuda(), q, s)
    q_ref, s_ref = reference_quantize(x)
    assert torch.equal(s.cpu(), s_ref)
    assert torch.equal(q.cpu(), q_ref.view(torch.uint8))


@needs_fp8
@pytest.mark.parametrize("m,n,k", [(1, 8, 64), (3, 130, 128), (17, 200, 320), (130, 77, 256), (257, 520, 1024)])
def test_gemm_fp8_raw_sums_match_float64(m, n, k):
    xq, wq = random_e4m3((m, k), m + n), random_e4m3((n, k), k + 1)
    y = torch.full((m, n), float("nan"), device="cuda")
    _core.gemm_fp8(xq.view(torch.uint8).cuda(), None, wq.view(torch.uint8).cuda(), None, y)
    ref = xq.double() @ wq.double().T  # products are exact in f32: only the f32 sums round
    mag = xq.double().abs() @ wq.double().abs().T
    got = y.cpu().double()
    assert not torch.isnan(got).any()
    assert torch.all((got - ref).abs() <= 2e-6 * mag + 1e-6)


@needs_fp8
@pytest.mark.parametrize("m,n,k", [(1, 576, 576), (7, 1536, 576), (64, 576, 1536), (300, 130, 192)])
def test_gemm_fp8_scaled_f16_and_the_linear_op(m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    x = (torch.randn(m, k, generator=g) * 2).half()
    w = torch.randn(n, k, generator=g) * 0.05
    q = torch.empty(m, k, dtype=torch.uint8, device="cuda")
    sx = torch.empty(m, device="cuda")
    _core.quantize_per_token_e4m3(x.cuda(), q, sx)
    qw = _core.quantize_weight(w, "e4m3", 0, False)
    wq = torch.from_dlpack(qw.q).view(torch.uint8)  # e4m3 codes (torch float8_e4m3fn) as bytes
    sw = torch.from_dlpack(qw.scales).clone()
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.gemm_fp8(q, sx, wq.cuda(), sw.cuda(), y)
    xq_ref, sx_ref = reference_quantize(x)
    ref = (xq_ref.double() @ wq.view(torch.float8_e4m3fn).double().T) * sx_ref.double()[:, None] * sw.double()[None, :]
    got = y.cpu().double()
    assert not torch.isnan(got).any()
    assert (got - ref).abs().max() <= 2.0**-10 * ref.abs().max()  # one f16 rounding of the f32 result


def test_gemm_fp8_bad_inputs():
    xq = torch.zeros(4, 64, dtype=torch.uint8, device="cuda")
    wq = torch.zeros(8, 64, dtype=torch.uint8, device="cuda")
    with pytest.raises(TypeError, match="gemm_fp8: argument 'y' must be f16 \\(scaled\\) or f32"):
        _core.gemm_fp8(xq, None, wq, None, torch.empty(4, 8, dtype=torch.int32, device="cuda"))
    with pytest.raises(NotImplementedError, match="k must be a multiple of 64, got k=40"):
        _core.gemm_fp8(xq[:, :40].contiguous(), None, wq[:, :40].contiguous(), None,
                       torch.empty(4, 8, device="cuda"))
    with pytest.raises(ValueError, match="argument 'wq' has k=128 but 'xq' has k=64"):
        _core.gemm_fp8(xq, None, torch.zeros(8, 128, dtype=torch.uint8, device="cuda"), None,
                       torch.empty(4, 8, device="cuda"))
    with pytest.raises(TypeError, match="quantize_per_token_e4m3: argument 'x' must have dtype f16"):
        _core.quantize_per_token_e4m3(torch.zeros(2, 64, device="cuda"), xq[:2], torch.empty(2, device="cuda"))
