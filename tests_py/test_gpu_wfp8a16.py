"""GPU weight-only FP8 (recipe wfp8a16; cpp/kernels/sm80/gemm_wfp8a16_sm80.cu on the W8A16 kernel): e4m3 weights with
f32 per-channel scales times f16 activations. Every e4m3 code becomes its exact f16 value in registers: the decoding
is checked bit-exact over all 254 finite codes, and the GEMM against a float64 reference on random data, odd shapes,
every token tile and split-K; poisoned outputs and workspace; bad inputs named."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w8a16 import check  # the same whole-output and per-row relative-error bounds

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

FINITE_CODES = [c for c in range(256) if c & 0x7F != 0x7F]  # 0x7f / 0xff are NaN in e4m3fn


def random_fp8(n, k, seed):
    """e4m3 codes spread over the whole range (subnormals included) and f32 per-channel scales."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-9, 9, (n, k), generator=g).float())
    q = w.clamp(-448, 448).to(torch.float8_e4m3fn)
    scales = torch.rand(n, generator=g) * 0.004 + 0.0005
    return q, scales


def run(m, n, k, split_k, seed, workspace=None, y_pad=1):
    q, s = random_fp8(n, k, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).half()
    y_full = torch.full((m, n + y_pad), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    _core.gemm_wfp8a16(x.cuda(), q.cuda(), s.cuda(), y, split_k=split_k, workspace=workspace)
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:]).all(), "wrote past n"
    return y.cpu().double(), x.double() @ (q.double() * s.double()[:, None]).T


def test_every_e4m3_code_decodes_bit_exact():
    """x = identity, scale 1: y = Wᵀ, each output a single product code * 1.0 summed with exact zeros, so the f16
    output must be the code's value exactly (torch's float8 -> f16 cast), subnormals and signed zeros included."""
    k = 256
    codes = torch.tensor(FINITE_CODES + [0, 0], dtype=torch.uint8)  # 254 finite codes, padded to k
    g = torch.Generator().manual_seed(7)
    rows = torch.stack([codes[torch.randperm(k, generator=g)] for _ in range(40)])  # n = 40, shuffled per row
    q = rows.view(torch.float8_e4m3fn)
    x = torch.eye(k, dtype=torch.float16)
    y = torch.full((k, 40), float("nan"), dtype=torch.float16, device="cuda")
    _core.gemm_wfp8a16(x.cuda(), q.cuda(), torch.ones(40).cuda(), y, split_k=1)
    want = q.to(torch.float16).T.contiguous()
    got = y.cpu()
    # Values compared (torch.equal: -0 == +0): the sign of an exact zero depends on the sum (-0 + 0 = +0).
    assert torch.equal(got, want), (got != want).nonzero()[:8]
    assert (want != 0).sum() == 40 * 252  # every nonzero finite code took part


# Per channel the codes enter the mma exactly and the scale multiplies the f32 sum: only the f16 output rounds
# (2^-11) besides the f32 accumulation, bound 1e-3. m: every token tile (<= 8, <= 16, <= 64, 128x128 blocks) and
# edges; n: partial 16-row tiles and 128-row blocks; k: one 64-k chunk, half a last stage (576), 65 chunks.
@pytest.mark.parametrize("m", [1, 7, 16, 17, 65, 300])
@pytest.mark.parametrize("n,k", [(33, 576), (4103, 640), (17, 4160), (130, 64), (1000, 2048)])
@pytest.mark.parametrize("split_k", [0, 1, 3])
def test_gemm_wfp8a16_matches_float64(m, n, k, split_k):
    y, ref = run(m, n, k, split_k, seed=m * 7 + n + k + split_k)
    check(y, ref, 1e-3)


@pytest.mark.parametrize("m,n,k", [(1, 4096, 14336), (16, 28672, 4096), (256, 6144, 4096)])
def test_gemm_wfp8a16_llama_shapes(m, n, k):
    y, ref = run(m, n, k, 0, seed=3 + m)
    check(y, ref, 1e-3)


def test_gemm_wfp8a16_poisoned_workspace():
    """Split-K partials must all be written: a NaN-filled workspace may not leak into y."""
    ws = torch.full((7 * 37 * 1000,), float("nan"), device="cuda")
    y, ref = run(37, 1000, 2048, 7, seed=5, workspace=ws)
    check(y, ref, 1e-3)


def test_gemm_wfp8a16_bad_inputs():
    q, s = random_fp8(32, 128, 1)
    q, s = q.cuda(), s.cuda()
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    x = torch.randn(2, 128, device="cuda").half()
    with pytest.raises(NotImplementedError, match="'x' must be f16"):
        _core.gemm_wfp8a16(x.bfloat16(), q, s, y)
    with pytest.raises(ValueError, match="x.*100 features but the weight expects k=128"):
        _core.gemm_wfp8a16(torch.randn(2, 100, device="cuda").half(), q, s, y)
    with pytest.raises(TypeError, match="w.data"):  # int8 codes are W8A16's, not e4m3
        _core.gemm_wfp8a16(x, q.view(torch.int8), s, y)
    with pytest.raises(ValueError, match="w.scales"):  # per-channel scales are [n]
        _core.gemm_wfp8a16(x, q, s[:, None].expand(32, 2).contiguous(), y)
    with pytest.raises(ValueError, match="k must be a multiple of 64"):
        _core.gemm_wfp8a16(x[:, :96].contiguous(), q[:, :96].contiguous(), s, y)
    with pytest.raises(TypeError, match="'x' must be a CUDA tensor"):
        _core.gemm_wfp8a16(x.cpu(), q, s, y)
