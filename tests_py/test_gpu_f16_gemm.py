"""GPU f16 GEMM (w16a16 linear, cpp/kernels/sm80/gemm_f16_sm80.cu + gemm_f16_mma_sm80.cu, and cuBLASLt where built:
cpp/kernels/cublaslt/): every registered
kernel, forced through linear(..., kernel=name), against a float64 reference on odd shapes.

Tolerance: x and w are f16 (exact in float64), the kernels accumulate in f32 (relative error ~sqrt(k)
2^-24, negligible) and round each output to f16 once (<= 2^-11 = 4.9e-4 relative). So the relative
Frobenius error is <= ~5e-4; the bound 2e-3 leaves 4x margin, and the worst row gets 4x that (8e-3).
Wrong results are far above it: dropping the 4-element k tail of k = 4100 costs ~sqrt(4/4100) = 3e-2,
a missing bias (std 1 against outputs of std 0.05 sqrt(k)) >= 0.3, an unwritten output is NaN."""
import pytest
import torch

import lowbit
from lowbit import _core as lb
from lowbit.info import cuda_libraries

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

# cuBLASLt (gemm_f16_cublaslt) where this build has it.
KERNELS = ["gemm_f16_mma_sm80", "gemm_f16_wmma_sm80", "gemm_f16_gemv_sm80"] + (
    ["gemm_f16_cublaslt"] if cuda_libraries()["cublaslt"] else [])
REL_TOL, ROW_TOL = 2e-3, 8e-3


def rnd(shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).half()


def f16_weight(n, k, seed):
    """The f16 weight as linear sees it (packed for sm80, on the GPU) and its values as float64 on the GPU."""
    qw = lb.quantize_weight(rnd((n, k), seed, 0.05).float(), "f16", 128)
    w64 = torch.from_dlpack(lb.dequantize_weight(qw)).double().cuda()
    return lb.pack_weight(qw, "sm80", "cuda"), w64


def strided_x(m, k, ld, seed):
    """x [m, k] as a view with row stride ld of a GPU buffer (ld = k: contiguous)."""
    return rnd((m, ld), seed).cuda()[:, :k]


def run(kernel, x, packed, n, bias=None, y_pad=0):
    """y = linear(x, w) (+ bias) with the kernel forced ("" = the registry's choice) into a NaN-poisoned y
    of row stride n + y_pad; checks that the padding columns stay untouched."""
    m = x.shape[0]
    y_full = torch.full((m, n + y_pad), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    lb.linear(x, packed, bias, y, kernel=kernel)
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:]).all(), "wrote past n"
    return y.double()


def check(y, ref, what):
    assert not torch.isnan(y).any(), f"{what}: output left (partly) unwritten"
    err = (y - ref).norm() / ref.norm()
    row_err = ((y - ref).norm(dim=1) / ref.norm(dim=1)).max()
    assert err <= REL_TOL, f"{what}: relative Frobenius error {err:.2e} > {REL_TOL}"
    assert row_err <= ROW_TOL, f"{what}: worst row relative error {row_err:.2e} > {ROW_TOL}"


# m: 2 (smallest mma m), around the 16-row GEMV slice, the 32/64-token tiles and one past them, several
# 128-token tiles with a partial one; n: < one n8 tile, partial 128-row blocks, 4104 = 32 blocks + 8;
# k: < one 64-k chunk, a chunk + a partial one, 9 chunks, and 4100 (k % 8 != 0: the rows are not 16-byte
# aligned, so mma cannot run and says so; with 8-aligned strides small k runs split-K).
# Each case runs x contiguous, with row stride k + 8, and with an odd row stride (k + 3: misaligned),
# with and without bias, into y of even (f16x2 stores) and odd (scalar stores) row stride.
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("k", [16, 72, 576, 4100])
@pytest.mark.parametrize("n", [8, 200, 1000, 4104])
@pytest.mark.parametrize("m", [2, 7, 16, 17, 64, 65, 300, 1030])
def test_f16_gemm_forced_matches_float64(kernel, m, n, k):
    packed, w64 = f16_weight(n, k, seed=m + n + k)
    bias = rnd((n,), seed=n + 1).cuda()
    for ld in (k, k + 8, k + 3):
        x = strided_x(m, k, ld, seed=m + ld)
        ref = x.double() @ w64.T
        if kernel == "gemm_f16_mma_sm80" and (ld % 8 or k % 8):  # a forced kernel that cannot run raises
            with pytest.raises(NotImplementedError, match="forced kernel gemm_f16_mma_sm80 cannot run.*aligned"):
                run(kernel, x, packed, n)
            continue
        for with_bias, y_pad in ((False, 0), (True, 3)):
            y = run(kernel, x, packed, n, bias if with_bias else None, y_pad)
            check(y, ref + bias.double() if with_bias else ref,
                  f"{kernel} m={m} n={n} k={k} ld={ld} bias={with_bias}")


@pytest.mark.parametrize("m,n,k", [(2, 200, 576), (16, 4104, 576), (17, 1000, 72), (64, 4104, 4104),
                                   (65, 200, 1000), (300, 1000, 576), (1030, 4104, 576)])
def test_f16_gemm_mma_matches_wmma(m, n, k):
    """Both tensor-core kernels round the same f32-accumulated sums once: they agree to ~2 f16 ulp, and a
    wrong tile, split or tail in one of them shows as a large difference."""
    packed, w64 = f16_weight(n, k, seed=7 * m + n)
    bias = rnd((n,), seed=3).cuda()
    x = strided_x(m, k, k + 8, seed=m)
    y_mma = run("gemm_f16_mma_sm80", x, packed, n, bias)
    y_wmma = run("gemm_f16_wmma_sm80", x, packed, n, bias)
    check(y_mma, x.double() @ w64.T + bias.double(), "mma")
    check(y_mma, y_wmma, "mma vs wmma")


@pytest.mark.parametrize("m", [1, 2, 16, 33, 64, 65, 300])
def test_f16_gemm_default_dispatch(m):
    """Without the override (GEMV at m = 1, mma from m = 2, split-K for few blocks) on a Llama-like
    shape (n = 4096 gives 32 column blocks: split-K at small m)."""
    n, k = 4096, 1024
    packed, w64 = f16_weight(n, k, seed=m)
    bias = rnd((n,), seed=5).cuda()
    x = strided_x(m, k, k, seed=m + 1)
    check(run("", x, packed, n, bias), x.double() @ w64.T + bias.double(), f"default m={m}")


@pytest.mark.parametrize("m", [2, 40])
def test_f16_gemm_default_dispatch_misaligned_weight_rows(m):
    """k % 8 != 0 with x rows 16-byte aligned (stride k + 4): the weight rows are not, so the registry
    must not pick the cp.async kernel."""
    n, k = 200, 4100
    packed, w64 = f16_weight(n, k, seed=m)
    x = strided_x(m, k, k + 4, seed=m + 2)
    check(run("", x, packed, n), x.double() @ w64.T, f"default m={m} k={k}")


def test_f16_gemm_kernel_override_is_checked():
    packed, _ = f16_weight(64, 64, seed=1)
    with pytest.raises(ValueError, match="forced kernel 'cublas' is not registered; kernels: .*gemm_f16_mma_sm80"):
        lb.linear(strided_x(4, 64, 64, seed=2), packed, out=torch.empty(4, 64, dtype=torch.float16, device="cuda"),
                  kernel="cublas")
    with pytest.raises(NotImplementedError, match="forced kernel gemm_w4a16_sm80 cannot run.*w4"):
        lb.linear(strided_x(4, 64, 64, seed=2), packed, out=torch.empty(4, 64, dtype=torch.float16, device="cuda"),
                  kernel="gemm_w4a16_sm80")
