"""Every op of the forward pass on the GPU against the CPU op (and float64 where the CPU op is itself
the reference): fresh random data, odd shapes, outputs poisoned with NaN before each run.

Tolerances: the GPU and CPU kernels both compute in f32 and round once to the output dtype, so they
differ by the order of f32 sums (~1e-6 relative) plus at most one output ulp where that order tips a
rounding: f16 ulp = 2^-10 relative (tolerance 2e-3), bf16 2^-7 (1.6e-2), f32 outputs 1e-5. Copies and
the KV quantization (same IEEE f32 division, round half to even) are compared bit-exactly."""
import math

import pytest
import torch

import lowbit
from lowbit import _core as lb

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
RTOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}


def sm():
    """This GPU's compute capability as the registry spells it (90 for sm_90)."""
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


# The pytestmark of the Hopper prefill kernel's test files (test_gpu_prefill_sm90*.py): a GPU, and an sm_90 one.
SM90_ONLY = [pytest.mark.gpu, pytest.mark.skipif(not (lowbit.cuda_available() and sm() == 90),
                                                 reason="needs an sm_90 GPU (the wgmma kernel runs there only)")]


def rnd(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(DT[dtype] if isinstance(dtype, str) else dtype)


def nan_like(t, device="cuda"):
    return torch.full(t.shape, float("nan"), dtype=t.dtype, device=device)


def close(got, ref, dtype, atol_scale=None):
    got, ref = got.double().cpu(), ref.double().cpu()
    assert not torch.isnan(got).any(), "output left (partly) unwritten"
    rtol = RTOL[dtype]
    atol = rtol * (atol_scale if atol_scale is not None else float(ref.abs().max()))
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


# ---- row ops ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("T,H", [(1, 64), (7, 576), (33, 999)])
def test_rms_norm_and_fused_add(dtype, T, H):
    x, w = rnd((T, H), dtype, 1), rnd((H,), dtype, 2)
    out = nan_like(x)
    lb.rms_norm(x.cuda(), w.cuda(), 1e-5, out)
    ref = x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-5) * w.double()
    close(out, ref, dtype)

    res, add = rnd((T, H), dtype, 3), rnd((T, H), dtype, 4)
    res_gpu, out = res.cuda(), nan_like(x)
    lb.add_rms_norm(res_gpu, add.cuda(), w.cuda(), 1e-5, out)
    res_cpu, out_cpu = res.clone(), torch.empty_like(x)
    lb.add_rms_norm(res_cpu, add, w, 1e-5, out_cpu)
    assert torch.equal(res_gpu.cpu(), res_cpu)  # one rounded f32 add: exact
    close(out, out_cpu, dtype)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("T,I", [(1, 96), (5, 1536), (17, 333)])
def test_silu_mul(dtype, T, I):
    gu = rnd((T, 2 * I), dtype, 5, 3.0)
    out = nan_like(gu[:, :I])
    lb.silu_mul(gu.cuda(), out)
    g, u = gu[:, :I].double(), gu[:, I:].double()
    close(out, g * torch.sigmoid(g) * u, dtype)


def off_boundary(t):
    """A GPU copy of 2-D `t` whose rows start one element past a 16-byte boundary (stride cols + 1)."""
    spare = torch.empty(t.shape[0], t.shape[1] + 1, dtype=t.dtype, device="cuda")
    view = spare[:, 1:]
    view.copy_(t)
    return view


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("T,H", [(300, 4096), (9, 5120), (3, 8192)])
@pytest.mark.parametrize("layout", ["aligned", "x_offset", "out_offset"])
def test_rms_norm_wide_rows_in_every_layout(dtype, T, H, layout):
    """Rows the norm reads in 8-column groups (aligned), element by element (x one element off a 16-byte
    boundary), and grouped loads with element stores (out off the boundary): all three against float64, and the
    fused add's residual exact."""
    x, w, res, add = rnd((T, H), dtype, 11), rnd((H,), dtype, 12), rnd((T, H), dtype, 13), rnd((T, H), dtype, 14)
    x_gpu = off_boundary(x) if layout == "x_offset" else x.cuda()
    add_gpu = off_boundary(add) if layout == "x_offset" else add.cuda()
    for fused in (False, True):
        nan = torch.full((T, H), float("nan"), dtype=DT[dtype])
        out = off_boundary(nan) if layout == "out_offset" else nan.cuda()
        if not fused:
            lb.rms_norm(x_gpu, w.cuda(), 1e-5, out)
            ref = x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-5) * w.double()
            close(out, ref, dtype)
            continue
        res_gpu = off_boundary(res) if layout == "x_offset" else res.cuda()
        lb.add_rms_norm(res_gpu, add_gpu, w.cuda(), 1e-5, out)
        res_cpu, out_cpu = res.clone(), torch.empty(T, H, dtype=DT[dtype])
        lb.add_rms_norm(res_cpu, add, w, 1e-5, out_cpu)
        assert torch.equal(res_gpu.cpu(), res_cpu)  # one rounded f32 add: exact
        close(out, out_cpu, dtype)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_silu_mul_in_8_column_groups_is_the_element_kernel_bit_for_bit(dtype):
    """The grouped kernel (16-byte loads) and the element kernel (taken when the rows sit one element off a
    16-byte boundary) compute the same f32 expression per element: equal bits, on 1000 rows of Llama's 14336."""
    I = 14336
    gu = rnd((1000, 2 * I), dtype, 15, 3.0)
    aligned, shifted = gu.cuda(), off_boundary(gu)
    out_a, out_s = nan_like(gu[:, :I]), nan_like(gu[:, :I])
    lb.silu_mul(aligned, out_a)
    lb.silu_mul(shifted, out_s)
    assert torch.equal(out_a, out_s)
    g, u = gu[:, :I].double(), gu[:, I:].double()
    close(out_a, g * torch.sigmoid(g) * u, dtype)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_embedding_is_an_exact_gather(dtype):
    table = rnd((301, 77), dtype, 6)
    ids = torch.tensor([0, 300, 5, 5, 123, 7, 299], dtype=torch.int32)
    out = nan_like(torch.empty(7, 77, dtype=DT[dtype]))
    lb.embedding(ids.cuda(), table.cuda(), out)
    assert torch.equal(out.cpu(), table[ids.long()])


def test_embedding_out_of_range_id_gives_a_nan_row():
    table = rnd((10, 8), "f16", 7)
    out = torch.zeros(3, 8, dtype=torch.float16, device="cuda")
    lb.embedding(torch.tensor([1, 10, -1], dtype=torch.int32).cuda(), table.cuda(), out)
    assert torch.equal(out[0].cpu(), table[1])
    assert torch.isnan(out[1:]).all()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_gather_columns_is_an_exact_gather(dtype):
    """The act-order input permutation: strided rows, odd k, more rows than one grid row of blocks covers."""
    x = rnd((70000, 2 * 37), dtype, 8)[:, 3:3 + 37].cuda()
    perm = torch.randperm(37, generator=torch.Generator().manual_seed(9)).to(torch.int32)
    out = nan_like(torch.empty(70000, 37, dtype=DT[dtype], device="cuda"))
    lb.gather_columns(x, perm.cuda(), out)
    assert torch.equal(out, x[:, perm.long().cuda()])


def test_gather_columns_bad_perm_entry_gives_nan():
    x = rnd((4, 6), "f16", 10).cuda()
    out = torch.zeros(4, 6, dtype=torch.float16, device="cuda")
    lb.gather_columns(x, torch.tensor([5, 4, 6, -1, 0, 1], dtype=torch.int32).cuda(), out)
    assert torch.equal(out[:, [0, 1, 4, 5]], x[:, [5, 4, 0, 1]])
    assert torch.isnan(out[:, 2:4]).all()


# ---- rope -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("llama3", [False, True])
def test_rope_matches_cpu(dtype, neox, llama3):
    T, hq, hkv, d = 9, 6, 2, 128
    qkv = rnd((T, hq + 2 * hkv, d), dtype, 8)
    pos = torch.tensor([0, 1, 2, 17, 1000, 4095, 8191, 65000, 131071], dtype=torch.int32)
    kw = dict(theta=500000.0, neox=neox, llama3=llama3, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position=8192)
    gpu = qkv.cuda()
    lb.rope(gpu[:, :hq], gpu[:, hq:hq + hkv], pos.cuda(), **kw)  # strided views of a fused buffer
    cpu = qkv.clone()
    lb.rope(cpu[:, :hq], cpu[:, hq:hq + hkv], pos, **kw)
    assert torch.equal(gpu[:, hq + hkv:].cpu(), qkv[:, hq + hkv:])  # v untouched
    close(gpu, cpu, dtype, atol_scale=4.0)


def test_rope_partial_rotary_dim_leaves_the_rest():
    x = rnd((3, 2, 64), "f32", 9)
    gpu = x.cuda()
    lb.rope(gpu, None, torch.tensor([5, 6, 7], dtype=torch.int32).cuda(), rotary_dim=32)
    cpu = x.clone()
    lb.rope(cpu, None, torch.tensor([5, 6, 7], dtype=torch.int32), rotary_dim=32)
    assert torch.equal(gpu[..., 32:].cpu(), x[..., 32:])
    close(gpu, cpu, "f32", atol_scale=4.0)


# ---- KV write and attention ---------------------------------------------------------------------
def twin_caches(layers, hkv, d, blocks, bs, kt, vt):
    return (lb.KVCache(layers, hkv, d, blocks, bs, kt, vt, "cuda"), lb.KVCache(layers, hkv, d, blocks, bs, kt, vt, "cpu"))


def t(x):
    return torch.from_dlpack(x)


@pytest.mark.parametrize("kt,vt", [("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u8", "u4"), ("f32", "bf16"),
                                   ("u2", "u2"), ("u4", "u2"), ("u2", "f16")])
@pytest.mark.parametrize("d", [64, 80, 128])
def test_kv_write_bit_exact_with_cpu(kt, vt, d):
    hkv, bs, blocks, T = 3, 16, 9, 21
    k, v = rnd((T, hkv, d), "f16", 10, 2.0), rnd((T, hkv, d), "f16", 11)
    k[4] = 0.5  # a constant row: scale 0, codes 0
    slots = torch.randperm(blocks * bs, generator=torch.Generator().manual_seed(12))[:T].to(torch.int32)
    slots[3] = -1  # padding token: skipped
    gpu, cpu = twin_caches(2, hkv, d, blocks, bs, kt, vt)
    meta_g = lb.AttentionMeta([0], [T], [T], torch.zeros(1, 1, dtype=torch.int32).cuda(), slots.cuda())
    meta_c = lb.AttentionMeta([0], [T], [T], torch.zeros(1, 1, dtype=torch.int32), slots)
    lb.kv_write(gpu, 1, k.cuda(), v.cuda(), meta_g)
    lb.kv_write(cpu, 1, k, v, meta_c)
    for get in ("k_data", "v_data", "k_params", "v_params"):
        a, b = getattr(gpu, get)(1), getattr(cpu, get)(1)
        if b is None:
            assert a is None
            continue
        assert torch.equal(t(a).cpu().view(torch.uint8), t(b).view(torch.uint8)), get
    assert not t(gpu.k_data(0)).cpu().view(torch.uint8).any()  # other layers untouched


def cache_bytes(cache, layer):
    out = {}
    for get in ("k_data", "v_data", "k_params", "v_params"):
        x = getattr(cache, get)(layer)
        out[get] = None if x is None else t(x).cpu().view(torch.uint8)
    return out


# rope_kv_write against rope then kv_write on the GPU: two sequences whose tokens straddle a page
# boundary of non-contiguous pages, positions not starting at 0, a padding token, GQA, odd counts.
ROPE_KW = {"default": {}, "llama3_gptj": dict(theta=500000.0, neox=False, llama3=True, factor=8.0,
                                              low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192),
           "partial": dict(rotary_dim=32, theta=1e6)}


@pytest.mark.parametrize("kt,vt", [("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u8", "u4"), ("u2", "u2"), ("u8", "u2")])
@pytest.mark.parametrize("d", [64, 128, 256])  # the 16-byte kernel's three widths ("partial": the general kernel)
@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 3), (4, 4)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("rope", list(ROPE_KW))
def test_rope_kv_write_equals_rope_then_kv_write(kt, vt, d, hq, hkv, dtype, rope):
    bs, blocks = 16, 11
    table1, table2 = [5, 1, 8], [0, 2, 3, 4, 6, 7, 9, 10]
    pos1, pos2 = list(range(29, 36)), list(range(110, 117))  # pages 1 -> 8 and 9 -> 10
    positions = pos1 + pos2 + [3]
    slots = [table1[p // bs] * bs + p % bs for p in pos1] + [table2[p // bs] * bs + p % bs for p in pos2] + [-1]
    T = len(positions)  # 15
    qkv = rnd((T, hq + 2 * hkv, d), dtype, 20 + d + hq, 2.0)
    qkv[4, hq] = 0.25  # a constant k row: scale 0, codes 0
    pos = torch.tensor(positions, dtype=torch.int32).cuda()
    meta = lb.AttentionMeta([], [], [], slot_mapping=torch.tensor(slots, dtype=torch.int32).cuda())
    kw = ROPE_KW[rope]
    results = []
    for fused in (False, True):
        cache = lb.KVCache(2, hkv, d, blocks, bs, kt, vt, "cuda")
        buf = qkv.cuda()
        q, k, v = buf[:, :hq], buf[:, hq:hq + hkv], buf[:, hq + hkv:]  # strided views, as in the model
        if fused:
            lb.rope_kv_write(q, k, v, pos, cache, 1, meta, **kw)
        else:
            lb.rope(q, k, pos, **kw)
            lb.kv_write(cache, 1, k, v, meta)
        torch.cuda.synchronize()
        results.append((buf.cpu(), cache_bytes(cache, 1), cache_bytes(cache, 0)))
    (buf0, c0, other0), (buf1, c1, other1) = results
    assert torch.equal(buf0.view(torch.int16), buf1.view(torch.int16))  # q and k bit for bit (v too)
    assert torch.equal(buf1[:, hq + hkv:], qkv[:, hq + hkv:])  # v untouched
    for get in c0:
        if c0[get] is None:
            assert c1[get] is None
            continue
        assert torch.equal(c0[get], c1[get]), get
        assert torch.equal(other0[get], other1[get]), get  # the other layer untouched by both


def test_rope_kv_write_without_q_and_f32_cache():
    hkv, d, bs, T = 2, 64, 16, 5
    kv = rnd((T, 2 * hkv, d), "f32", 30)
    pos = torch.arange(7, 7 + T, dtype=torch.int32).cuda()
    meta = lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([40, 9, 10, 63, 0], dtype=torch.int32).cuda())
    results = []
    for fused in (False, True):
        cache = lb.KVCache(1, hkv, d, 4, bs, "f32", "bf16", "cuda")
        buf = kv.cuda()
        if fused:
            lb.rope_kv_write(None, buf[:, :hkv], buf[:, hkv:], pos, cache, 0, meta)
        else:
            lb.rope(None, buf[:, :hkv], pos)
            lb.kv_write(cache, 0, buf[:, :hkv], buf[:, hkv:], meta)
        results.append((buf.cpu(), cache_bytes(cache, 0)))
    assert torch.equal(results[0][0], results[1][0])
    for get in ("k_data", "v_data"):
        assert torch.equal(results[0][1][get], results[1][1][get]), get


def test_rope_kv_write_gpu_errors():
    cache = lb.KVCache(1, 2, 64, 4, 16, "u8", "u8", "cuda")
    q, k = torch.randn(3, 4, 64, device="cuda").half(), torch.randn(3, 2, 64, device="cuda").half()
    pos = torch.tensor([0, 1, 2], dtype=torch.int32).cuda()
    meta = lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 1, 2], dtype=torch.int32).cuda())
    with pytest.raises(TypeError, match="rope_kv_write: argument 'positions' is on cpu but argument 'q' is on cuda"):
        lb.rope_kv_write(q, k, k, pos.cpu(), cache, 0, meta)
    with pytest.raises(TypeError, match="rope_kv_write: the KV cache is on cuda.* but the other operands are on cpu"):
        lb.rope_kv_write(q.cpu(), k.cpu(), k.cpu(), pos.cpu(), cache, 0,
                         lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 1, 2], dtype=torch.int32)))
    with pytest.raises(NotImplementedError, match="rope_kv_write: rotary_dim 512 has no GPU kernel"):
        big = lb.KVCache(1, 1, 512, 2, 16, "f16", "f16", "cuda")
        x = torch.randn(3, 1, 512, device="cuda").half()
        lb.rope_kv_write(None, x, x, pos, big, 0, meta)


def attention_case(lens_q, lens_kv, hq, hkv, d, kt, vt, qdtype, seed, bs=16, gap=0, kernel="", scale=None):
    """Fills twin caches through kv_write with the same random K/V, returns the outputs of
    paged_attention on both devices (GPU output poisoned first, with a spare NaN row at the end and
    `gap` NaN rows before each sequence's rows); `kernel` forces the GPU's attention kernel; `scale` is the softmax
    scale (default 1/sqrt(d))."""
    scale = 1 / math.sqrt(d) if scale is None else scale
    g = torch.Generator().manual_seed(seed)
    n = len(lens_q)
    blocks_per = [math.ceil(L / bs) for L in lens_kv]
    num_blocks = sum(blocks_per) + 2
    perm = torch.randperm(num_blocks, generator=g)
    width = max(blocks_per)
    table = torch.full((n, width), -1, dtype=torch.int32)
    p = 0
    for i, nb in enumerate(blocks_per):
        table[i, :nb] = perm[p:p + nb]
        p += nb
    gpu, cpu = twin_caches(1, hkv, d, num_blocks, bs, kt, vt)
    # Write every cached token (old and new) of every sequence.
    slots = torch.cat([table[i, torch.arange(L) // bs].long() * bs + torch.arange(L) % bs
                       for i, L in enumerate(lens_kv)]).to(torch.int32)
    total = int(slots.numel())
    k = torch.randn(total, hkv, d, generator=g).half()
    v = torch.randn(total, hkv, d, generator=g).half()
    wm_c = lb.AttentionMeta([0], [total], [total], table[:1], slots)
    wm_g = lb.AttentionMeta([0], [total], [total], table[:1].cuda(), slots.cuda())
    lb.kv_write(cpu, 0, k, v, wm_c)
    lb.kv_write(gpu, 0, k.cuda(), v.cuda(), wm_g)
    q_start = [sum(lens_q[:i]) + gap * (i + 1) for i in range(n)]
    T = sum(lens_q) + gap * n + 1  # rows outside every sequence stay NaN
    q = (torch.randn(T, hq, d, generator=g)).to(DT[qdtype])
    meta_c = lb.AttentionMeta(q_start, lens_q, lens_kv, table, slots[:1])
    meta_g = lb.AttentionMeta(q_start, lens_q, lens_kv, table.cuda(), slots[:1].cuda())
    out_c = torch.full_like(q, float("nan"))
    out_g = nan_like(q)
    lb.paged_attention(q, cpu, 0, meta_c, scale, out_c)
    lb.paged_attention(q.cuda(), gpu, 0, meta_g, scale, out_g, kernel=kernel)
    return out_g.cpu(), out_c


@pytest.mark.parametrize("kv", [("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u8", "u4")])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (8, 2, 128), (4, 4, 80), (16, 2, 64)])
def test_prefill_attention_mixed_batch(kv, hq, hkv, d):
    # Chunked prefill (q_len < kv_len), a fresh prompt, a decode row, and a long prompt past one block.
    lens_q, lens_kv = [5, 1, 23, 40], [29, 17, 23, 40]
    out_g, out_c = attention_case(lens_q, lens_kv, hq, hkv, d, *kv, "f16", seed=hq * 7 + d)
    assert torch.isnan(out_g[-1]).all()  # the row outside every sequence is left untouched
    close(out_g[:-1], out_c[:-1], "f16", atol_scale=1.0)


@pytest.mark.parametrize("qdtype", ["f32", "bf16"])
def test_prefill_attention_float_queries(qdtype):
    out_g, out_c = attention_case([7, 3], [7, 50], 6, 2, 64, "f16", "f16", qdtype, seed=3)
    close(out_g[:-1], out_c[:-1], qdtype, atol_scale=1.0)


# The tensor-core prefill kernel (f16 q/out, head_dim 64/128, K and V each f16/u8/u4) works on query
# tiles of 64 rows and key tiles of 64 keys gathered page by page. Tolerance: the CPU path computes in
# f32 from the f32 dequantized cache; the kernel rounds dequantized K/V (u8/u4) and the softmax
# weights P to f16 before the mma (each 2^-11 relative), then the output once to f16. The P and V
# roundings move o = Σ p v / Σ p by at most 2^-11 · max|v| only if every error had the same sign; K's
# moves a score by ~2^-11 · |scale q·k|. With random signs they stay near 1e-4: a float64 model of
# these roundings (300 rows over 777 keys, D 64/128, f16/u8/u4) used at most 12% of the file's f16
# tolerance (rtol 2e-3, atol 2e-3 · 1.0), while any wrong key, row, mask or page (errors ~0.1) fails.
TC_ATOL_SCALE = 1.0
TC_LENS = {
    # fresh prompts: q_len = kv_len around the 64-row tile edges
    "fresh": ([1, 63, 64, 65, 200], [1, 63, 64, 65, 200]),
    # chunked prefill: kv_len > q_len, neither a multiple of 64 (diagonal tiles straddle key tiles)
    "chunked": ([1, 63, 64, 65, 130], [100, 127, 141, 255, 163]),
}


def check_tc_case(lens_q, lens_kv, hq, hkv, d, kt, vt, seed, bs, gap=1, kernel="prefill_attention_tc_sm80",
                  scale=None):
    """The prefill kernel `kernel` (forced by name: on sm_90 the automatic choice is the wgmma kernel) against the
    CPU on rows inside the sequences; rows outside must stay NaN."""
    out_g, out_c = attention_case(lens_q, lens_kv, hq, hkv, d, kt, vt, "f16", seed=seed, bs=bs, gap=gap,
                                  kernel=kernel, scale=scale)
    inside = torch.zeros(out_g.shape[0], dtype=torch.bool)
    for i, L in enumerate(lens_q):
        start = sum(lens_q[:i]) + gap * (i + 1)
        inside[start:start + L] = True
    assert torch.isnan(out_g[~inside]).all(), "a row outside every sequence was written"
    close(out_g[inside], out_c[inside], "f16", atol_scale=TC_ATOL_SCALE)


@pytest.mark.parametrize("lens", ["fresh", "chunked"])
@pytest.mark.parametrize("kv", [("f16", "f16"), ("u8", "u4"), ("u4", "u8")], ids=["f16-f16", "u8-u4", "u4-u8"])
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 128), (4, 1, 64), (6, 6, 64)])
@pytest.mark.parametrize("bs", [16, 24])
def test_prefill_tc_tile_edges(lens, kv, hq, hkv, d, bs):
    # bs 24 does not divide the 64-key tile: pages change inside a tile.
    lens_q, lens_kv = TC_LENS[lens]
    check_tc_case(lens_q, lens_kv, hq, hkv, d, *kv, seed=hq + d + bs, bs=bs)


@pytest.mark.parametrize("kv", [("f16", "f16"), ("u8", "u8"), ("u4", "u4")], ids=["f16-f16", "u8-u8", "u4-u4"])
def test_prefill_tc_llama_heads_long_chunk(kv):
    # Llama-3-8B heads (GQA 4:1, D 128), a 300-row chunk over 777 cached tokens, pages of 1 and 32.
    check_tc_case([300], [777], 32, 8, 128, *kv, seed=11, bs=32)
    check_tc_case([70, 3], [70, 5], 32, 8, 128, *kv, seed=12, bs=1)


@pytest.mark.parametrize("kv", [("f16", "f16"), ("u8", "u8"), ("u4", "u4")])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (32, 8, 128), (16, 1, 128), (8, 2, 256)])
def test_decode_step_takes_the_decode_kernel_and_matches_cpu(kv, hq, hkv, d):
    """A decode step (one query per sequence) is the registry's decode kernel: it is what the lookup picks
    for this descriptor, and forced by name it runs (a kernel that cannot run raises) and matches the CPU."""
    picked = lb.kernels.select_attention(device="cuda", sm=sm(), phase="decode", head_dim=d, q="f16", k=kv[0],
                                         v=kv[1], gqa=hq // hkv)
    assert picked["kernel"] == "decode_attention_sm80" and not picked["fallback"], picked
    lens_kv = [1, 16, 17, 300, 45]
    out_g, out_c = attention_case([1] * 5, lens_kv, hq, hkv, d, *kv, "f16", seed=d + hq, kernel="decode_attention_sm80")
    close(out_g[:-1], out_c[:-1], "f16", atol_scale=1.0)


@pytest.mark.parametrize("kv", [("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u2", "u2")],
                         ids=["f16-f16", "u8-u8", "u4-u4", "u2-u2"])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (32, 8, 128)])
def test_mixed_step_runs_its_decode_rows_on_the_decode_kernel(kv, hq, hkv, d):
    """A mixed step as the scheduler builds it (running decodes first, then prefill chunks, one of them over a
    cached prefix, and a decode row after them) runs the leading decode rows on the decode kernel and the rest on
    the prefill kernel (a prefill kernel would spend a whole query tile per decode row); both parts match the
    CPU."""
    lens_q, lens_kv = [1, 1, 1, 40, 7, 1], [300, 17, 1, 40, 90, 33]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out_g, out_c = attention_case(lens_q, lens_kv, hq, hkv, d, *kv, "f16", seed=d + 5 * hq)
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages()]
    if names:  # (under compute-sanitizer the profiler records no kernel at all, not even the cache writes)
        assert any("decode_attention" in n for n in names), names
        assert any("prefill_attention" in n for n in names), names
    assert torch.isnan(out_g[-1]).all()  # the row outside every sequence is left untouched
    close(out_g[:-1], out_c[:-1], "f16", atol_scale=1.0)


def test_forcing_the_decode_kernel_on_a_prefill_step_names_the_reason():
    with pytest.raises(NotImplementedError, match="forced kernel decode_attention_sm80 cannot run .*decode steps only"):
        attention_case([5, 1], [29, 17], 8, 2, 64, "u8", "u8", "f16", seed=1, kernel="decode_attention_sm80")


# ---- linear -----------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 5, 70])
@pytest.mark.parametrize("n,k", [(200, 576), (1536, 576), (64, 1536)])
def test_w4a16_linear_matches_cpu(m, n, k):
    w = rnd((n, k), "f32", 20, 0.05)
    qw = lb.quantize_weight(w, "w4", 128)
    x = rnd((m, k), "f16", 21)
    bias = rnd((n,), "f16", 22)
    y = nan_like(torch.empty(m, n, dtype=torch.float16))
    lb.linear(x.cuda(), lb.pack_weight(qw, "sm80", "cuda"), bias.cuda(), y)
    ref = x.double() @ t(lb.dequantize_weight(qw)).double().T + bias.double()
    close(y, ref, "f16")


# Default dispatch: m = 1 runs the f16 GEMV, m >= 2 the mma kernel where rows are 16-byte aligned, else the GEMV
# (m <= 16) or the wmma kernel; k = 100 (rows not 16-byte aligned) takes those fallbacks, the strided x (row
# stride 104) the aligned ones, n = 49 leaves partial tiles. Each kernel forced: test_gpu_f16_gemm.py.
@pytest.mark.parametrize("m", [1, 3, 16, 17, 70])
@pytest.mark.parametrize("n,k,x_stride", [(576, 576, 576), (49, 100, 100), (1536, 96, 104)])
def test_f16_linear_matches_float64(m, n, k, x_stride):
    w = rnd((n, k), "f32", 24, 0.05)
    qw = lb.quantize_weight(w, "f16", 128)
    xg = rnd((m, x_stride), "f16", 25).cuda()[:, :k]
    x = xg.cpu()
    bias = rnd((n,), "f16", 26)
    y = nan_like(torch.empty(m, n, dtype=torch.float16))
    lb.linear(xg, lb.pack_weight(qw, "sm80", "cuda"), bias.cuda(), y)
    ref = x.double() @ t(lb.dequantize_weight(qw)).double().T + bias.double()
    close(y, ref, "f16")
    y2 = nan_like(torch.empty(m, n, dtype=torch.float16))
    lb.linear(xg, lb.pack_weight(qw, "sm80", "cuda"), out=y2)
    close(y2, ref - bias.double(), "f16")


def test_linear_errors():
    qw = lb.quantize_weight(rnd((64, 128), "f32", 23), "w4", 64)
    on_gpu = lb.pack_weight(qw, "sm80", "cuda")
    with pytest.raises(TypeError, match="linear: argument 'w.data' is on cuda:0 but argument 'x' is on cpu"):
        lb.linear(torch.zeros(2, 128, dtype=torch.float16), on_gpu)
    with pytest.raises(NotImplementedError, match="linear: GPU linears take f16 activations, got f32"):
        lb.linear(torch.zeros(2, 128).cuda(), on_gpu, out=torch.zeros(2, 64).cuda())
    with pytest.raises(NotImplementedError, match="act=fmpq"):
        lb.linear(torch.ones(2, 128, dtype=torch.float16).cuda(), on_gpu, act="fmpq",
                  out=torch.zeros(2, 64, dtype=torch.float16).cuda())


def test_mixed_devices_are_refused_with_both_names():
    x = torch.ones(2, 8, dtype=torch.float16)
    with pytest.raises(TypeError, match="rms_norm: argument 'weight' is on cpu but argument 'x' is on cuda:0"):
        lb.rms_norm(x.cuda(), x[0], 1e-5, nan_like(x))
    cache = lb.KVCache(1, 1, 64, 2, 16, "f16", "f16", "cpu")
    q = torch.zeros(1, 1, 64, dtype=torch.float16).cuda()
    meta = lb.AttentionMeta([0], [1], [1], torch.zeros(1, 1, dtype=torch.int32).cuda(),
                            torch.zeros(1, dtype=torch.int32).cuda())
    with pytest.raises(TypeError, match="paged_attention: the KV cache is on cpu but the other operands are on cuda:0"):
        lb.paged_attention(q, cache, 0, meta, 0.1, torch.empty_like(q))


# ---- sampling ---------------------------------------------------------------------------------
SAMPLING = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 40, 1.0, 0.0), (1.3, 0, 0.9, 0.0),
            (0.8, 50, 0.95, 0.05), (1.0, 1, 1.0, 0.0), (2.0, 0, 0.5, 0.1), (0.5, 7000, 0.3, 0.0)]


@pytest.mark.parametrize("dtype", ["f16", "f32", "bf16"])
def test_sample_rows_picks_the_host_samplers_token(dtype):
    """The device sampler against ops::sample_token on the same values, row by row: same token for
    greedy, temperature, top-k, top-p, min-p and their mix, at uniforms from 0 to just below 1.
    f16/bf16 logits hold many exactly equal values, and rows get a tied maximum and -inf entries:
    ties must break to the lower id as on the host. The host sums in double in sorted order, the device
    in double in another order, so only a uniform within ~1e-15 of a CDF step could differ."""
    vocab, per_config = 5003, 12
    g = torch.Generator().manual_seed(3)
    rows, params = [], []
    for c, (t, k, p, mp) in enumerate(SAMPLING):
        for j in range(per_config):
            row = (torch.randn(vocab, generator=g) * (1 + j % 4)).to(DT[dtype]).float()
            if j % 3 == 0:
                row[torch.randint(0, vocab, (9,), generator=g)] = row.max()  # a tied maximum
            if j % 4 == 1:
                row[torch.randint(0, vocab, (50,), generator=g)] = float("-inf")
            u = [0.0, 0.999999][j] if j < 2 else float(torch.rand((), generator=g))
            rows.append(row)
            params.append([t, k, p, mp, u])
    logits = torch.stack(rows).to(DT[dtype]).cuda()
    prm = torch.tensor(params, dtype=torch.float64).cuda()
    tokens = torch.full((len(rows),), -7, dtype=torch.int32, device="cuda")
    logprobs = torch.full((len(rows),), float("nan"), device="cuda")
    lb.sample_rows(logits, prm.view(torch.int64), tokens, logprobs)
    for i, (row, (t, k, p, mp, u)) in enumerate(zip(logits.float().cpu(), params)):
        want = lb.sample_token(row.contiguous(), temperature=t, top_k=k, top_p=p, min_p=mp, uniform=u)
        assert int(tokens[i]) == want, f"row {i}: params {params[i]}"
        assert abs(float(logprobs[i]) - lb.token_logprob(row.contiguous(), want)) < 1e-4


def test_sample_rows_spreads_like_the_distribution():
    """Evenly spaced uniforms on one row: the inverse CDF gives each top-k token a share of the
    uniforms equal to its probability under softmax(l / T) restricted to the top k, up to one uniform
    (1 / n) at each end of its interval; a skewed or misordered CDF walk is off by whole percents."""
    g = torch.Generator().manual_seed(5)
    row = torch.randn(300, generator=g) * 2
    n = 20000
    logits = row.repeat(n, 1).cuda()
    prm = torch.tensor([[0.9, 6, 1.0, 0.0, (i + 0.5) / n] for i in range(n)], dtype=torch.float64).cuda()
    tokens = torch.empty(n, dtype=torch.int32, device="cuda")
    lb.sample_rows(logits, prm.view(torch.int64), tokens, torch.empty(n, device="cuda"))
    top = torch.topk(row, 6).indices
    p = torch.softmax(row[top] / 0.9, 0)
    freq = torch.bincount(tokens.long().cpu(), minlength=300).double() / n
    assert float(freq.sum() - freq[top].sum()) == 0.0
    assert float((freq[top] - p.double()).abs().max()) < 2.0 / n


def test_sample_rows_bad_inputs():
    logits = torch.randn(3, 50, device="cuda")
    prm = torch.zeros(3, 5, dtype=torch.float64, device="cuda").view(torch.int64)
    tokens, lp = torch.empty(3, dtype=torch.int32, device="cuda"), torch.empty(3, device="cuda")
    with pytest.raises(ValueError, match="params"):
        lb.sample_rows(logits, prm[:2], tokens, lp)
    with pytest.raises(TypeError, match="params"):
        lb.sample_rows(logits, prm.float(), tokens, lp)
    with pytest.raises(TypeError, match="tokens"):
        lb.sample_rows(logits, prm, tokens.cpu(), lp)
