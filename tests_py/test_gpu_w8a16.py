"""GPU W8A16 (cpp/kernels/sm80/gemm_w8a16_sm80.cu): int8 weights per output channel (recipe w8a16) or per group
of k (w8a16g32: GGUF Q8_0 as stored) times f16 activations, against a float64 reference on random data, odd
shapes, every token tile, split-K; poisoned outputs and workspace; bad inputs named."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


def random_w8(n, k, group, seed):
    """int8 codes in [-127, 127] and f32 scales: [n] per channel (group 0) or [n, groups]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    shape = (n,) if group == 0 else (n, (k + group - 1) // group)
    scales = torch.rand(shape, generator=g) * 0.004 + 0.0005
    if group:  # GGUF Q8_0 keeps f16 scales: also the values the kernel multiplies with, exactly
        scales = scales.half().float()
    return q, scales


def reference_weight(q, scales, k, group):
    s = scales.double()[:, None] if group == 0 else scales.double()[:, torch.arange(k) // group]
    return q.double() * s


def run(m, n, k, group, split_k, seed, workspace=None, y_pad=1):
    q, s = random_w8(n, k, group, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).half()
    y_full = torch.full((m, n + y_pad), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    _core.gemm_w8a16(x.cuda(), q.cuda(), s.cuda(), group, y, split_k=split_k, workspace=workspace)
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:]).all(), "wrote past n"
    return y.cpu().double(), x.double() @ reference_weight(q, s, k, group).T


def check(y, ref, bound):
    assert not torch.isnan(y).any(), "unwritten outputs"
    rel = (y - ref).norm() / ref.norm()
    assert rel < bound, f"relative error {rel:.2e}"
    row_rel = (y - ref).norm(dim=1) / ref.norm(dim=1)  # every token row, not just the bulk
    assert row_rel.max() < 4 * bound, f"worst row relative error {row_rel.max():.2e}"


# Per channel the codes enter the mma exactly and the scale multiplies the f32 sum: only the f16 output
# rounds (2^-11), bound 1e-3. Grouped, each weight q*s rounds to f16 once as well: bound 2e-3.
# m: every token tile (<= 8, <= 16, <= 64, 128x128 blocks) and its edges; n: partial 16-row tiles and
# 128-row blocks; k: one 64-k chunk, a short last group (k = 640, g128), 65 chunks.
@pytest.mark.parametrize("m", [1, 7, 9, 16, 17, 64, 65, 130, 300])
@pytest.mark.parametrize("n,k,group", [(33, 576, 0), (272, 576, 32), (4103, 640, 64), (17, 4160, 128),
                                       (1000, 2048, 32), (130, 64, 0)])
@pytest.mark.parametrize("split_k", [0, 1, 3])
def test_gemm_w8a16_matches_float64(m, n, k, group, split_k):
    y, ref = run(m, n, k, group, split_k, seed=m * 7 + n + k + group + split_k)
    check(y, ref, 1e-3 if group == 0 else 2e-3)


@pytest.mark.parametrize("m,n,k,group", [(1, 4096, 14336, 32), (16, 28672, 4096, 0), (256, 6144, 4096, 32)])
def test_gemm_w8a16_llama_shapes(m, n, k, group):
    y, ref = run(m, n, k, group, 0, seed=3 + m)
    check(y, ref, 1e-3 if group == 0 else 2e-3)


def test_gemm_w8a16_poisoned_workspace():
    """Split-K partials must all be written: a NaN-filled workspace may not leak into y."""
    ws = torch.full((7 * 37 * 1000,), float("nan"), device="cuda")
    y, ref = run(37, 1000, 2048, 32, 7, seed=5, workspace=ws)
    check(y, ref, 2e-3)


def test_gemm_w8a16_bad_inputs():
    q, s = random_w8(32, 128, 32, 1)
    q, s = q.cuda(), s.cuda()
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    x = torch.randn(2, 128, device="cuda").half()
    with pytest.raises(NotImplementedError, match="'x' must be f16"):
        _core.gemm_w8a16(x.bfloat16(), q, s, 32, y)
    with pytest.raises(ValueError, match="x.*100 features but the weight expects k=128"):
        _core.gemm_w8a16(torch.randn(2, 100, device="cuda").half(), q, s, 32, y)
    with pytest.raises(ValueError, match="group must be 0 .* or a multiple of 32, got 16"):
        _core.gemm_w8a16(x, q, s, 16, y)
    with pytest.raises(ValueError, match="w.scales"):
        _core.gemm_w8a16(x, q, s, 0, y)  # per-channel scales are [n], not [n, groups]
    with pytest.raises(ValueError, match="k must be a multiple of 64"):
        _core.gemm_w8a16(x[:, :96].contiguous(), q[:, :96].contiguous(), s[:, :3].contiguous(), 32, y)
    with pytest.raises(TypeError, match="'x' must be a CUDA tensor"):
        _core.gemm_w8a16(x.cpu(), q, s, 32, y)
