"""GPU W8A8: per-token int8 quantizer (bit-exact) and the s8 tensor-core GEMM (int32 bit-exact)."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


def reference_quantize(x):
    amax = x.float().abs().amax(dim=1)
    s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(x.float() / s[:, None]).clamp(-127, 127).to(torch.int8)
    return q, s


@pytest.mark.parametrize("m,k", [(1, 64), (3, 100), (17, 4096), (5, 576)])
def test_quantize_per_token_bit_exact(m, k):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m * k)).half() * 3
    x[m // 2] = 0  # an all-zero row gets scale 1
    q = torch.full((m, k), 55, dtype=torch.int8, device="cuda")
    s = torch.full((m,), float("nan"), device="cuda")
    _core.quantize_per_token_s8(x.cuda(), q, s)
    torch.cuda.synchronize()
    q_ref, s_ref = reference_quantize(x)
    assert torch.equal(s.cpu(), s_ref)
    assert torch.equal(q.cpu(), q_ref)


@pytest.mark.parametrize("m,n,k", [(1, 8, 64), (3, 130, 576), (17, 256, 128), (130, 200, 1024), (256, 384, 4096)])
def test_gemm_w8a8_int32_bit_exact(m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    y = torch.full((m, n), -7, dtype=torch.int32, device="cuda")
    _core.gemm_w8a8(xq.cuda(), None, wq.cuda(), None, y)
    torch.cuda.synchronize()
    assert torch.equal(y.cpu().long(), xq.long() @ wq.long().T)


@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (17, 130, 576), (300, 256, 2048)])
def test_gemm_w8a8_scaled_f16(m, n, k):
    g = torch.Generator().manual_seed(m * 3 + n + k)
    x = torch.randn(m, k, generator=g).half()
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    w_scale = torch.rand(n, generator=g) * 0.01 + 0.001
    xq = torch.empty(m, k, dtype=torch.int8, device="cuda")
    x_scale = torch.empty(m, device="cuda")
    _core.quantize_per_token_s8(x.cuda(), xq, x_scale)
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.gemm_w8a8(xq, x_scale, wq.cuda(), w_scale.cuda(), y)
    torch.cuda.synchronize()
    ref = (xq.cpu().double() @ wq.double().T) * x_scale.cpu().double()[:, None] * w_scale.double()[None, :]
    got = y.cpu().double()
    assert not torch.isnan(got).any()
    assert (got - ref).norm() / ref.norm() < 1e-3  # f16 output rounding only


def test_gemm_w8a8_bad_inputs():
    xq = torch.zeros(4, 100, dtype=torch.int8, device="cuda")
    wq = torch.zeros(8, 100, dtype=torch.int8, device="cuda")
    with pytest.raises(NotImplementedError, match="k must be a multiple of 64, got k=100"):
        _core.gemm_w8a8(xq, None, wq, None, torch.empty(4, 8, dtype=torch.int32, device="cuda"))
    xq = torch.zeros(4, 64, dtype=torch.int8, device="cuda")
    with pytest.raises(ValueError, match="'wq' has k=100"):
        _core.gemm_w8a8(xq, None, wq, None, torch.empty(4, 8, dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match="'y' must be f16"):
        _core.gemm_w8a8(xq, None, torch.zeros(8, 64, dtype=torch.int8, device="cuda"), None,
                        torch.empty(4, 8, device="cuda"))
    with pytest.raises(TypeError, match="'xq' must have dtype s8"):
        _core.gemm_w8a8(xq.float(), None, torch.zeros(8, 64, dtype=torch.int8, device="cuda"), None,
                        torch.empty(4, 8, dtype=torch.int32, device="cuda"))
