"""GPU SiLU·mul with the down linear's per-token quantizer fused (ops::silu_mul_quantize): the codes and scales
must be the bytes the two kernels it replaces make (silu_mul to f16 rows, then quantize_per_token_{s8,e4m3}),
and within the quantizer's rounding of a float64 silu(gate) * up. Shapes cover the fused kernel's 1, 2 and 4
groups per thread (I up to 4096, 8192, 16384), I from 16392 to 32768 (on sm_90 the cluster kernel with two groups
per thread for up to 16 rows, Llama-3-70B's 28672 among them; more rows, or another GPU, the two-kernel fallback),
I > 32768 (the fallback), I not a multiple of 8, odd row counts, and rows with a stride (a slice of a wider
buffer)."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

SHAPES = [(1, 14336), (1, 4096), (3, 8), (5, 1000), (7, 2056), (2, 8200), (2, 16392), (33, 576), (300, 128),
          (1, 1), (1, 28672), (16, 28672), (17, 28672), (3, 32768), (2, 32776)]


def gate_up(t, i, seed, pad=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, 2 * i + pad, generator=g) * (torch.rand(t, 1, generator=g) * 6 + 0.1)
    return x.half()


def two_kernels(gu, fp8):
    """The path the fused op replaces: silu_mul's f16 rows, then the stand-alone per-token quantizer."""
    t, i = gu.shape[0], gu.shape[1] // 2
    act = torch.full((t, i), float("nan"), dtype=torch.float16, device="cuda")
    _core.silu_mul(gu, act)
    torch.cuda.synchronize()  # the ops' stream, then the quantizer's (stream 0)
    q = torch.empty(t, i, dtype=torch.uint8 if fp8 else torch.int8, device="cuda")
    s = torch.empty(t, device="cuda")
    (_core.quantize_per_token_e4m3 if fp8 else _core.quantize_per_token_s8)(act, q, s)
    torch.cuda.synchronize()
    return q, s


def fused(gu, fp8, pdl):
    t, i = gu.shape[0], gu.shape[1] // 2
    q = torch.full((t, i), 0x7F, dtype=torch.uint8 if fp8 else torch.int8, device="cuda")  # poison
    s = torch.full((t,), float("nan"), device="cuda")
    _core.silu_mul_quantize(gu, q, s, pdl=pdl)
    torch.cuda.synchronize()
    return q, s


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("t,i", SHAPES)
def test_silu_mul_quantize_matches_two_kernels_and_float64(t, i, fp8):
    pad = 8 if i % 8 == 0 else 0  # a row stride past 2I keeps the 16-byte groups when I allows them
    full = gate_up(t, i, seed=t * 131 + i + fp8, pad=pad).cuda()
    gu = full[:, : 2 * i]
    if t > 2:
        gu[2].zero_()  # an all-zero row: scale 1, codes 0
    q, s = fused(gu, fp8, pdl=(t % 2 == 1))
    q_ref, s_ref = two_kernels(gu, fp8)
    assert torch.equal(s.cpu(), s_ref.cpu())
    assert torch.equal(q.cpu(), q_ref.cpu())
    # Against float64: the codes times the scale recover silu(g) * u within the quantizer's half step (s8: s / 2;
    # e4m3: 2^-4 of the value, s * 2^-10 near zero) plus the f16 rounding of the rows it quantizes.
    g64, u64 = gu[:, :i].double().cpu(), gu[:, i:].double().cpu()
    y = g64 / (1 + torch.exp(-g64)) * u64
    amax = y.abs().amax(dim=1)
    s64 = torch.where(amax > 0, amax / (448.0 if fp8 else 127.0), torch.ones_like(amax))
    assert ((s.double().cpu() - s64).abs() <= s64 * 2e-3).all()  # max|y| rounded to f16, then divided in f32
    deq = (q.cpu().view(torch.float8_e4m3fn).double() if fp8 else q.cpu().double()) * s.double().cpu()[:, None]
    err = (deq - y).abs()
    bound = (y.abs() * 2.0**-4 + s.double().cpu()[:, None] * 2.0**-9 if fp8 else s.double().cpu()[:, None] * 0.5)
    bound = bound * 1.001 + y.abs() * 2.0**-10 + 1e-30
    assert (err <= bound).all(), f"max excess {(err - bound).max().item()}"
    assert not torch.isnan(s).any()
