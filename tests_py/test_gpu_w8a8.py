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


# k % 8 == 0 with aligned rows takes the vectorized kernel (1 to 16 vectors per thread); k = 100,
# k > 32768 and odd row strides take the scalar one.
@pytest.mark.parametrize("pad", [0, 8, 3])
@pytest.mark.parametrize("m,k", [(1, 64), (3, 100), (17, 4096), (5, 576), (2, 14336), (33, 1032), (4, 32768),
                                 (2, 40000), (300, 2048)])
def test_quantize_per_token_bit_exact(m, k, pad):
    x = torch.randn(m, k + pad, generator=torch.Generator().manual_seed(m * k)).half() * 3
    x[m // 2] = 0  # an all-zero row gets scale 1
    x = x.cuda()[:, :k]  # row stride k + pad
    q = torch.full((m, k), 55, dtype=torch.int8, device="cuda")
    s = torch.full((m,), float("nan"), device="cuda")
    _core.quantize_per_token_s8(x, q, s)
    torch.cuda.synchronize()
    q_ref, s_ref = reference_quantize(x.cpu())
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


# Both GEMM kernels, forced through gemm_w8a8(..., kernel=): the sm80 mma.sync kernel and, on sm_90, the
# wgmma/TMA kernel (swapped operands for m <= 64, split-K clusters). "sm90:S" forces split S.
def _is_sm90():
    return lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)


PATHS = ["sm80", pytest.param("sm90", marks=pytest.mark.skipif(not _is_sm90(), reason="needs sm_90"))]

# m from 1 to 1100 (each side of the swap at 32/64 and of the 128-row tile), odd n, k multiples of 64
# (k % 128 == 64 exercises the zero-filled half block).
SHAPES = [(1, 8, 64), (1, 257, 4160), (2, 130, 576), (7, 33, 1024), (16, 513, 192), (31, 136, 640),
          (32, 200, 64), (33, 95, 576), (64, 300, 1088), (65, 257, 576), (127, 129, 256), (129, 1000, 320),
          (256, 384, 4096), (300, 520, 4160), (1100, 300, 576)]


def _run_raw(m, n, k, pad, seed, kernel="", sm90_pairs=False):
    """Raw s32 GEMM into a poisoned [m, n + pad] buffer (y = its first n columns); returns y, buffer, ref."""
    g = torch.Generator().manual_seed(seed)
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    buf = torch.full((m, n + pad), -7, dtype=torch.int32, device="cuda")
    y = buf[:, :n]
    _core.gemm_w8a8(xq.cuda(), None, wq.cuda(), None, y, kernel=kernel, sm90_pairs=sm90_pairs)
    torch.cuda.synchronize()
    return buf.cpu(), xq.long() @ wq.long().T


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pad", [0, 3])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_w8a8_paths_int32_bit_exact(path, pad, m, n, k):
    buf, ref = _run_raw(m, n, k, pad, seed=m * 7 + n + k + pad, kernel=path)
    assert torch.equal(buf[:, :n].long(), ref)
    assert (buf[:, n:] == -7).all()  # nothing written past n (odd row stride when pad = 3)


@pytest.mark.skipif(not _is_sm90(), reason="needs sm_90")
@pytest.mark.parametrize("split", [1, 2, 4, 8])
@pytest.mark.parametrize("m,n,k", [(5, 300, 1088), (40, 1000, 4160), (65, 520, 1088), (300, 257, 2112)])
def test_gemm_w8a8_sm90_split_k_bit_exact(split, m, n, k):
    buf, ref = _run_raw(m, n, k, 1, seed=split + m + n + k, kernel=f"sm90:{split}")
    assert torch.equal(buf[:, :n].long(), ref)
    assert (buf[:, n:] == -7).all()


@pytest.mark.skipif(not _is_sm90(), reason="needs sm_90")
@pytest.mark.parametrize("split", [0, 2])
@pytest.mark.parametrize("m,n,k", [(129, 1000, 320), (300, 520, 4160), (1100, 300, 576)])
def test_gemm_w8a8_sm90_pairs_bit_exact(split, m, n, k):
    # m > 128 with the (opt-in) multicast pairs
    buf, ref = _run_raw(m, n, k, 0, seed=split + m + n + k, kernel=f"sm90:{split}" if split else "sm90",
                        sm90_pairs=True)
    assert torch.equal(buf.long(), ref)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m,n,k", [(1, 4099, 4096), (16, 130, 576), (64, 257, 1024), (300, 256, 2048),
                                   (1100, 136, 640)])
def test_gemm_w8a8_paths_scaled_f16(path, m, n, k):
    g = torch.Generator().manual_seed(m * 5 + n + k)
    x = torch.randn(m, k, generator=g).half()
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    w_scale = (torch.rand(n, generator=g) * 0.01 + 0.001).cuda()
    xq = torch.empty(m, k, dtype=torch.int8, device="cuda")
    x_scale = torch.empty(m, device="cuda")
    _core.quantize_per_token_s8(x.cuda(), xq, x_scale)
    wq = wq.cuda()
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.gemm_w8a8(xq, x_scale, wq, w_scale, y, kernel=path)
    y80 = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.gemm_w8a8(xq, x_scale, wq, w_scale, y80, kernel="sm80")
    torch.cuda.synchronize()
    ref = (xq.cpu().double() @ wq.cpu().double().T) * x_scale.cpu().double()[:, None] * w_scale.cpu().double()[None, :]
    got = y.cpu().double()
    assert not torch.isnan(got).any()
    assert (got - ref).norm() / ref.norm() < 1e-3  # f16 output rounding only
    assert torch.equal(y.cpu(), y80.cpu())  # same f32 epilogue expression in both kernels


def test_gemm_w8a8_bad_kernel_override():
    xq = torch.ones(4, 64, dtype=torch.int8, device="cuda")
    wq = torch.ones(8, 64, dtype=torch.int8, device="cuda")
    y = torch.empty(4, 8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="gemm_w8a8: argument 'kernel': the split in 'sm90:S' must be 1, 2, 4 or 8"):
        _core.gemm_w8a8(xq, None, wq, None, y, kernel="sm90:3")
    with pytest.raises(ValueError, match="gemm_w8a8: argument 'kernel' must be '', 'sm80', 'sm90'"):
        _core.gemm_w8a8(xq, None, wq, None, y, kernel="cutlass")
    if not _is_sm90():
        with pytest.raises(NotImplementedError, match="needs an sm_90 device"):
            _core.gemm_w8a8(xq, None, wq, None, y, kernel="sm90")
