"""GPU W4A16: dequantize kernel (bit-exact), the mma.sync GEMMs (small, large) and the Hopper wgmma GEMM vs a
float64 reference and against each other (all three dequantize the same packed weight bit-identically)."""
import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]
SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)


def random_w4(n, k, group, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    groups = (k + group - 1) // group
    scales = (torch.rand(n, groups, generator=g) * 0.02 + 0.002).half()
    zeros = (torch.rand(n, groups, generator=g) * 15).half()
    return q, scales, zeros


def unpack_nibbles(q, k):
    """uint8 [n, k/2] -> int64 [n, k], low nibble first."""
    lo, hi = (q & 0xF).long(), (q >> 4).long()
    return torch.stack([lo, hi], dim=-1).reshape(q.shape[0], k)


def reference_weight(q, scales, zeros, k, group):
    vals = unpack_nibbles(q, k).double()
    idx = torch.arange(k) // group
    z = 8.0 if zeros is None else zeros.double()[:, idx]
    return (vals - z) * scales.double()[:, idx]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,k,group,symmetric", [(33, 576, 128, False), (7, 100, 32, False), (64, 256, 64, True)])
def test_dequantize_w4_bit_exact(dtype, n, k, group, symmetric):
    q, s, z = random_w4(n, k, group, n + k)
    z = None if symmetric else z
    out = torch.full((n, k), float("nan"), dtype=dtype, device="cuda")
    _core.dequantize_w4(q.cuda(), s.cuda(), None if z is None else z.cuda(), group, out)
    torch.cuda.synchronize()
    ref = reference_weight(q, s, z, k, group).to(dtype)  # exact product, one rounding
    assert torch.equal(out.cpu(), ref)


def run_gemm(m, n, k, group, split_k, seed, x_stride=None, workspace=None):
    q, s, z = random_w4(n, k, group, seed)
    data, ps, pz = _core.pack_w4_sm80(q, s, z, group)
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in (data, ps, pz))
    x_full = torch.randn(m, x_stride or k, generator=torch.Generator().manual_seed(seed + 1)).half()
    x = x_full[:, :k]
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    _core.gemm_w4a16(x_full.cuda()[:, :k], data, ps, pz, n, k, group, y, split_k=split_k, workspace=workspace)
    torch.cuda.synchronize()
    ref = x.double() @ reference_weight(q, s, z, k, group).T
    return y.cpu().double(), ref


def check(y, ref, bound=2e-3):
    assert not torch.isnan(y).any(), "unwritten outputs"
    rel = (y - ref).norm() / ref.norm()
    assert rel < bound, f"relative error {rel:.2e}"
    # every row is right, not just the bulk (a wrong token tile would hide in the Frobenius norm)
    row_rel = (y - ref).norm(dim=1) / ref.norm(dim=1)
    assert row_rel.max() < 4 * bound, f"worst row relative error {row_rel.max():.2e}"


# Weights are rounded to f16 once (q*s - z*s, ~2^-11 relative), products accumulate in f32 and the
# output is rounded to f16: a relative Frobenius error of a few 1e-4 is expected, 2e-3 is the bound.
# m covers every block shape (<= 8, <= 16, <= 32, <= 64 tokens, 128-token tiles) and their edges.
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 33, 64, 65, 100, 129])
@pytest.mark.parametrize("n,k,group", [(33, 576, 128), (256, 1024, 64), (1000, 2048, 128)])
@pytest.mark.parametrize("split_k", [0, 1, 3])
def test_gemm_w4a16_matches_float64(m, n, k, group, split_k):
    y, ref = run_gemm(m, n, k, group, split_k, seed=m * 7 + n + split_k)
    check(y, ref)


# Odd token counts up to 1100 (several 128-token tiles, a partial last one), odd n (partial 16-row
# tile and partial 128-row block), k = 64 (one chunk), a short last group (k = 576, g128), strided x.
@pytest.mark.parametrize("m", [5, 47, 255, 513, 1100])
@pytest.mark.parametrize("n,k,group,x_stride", [(4103, 576, 64, 584), (17, 64, 64, 64), (389, 1216, 128, 1216)])
@pytest.mark.parametrize("split_k", [0, 2])
def test_gemm_w4a16_odd_shapes(m, n, k, group, x_stride, split_k):
    y, ref = run_gemm(m, n, k, group, split_k, seed=m + n + k, x_stride=x_stride)
    check(y, ref)


def test_gemm_w4a16_poisoned_workspace():
    """Split-K partials must all be written: a NaN-filled workspace may not leak into y."""
    ws = torch.full((8 * 37 * 1000,), float("nan"), device="cuda")
    y, ref = run_gemm(37, 1000, 2048, 128, 8, seed=5, workspace=ws)
    check(y, ref)


@pytest.mark.parametrize("m,n,k", [(1, 4096, 14336), (16, 4096, 14336), (16, 28672, 4096), (64, 4096, 4096),
                                   (300, 1536, 4096)])
def test_gemm_w4a16_llama_shapes(m, n, k):
    y, ref = run_gemm(m, n, k, 128, 0, seed=11 + m)
    check(y, ref)


def test_gemm_w4a16_bad_inputs():
    q, s, z = random_w4(32, 128, 64, 1)
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, 64))
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(NotImplementedError, match="'x' must be f16"):
        _core.gemm_w4a16(torch.randn(2, 128, device="cuda", dtype=torch.bfloat16), data, ps, pz, 32, 128, 64, y)
    with pytest.raises(ValueError, match="x.*100 features but the weight expects k=128"):
        _core.gemm_w4a16(torch.randn(2, 100, device="cuda").half(), data, ps, pz, 32, 128, 64, y)
    with pytest.raises(TypeError, match="'x' must be a CUDA tensor"):
        _core.gemm_w4a16(torch.randn(2, 128).half(), data, ps, pz, 32, 128, 64, y)
    with pytest.raises(ValueError, match="'y'"):
        _core.gemm_w4a16(torch.randn(2, 128, device="cuda").half(), data, ps, pz, 32, 128, 64, y[:, :16])


# ---- large-M kernel (gemm_w4a16_large_sm80.cu), forced through gemm_w4a16(..., kernel=) ----
LARGE_TILES = ["large:64x128", "large:128x128", "large:128x256"]


def w4_problem(m, n, k, group, seed):
    """Random packed weight (on the GPU), f16 x, and the float64 reference y and |x|·|W|ᵀ (for tolerances)."""
    q, s, z = random_w4(n, k, group, seed)
    packed = tuple(torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, group))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).half()
    w = reference_weight(q, s, z, k, group)
    return x, packed, x.double() @ w.T, x.double().abs() @ w.abs().T


def gemm_forced(kernel, x, packed, n, k, group, y_pad=0, split_k=0):
    """y = x · Wᵀ with the kernel forced ("" = automatic) into a NaN-poisoned y whose row stride is n + y_pad;
    checks the padding columns were not written."""
    m = x.shape[0]
    y_full = torch.full((m, n + y_pad), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    _core.gemm_w4a16(x.cuda(), *packed, n, k, group, y, split_k=split_k, kernel=kernel)
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:]).all(), "wrote past n"
    return y.cpu().double()


def check_same_weights(y, y_small, ref_abs):
    """Two kernels that multiply the same f16 weights (bit-identical dequant) differ only by f32
    accumulation order and the final f16 rounding: each output rounds within 2^-11 relative, so two of
    them within 2^-10 |y|, and the f32 sums differ by a few 2^-24 sqrt(k) |x|·|W| (worst case k 2^-24):
    2^-14 |x|·|W| is ~8x the typical and far below a wrong term (|x|·|W| / sqrt(k))."""
    assert not torch.isnan(y).any(), "unwritten outputs"
    diff = (y - y_small).abs()
    bound = 2.0 ** -10 * y_small.abs() + 2.0 ** -14 * ref_abs
    worst = (diff / bound).max()
    assert worst <= 1, f"large vs small kernel: worst diff/bound {worst:.2f}"


# m: one 128-token tile, one past it, partial tiles; n: odd multiples of 16 (partial 128/256-row
# blocks) and an n that is not (partial 16-row packed tile); k: 2 chunks, a short last g128 group
# (576, 4160), 65 chunks; y with an odd row stride (scalar stores) and an even one (f16x2 stores).
@pytest.mark.parametrize("m", [128, 129, 300, 1000])
@pytest.mark.parametrize("n,k,group,y_pad", [(272, 128, 64, 0), (272, 576, 128, 3), (4112, 576, 64, 2),
                                             (17, 4160, 128, 1), (272, 4160, 64, 0), (4112, 4160, 128, 0)])
def test_gemm_w4a16_large_matches_float64_and_small(m, n, k, group, y_pad):
    x, packed, ref, ref_abs = w4_problem(m, n, k, group, seed=m + n + k + group)
    y_small = gemm_forced("small", x, packed, n, k, group, y_pad)
    check(y_small, ref)
    for tile in ["large"] + LARGE_TILES:
        try:
            y = gemm_forced(tile, x, packed, n, k, group, y_pad)
        except NotImplementedError as e:  # a tile bigger than this GPU's shared memory (sm_86/89)
            assert "shared memory" in str(e) and tile != "large:64x128"
            continue
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)


def test_gemm_w4a16_large_default_dispatch():
    """Without a kernel named, m >= 128 runs the wgmma kernel on sm_90 (its split-K is inside a cluster: no
    partials) and the large kernel elsewhere (no split once its 128x128 tiles fill the SMs: 256 blocks here);
    the result is right with or without an explicit split."""
    assert _core.gemm_w4a16_pick_split(1000, 4096, 4096) == 1
    x, packed, ref, _ = w4_problem(300, 272, 576, 64, seed=3)
    for split_k in (0, 1, 5):
        check(gemm_forced("", x, packed, 272, 576, 64, split_k=split_k), ref)


# Split-K in the large kernel (picked when the tiles leave SMs idle, or asked for): every f32 partial
# must be written (NaN-poisoned workspace) and summed; uneven splits (65 chunks over 2, 3, 7).
@pytest.mark.parametrize("tile", ["large"] + LARGE_TILES)
@pytest.mark.parametrize("split_k", [0, 2, 3, 7])
def test_gemm_w4a16_large_split_k(tile, split_k):
    m, n, k, group = 300, 272, 4160, 128
    x, packed, ref, _ = w4_problem(m, n, k, group, seed=split_k + 40)
    ws = torch.full((8 * m * n,), float("nan"), device="cuda")
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    try:
        _core.gemm_w4a16(x.cuda(), *packed, n, k, group, y, split_k=split_k, workspace=ws, kernel=tile)
    except NotImplementedError as e:  # a tile bigger than this GPU's shared memory (sm_86/89)
        assert "shared memory" in str(e) and tile != "large:64x128"
        pytest.skip(str(e))
    torch.cuda.synchronize()
    check(y.cpu().double(), ref)


@pytest.mark.parametrize("tile", LARGE_TILES)
@pytest.mark.parametrize("m", [1, 5, 64])
def test_gemm_w4a16_large_small_m(tile, m):
    """Forced at a few tokens: one partial tile, most rows zero-filled."""
    x, packed, ref, _ = w4_problem(m, 400, 640, 128, seed=m)
    check(gemm_forced(tile, x, packed, 400, 640, 128, y_pad=1), ref)


def test_gemm_w4a16_large_strided_x():
    q, s, z = random_w4(272, 576, 64, 9)
    packed = tuple(torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, 64))
    x_full = torch.randn(200, 584, generator=torch.Generator().manual_seed(10)).half()
    ref = x_full[:, :576].double() @ reference_weight(q, s, z, 576, 64).T
    for tile in LARGE_TILES:
        y = torch.full((200, 272), float("nan"), dtype=torch.float16, device="cuda")
        _core.gemm_w4a16(x_full.cuda()[:, :576], *packed, 272, 576, 64, y, kernel=tile)
        torch.cuda.synchronize()
        check(y.cpu().double(), ref)


def test_gemm_w4a16_bad_kernel_override():
    x, packed, _, _ = w4_problem(2, 32, 128, 64, seed=1)
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="gemm_w4a16: argument 'kernel' must be .*got 'huge'"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="huge")


# ---- Hopper wgmma kernel (cpp/kernels/sm90/gemm_w4a16_sm90.cu), forced through gemm_w4a16(..., kernel=) ----
SM90_KERNELS = ["sm90", "sm90:1", "sm90:2", "sm90:4", "sm90:8"]


# m: a single token, partial and full 128-token tiles, 256-token tiles (from 129 tokens) with a partial last
# one; n: partial 16-row tiles (17, 4103) and partial 128-row CTAs (272); k: one chunk (64), a short last
# g128 group (576), 65 chunks (uneven split-K ranks); y with a padded row stride (poisoned padding).
@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m", [1, 7, 65, 128, 129, 300, 1000])
@pytest.mark.parametrize("n,k,group,y_pad", [(272, 64, 64, 0), (17, 576, 128, 3), (4103, 576, 64, 1),
                                             (272, 4160, 128, 0), (1000, 2048, 64, 2)])
def test_gemm_w4a16_sm90_matches_float64_and_small(m, n, k, group, y_pad):
    x, packed, ref, ref_abs = w4_problem(m, n, k, group, seed=3 * m + n + k + group)
    y_small = gemm_forced("small", x, packed, n, k, group, y_pad)
    check(y_small, ref)
    for kernel in SM90_KERNELS:
        y = gemm_forced(kernel, x, packed, n, k, group, y_pad)
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m,n,k", [(256, 6144, 4096), (1024, 28672, 4096), (512, 4096, 14336), (130, 1536, 8960)])
def test_gemm_w4a16_sm90_llama_shapes_and_automatic_choice(m, n, k):
    """Llama-3-8B / Qwen-7B layer shapes: the automatic choice (sm90 from 128 tokens) equals the forced kernel
    bit for bit (same kernel, same split: deterministic), and both match float64."""
    x, packed, ref, _ = w4_problem(m, n, k, 128, seed=m + k)
    y_auto = gemm_forced("", x, packed, n, k, 128)
    y_sm90 = gemm_forced("sm90", x, packed, n, k, 128)
    check(y_auto, ref)
    assert torch.equal(y_auto, y_sm90)


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
def test_gemm_w4a16_sm90_strided_x_and_repeatable():
    """x with a padded row stride (TMA reads rows ldx apart); two runs with the same split are bit-identical."""
    q, s, z = random_w4(272, 576, 64, 19)
    packed = tuple(torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, 64))
    x_full = torch.randn(300, 584, generator=torch.Generator().manual_seed(20)).half()
    ref = x_full[:, :576].double() @ reference_weight(q, s, z, 576, 64).T
    outs = []
    for _ in range(2):
        y = torch.full((300, 272), float("nan"), dtype=torch.float16, device="cuda")
        _core.gemm_w4a16(x_full.cuda()[:, :576], *packed, 272, 576, 64, y, kernel="sm90:4")
        torch.cuda.synchronize()
        outs.append(y.cpu().double())
        check(outs[-1], ref)
    assert torch.equal(outs[0], outs[1])


# Every tile (128 / 256 tokens) x split-K cluster, and the serial mainloop beside the overlapped one: m odd and past
# one and two tiles (65, 129, 300), n with partial 16-row and 128-row tiles, k with a short last group and 65 chunks
# (uneven split ranks), g64 and g128.
SM90_TILED = [f"sm90:{s}:{t}" for t in (128, 256) for s in (1, 2, 4, 8)]


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m", [1, 65, 129, 300])
@pytest.mark.parametrize("n,k,group", [(4103, 576, 64), (272, 4160, 128), (17, 1088, 64)])
def test_gemm_w4a16_sm90_every_tile_and_split(m, n, k, group):
    x, packed, ref, ref_abs = w4_problem(m, n, k, group, seed=5 * m + n + k)
    y_small = gemm_forced("small", x, packed, n, k, group, 1)
    check(y_small, ref)
    for kernel in SM90_TILED:
        y = gemm_forced(kernel, x, packed, n, k, group, 1)
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)
        # The serial mainloop issues the same wgmmas in the same order: bit-identical.
        assert torch.equal(y, gemm_forced(kernel.replace("sm90", "sm90s"), x, packed, n, k, group, 1)), kernel


# The 16 / 32 / 64-token tiles (two CTAs per SM; 5-64 tokens): every split, token counts that leave a partial token
# tile or several, n with partial 16-row and 128-row tiles, k with a short last group and 65 chunks (uneven split
# ranks), g64 and g128: against float64 and the small kernel's weights; the automatic plan's tile is the smallest that
# holds m, and the automatic launch is that plan bit for bit.
@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m", [1, 5, 16, 17, 40, 64, 100])
@pytest.mark.parametrize("n,k,group", [(4103, 576, 64), (272, 4160, 128), (17, 1088, 64)])
def test_gemm_w4a16_sm90_small_tiles(m, n, k, group):
    x, packed, ref, ref_abs = w4_problem(m, n, k, group, seed=7 * m + n + k)
    y_small = gemm_forced("small", x, packed, n, k, group, 1)
    check(y_small, ref)
    for kernel in [f"sm90:{s}:{t}" for t in (16, 32, 64) for s in (0, 1, 2, 4, 8)]:
        y = gemm_forced(kernel, x, packed, n, k, group, 1)
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)
    tokens, split, head = _core.gemm_w4a16_sm90_plan(m, n, k)
    if m <= 64:
        assert tokens == (16 if m <= 16 else 32 if m <= 32 else 64) and split in (1, 2, 4, 8) and head == 0
        assert torch.equal(gemm_forced("sm90", x, packed, n, k, group, 1),
                           gemm_forced(f"sm90:{split}:{tokens}", x, packed, n, k, group, 1))
    else:
        assert tokens == 128  # 65-127 tokens: the 128-token plans as before
    assert _core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90:2:32")[:2] == (32, 2)


@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
def test_gemm_w4a16_sm90_small_tiles_refused_elsewhere():
    """The small tiles exist for the overlapped mainloop with the split producer, 128 rows, DSMEM reduction only."""
    x, packed, _, _ = w4_problem(8, 64, 128, 64, seed=2)
    y = torch.empty(8, 64, dtype=torch.float16, device="cuda")
    for bad in ("sm90s:1:16", "sm90o:1:32"):
        with pytest.raises(ValueError, match="16 / 32 / 64-token tiles"):
            _core.gemm_w4a16(x.cuda(), *packed, 64, 128, 64, y, kernel=bad)
    for bad in ("sm90k:16", "sm90g:2:16"):
        with pytest.raises(ValueError, match=bad):
            _core.gemm_w4a16(x.cuda(), *packed, 64, 128, 64, y, kernel=bad)


# qkv/o/down at M = 256 (128-token tiles, split 2 on o/down), qkv at 1024 and (900, 6100, 4096), (1100, 4103, 4160)
# (on 132 SMs: whole unsplit waves, then the rest split: two launches), a small odd shape; up to 128 tokens stream-K,
# or gate_up at 128 tokens the wide tile unsplit.
@pytest.mark.skipif(not SM90, reason="the wgmma kernel needs sm_90")
@pytest.mark.parametrize("m,n,k", [(256, 6144, 4096), (256, 4096, 4096), (256, 4096, 14336), (1024, 6144, 4096),
                                   (900, 6100, 4096), (1100, 4103, 4160), (300, 1000, 2048), (128, 4096, 14336),
                                   (100, 1000, 2048), (128, 28672, 4096)])
def test_gemm_w4a16_sm90_plan_is_what_runs(m, n, k):
    """The cost model's (tokens, split, head) is valid, and the automatic launch is that plan: bit for bit the forced
    pair, or with a head, the head's tiles as the unsplit kernel computes them and the rest as the split one does."""
    tokens, split, head = _core.gemm_w4a16_sm90_plan(m, n, k)
    rows = _core.gemm_w4a16_sm90_plan_rows(m, n, k)
    tiles_m, tiles = -(-m // tokens), -(-n // rows) * -(-m // tokens)
    assert tokens in (128, 256) and split in (0, 1, 2, 4) and 0 <= head < tiles and (head == 0 or split > 1)
    assert rows == 128 or (rows == 256 and tokens == 128 and split in (0, 1) and head == 0 and m <= 256)
    assert _core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90:2:128") == (128, 2, 0)
    assert _core.gemm_w4a16_sm90_plan_rows(m, n, k, kernel="sm90nw") == 128
    x, packed, ref, _ = w4_problem(m, n, k, 128, seed=m + n)
    y_auto = gemm_forced("sm90", x, packed, n, k, 128)
    check(y_auto, ref)
    # split 0: one stream-K launch over every resident CTA (rows 256: the wide tile's)
    wide = rows == 256
    expect = gemm_forced(f"sm90w:{split}" if wide and split else "sm90wk" if wide else
                         f"sm90:{split}:{tokens}" if split else f"sm90k:{tokens}", x, packed, n, k, 128)
    if head:
        unsplit = gemm_forced(f"sm90:1:{tokens}", x, packed, n, k, 128)
        for t in range(head):
            m0, n0 = t % tiles_m * tokens, t // tiles_m * 128
            expect[m0:m0 + tokens, n0:n0 + 128] = unsplit[m0:m0 + tokens, n0:n0 + 128]
    assert torch.equal(y_auto, expect)


def test_gemm_w4a16_bad_sm90_tile():
    x, packed, _, _ = w4_problem(2, 32, 128, 64, seed=1)
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    for bad in ("sm90:2:48", "sm90:2:", "sm90x", "sm90:0:128:1", "sm90:2:8"):
        with pytest.raises(ValueError, match=f"'sm90:S:T'.*got '{bad}'"):
            _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel=bad)


@pytest.mark.skipif(SM90, reason="checks the refusal on GPUs other than sm_90")
def test_gemm_w4a16_sm90_refused_elsewhere():
    x, packed, _, _ = w4_problem(130, 32, 128, 64, seed=2)
    y = torch.empty(130, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(NotImplementedError, match="the sm90 kernel needs an sm_90 device"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="sm90")


def test_gemm_w4a16_bad_sm90_split():
    x, packed, _, _ = w4_problem(2, 32, 128, 64, seed=1)
    y = torch.empty(2, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="'sm90' or 'sm90:S'.*got 'sm90:3'"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="sm90:3")


# ---- groups of 32 (GGUF Q4_0 / Q4_1 store them) and weights kept as w = q*s + m (Q4_1's mins) ----
# A 64-k packed chunk then holds two groups (g32) or, for an odd multiple of 32 (g96), one group in one
# half and the next in the other: every kernel reads the parameters per half chunk.
def random_w4_mins(n, k, group, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    groups = (k + group - 1) // group
    scales = (torch.rand(n, groups, generator=g) * 0.02 + 0.002).half()
    mins = (-torch.rand(n, groups, generator=g) * 0.15).half()
    return q, scales, mins


def reference_weight_mins(q, scales, mins, k, group):
    idx = torch.arange(k) // group
    return unpack_nibbles(q, k).double() * scales.double()[:, idx] + mins.double()[:, idx]


def half_chunk_problem(m, n, k, group, with_mins, seed):
    """(x, packed on the GPU, mins flag, float64 reference y, |x|·|W|ᵀ) for a zero-point or a min weight."""
    if with_mins:
        q, s, mn = random_w4_mins(n, k, group, seed)
        packed = _core.pack_w4_sm80(q, s, None, group, mins=mn)
        w = reference_weight_mins(q, s, mn, k, group)
    else:
        q, s, z = random_w4(n, k, group, seed)
        packed = _core.pack_w4_sm80(q, s, z, group)
        w = reference_weight(q, s, z, k, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).half()
    return x, tuple(torch.from_dlpack(t).cuda() for t in packed), x.double() @ w.T, x.double().abs() @ w.abs().T


def gemm_forced_mins(kernel, x, packed, n, k, group, mins, split_k=0):
    y_full = torch.full((x.shape[0], n + 1), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    _core.gemm_w4a16(x.cuda(), *packed, n, k, group, y, split_k=split_k, kernel=kernel, mins=mins)
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:]).all(), "wrote past n"
    return y.cpu().double()


# m: decode tiles (1, 9), the small kernel's 64-token tile, the large / wgmma tiles (130, 300); k: one
# group per half chunk (g32), groups straddling chunks (g96, a short last group at k = 640).
@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("m", [1, 9, 64, 130, 300])
@pytest.mark.parametrize("n,k,group", [(272, 576, 32), (17, 4160, 32), (4103, 640, 96), (272, 2048, 32)])
def test_gemm_w4a16_half_chunk_groups_and_mins_every_kernel(with_mins, m, n, k, group):
    x, packed, ref, ref_abs = half_chunk_problem(m, n, k, group, with_mins, seed=m + n + k + group + with_mins)
    y_small = gemm_forced_mins("small", x, packed, n, k, group, with_mins)
    check(y_small, ref)
    y_split = gemm_forced_mins("small", x, packed, n, k, group, with_mins, split_k=3)
    check(y_split, ref)
    kernels = ["large:64x128", "large:128x128"] + (["sm90", "sm90:2", "sm90:8"] if SM90 else [])
    kernels += ["gemv", "gemv:1"] if m <= 8 else []
    for kernel in kernels:
        y = gemm_forced_mins(kernel, x, packed, n, k, group, with_mins)
        check(y, ref)
        check_same_weights(y, y_small, ref_abs)


def test_gemm_w4a16_mins_are_not_zero_points():
    """The mins flag changes the math (q*s + m, not (q - z)*s): a min weight read as zeros is far off, so the
    flag reaches every kernel (a kernel ignoring it would pass only if the two readings agreed)."""
    x, packed, ref, _ = half_chunk_problem(130, 272, 576, 32, True, seed=7)
    for kernel in ["small", "large"] + (["sm90"] if SM90 else []):
        wrong = gemm_forced_mins(kernel, x, packed, 272, 576, 32, False)
        assert (wrong - ref).norm() / ref.norm() > 0.1, kernel
        check(gemm_forced_mins(kernel, x, packed, 272, 576, 32, True), ref)


def test_pack_sm80_round_trips_mins_and_g32():
    """QuantizedWeight with mins (GGUF Q4_1) packs for the GPU and unpacks to the same q, scales and mins."""
    q, s, mn = random_w4_mins(40, 192, 32, 3)
    w = _core.QuantizedWeight("w4", unpack_nibbles(q, 192).to(torch.uint8).numpy(), s.numpy(), group=32,
                              mins=mn.numpy())
    back = _core.unpack_weight(_core.pack_weight(w, "sm80", "cuda:0"))
    assert back.zeros is None and back.group == 32
    assert torch.equal(torch.from_dlpack(back.mins), mn)
    assert torch.equal(torch.from_dlpack(back.scales), s)
    with pytest.raises(ValueError, match="'mins' .* without 'zeros'"):
        _core.pack_w4_sm80(q, s, s, 32, mins=mn)
