"""The Hopper prefill attention kernel (prefill_attention_sm90: wgmma, 128-row query tiles, 128-key tiles gathered
page by page by a producer warpgroup) forced by name against the CPU cache's attention, on fresh random data around
its tile edges, with pages that change inside a tile, chunked prefill, GQA 1-8, head_dim 64 and 128 and every
per-token K/V type; per-channel K (u4 / u2 with its f16 window, every V type) against a float64 reference of the cache's
contents (per_channel_ref.py, itself held to the CPU cache in test_per_channel_reference.py). Outputs are NaN-poisoned,
rows outside every sequence must stay NaN.

Tolerance: the same rounding points as the mma.sync kernel (dequantized K/V and P rounded to f16 before the MMA, f32
accumulation, output rounded once), so test_gpu_ops' tensor-core tolerance holds (see TC_ATOL_SCALE there); a wrong
key, row, page, mask, swizzle or parameter gives errors of ~0.1 and fails it. (An exact-code variant that fed integer
K/V to the MMAs as f16 codes was measured slower after round 7 and removed: docs/benchmarks_gpu.md, round 6.)"""
import math

import pytest
import torch

from lowbit import _core as lb
from per_channel_ref import per_channel_case
from test_gpu_ops import SM90_ONLY, TC_ATOL_SCALE, check_tc_case, close, nan_like, sm, twin_caches

pytestmark = SM90_ONLY
KERNEL = "prefill_attention_sm90"
# The cases name the kernel they force (one Hopper kernel today; a variant joins this list).
KERNELS = pytest.mark.parametrize("kernel", [KERNEL], ids=["sm90"])


def check(kernel, lens_q, lens_kv, hq, hkv, d, kt, vt, seed, bs, scale=None):
    check_tc_case(lens_q, lens_kv, hq, hkv, d, kt, vt, seed, bs, kernel=kernel, scale=scale)


LENS = {
    # fresh prompts around the 128-row / 128-key tile edges (and the 64-row warpgroup edge)
    "fresh": ([1, 63, 65, 127, 128, 129, 300], [1, 63, 65, 127, 128, 129, 300]),
    # chunked prefill: kv_len > q_len, the diagonal crossing key tiles at odd places; a decode row
    "chunked": ([1, 64, 127, 129, 200], [100, 255, 141, 500, 263]),
}
KV = [("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u2", "u2"), ("u8", "u4"), ("f16", "u2"), ("u4", "f16")]


@pytest.mark.parametrize("lens", ["fresh", "chunked"])
@pytest.mark.parametrize("kv", KV, ids=["-".join(k) for k in KV])
@pytest.mark.parametrize("hq,hkv,d,bs", [(8, 2, 128, 16), (9, 3, 64, 24), (4, 4, 64, 16), (8, 1, 128, 24)])
@KERNELS
def test_prefill_sm90_matches_cpu(kernel, lens, kv, hq, hkv, d, bs):
    # bs 24 does not divide the 128-key tile: pages change inside a tile.
    lens_q, lens_kv = LENS[lens]
    check(kernel, lens_q, lens_kv, hq, hkv, d, *kv, seed=hq * 31 + d + bs, bs=bs)


@pytest.mark.parametrize("kv", [("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u2", "u2")], ids=lambda k: "-".join(k))
@KERNELS
def test_prefill_sm90_llama_heads_long(kernel, kv):
    # Llama-3-8B heads (GQA 4:1, D 128): a 700-row chunk over 1500 cached tokens in pages of 32, and pages of 1.
    check(kernel, [700], [1500], 32, 8, 128, *kv, seed=5, bs=32)
    check(kernel, [150, 3], [150, 9], 32, 8, 128, *kv, seed=6, bs=1)


@pytest.mark.parametrize("scale", [0.0, -0.2, 0.4], ids=["zero", "negative", "sharp"])
@pytest.mark.parametrize("kv", [("f16", "f16"), ("u4", "u8")], ids=lambda k: "-".join(k))
@KERNELS
def test_prefill_sm90_any_softmax_scale(kernel, scale, kv):
    # The kernel folds a positive scale into the exponent (max over raw scores); zero and negative scales take
    # the other path, and a sharp one (0.4 at D 64, logits ~ +-10) stresses the running max.
    check(kernel, [129, 70], [129, 300], 8, 2, 64, *kv, seed=17, bs=16, scale=scale)


@pytest.mark.parametrize("rise", [0.5, 4.0, 12.0], ids=["slow", "near-slack", "past-slack"])
@pytest.mark.parametrize("kv", [("f16", "f16"), ("f16", "u4")], ids=lambda k: "-".join(k))
@KERNELS
def test_prefill_sm90_climbing_row_maxima(kernel, rise, kv):
    # Scores that rise along the keys by about `rise` log2 units per 128-key tile (one dimension of K grows with
    # the position, every query leans on it), so each row's running maximum climbs tile after tile: by less than
    # the kernel's slack of 8 (the old maximum stays and P grows past 1), near it, and past it (rescales every
    # tile). Random rows alone rarely move a maximum after the first tiles. K stays f16: the scores reach ~60, where
    # an integer K's f16 rounding alone (2^-11 of the score) would exceed the tolerance.
    g = torch.Generator().manual_seed(int(rise * 10) + len(kernel))
    hq, hkv, d, bs, L = 4, 2, 64, 16, 700
    scale = 1 / math.sqrt(d)
    nblk = L // bs + 1
    table = torch.randperm(nblk, generator=g).to(torch.int32).view(1, nblk)
    slots = (table[0, torch.arange(L) // bs].long() * bs + torch.arange(L) % bs).to(torch.int32)
    k = torch.randn(L, hkv, d, generator=g)
    v = torch.randn(L, hkv, d, generator=g)
    q = torch.randn(L, hq, d, generator=g) * 0.5
    q[:, :, 0] = 4.0
    k[:, :, 0] = torch.arange(L).view(L, 1) * (rise / 128 / (4.0 * scale * math.log2(math.e)))
    k, v, q = k.half(), v.half(), q.half()
    gpu, cpu = twin_caches(1, hkv, d, nblk, bs, *kv)
    lb.kv_write(cpu, 0, k, v, lb.AttentionMeta([0], [L], [L], table, slots))
    lb.kv_write(gpu, 0, k.cuda(), v.cuda(), lb.AttentionMeta([0], [L], [L], table.cuda(), slots.cuda()))
    out_c = torch.full_like(q, float("nan"))
    out_g = nan_like(q)
    lb.paged_attention(q, cpu, 0, lb.AttentionMeta([0], [L], [L], table, slots), scale, out_c)
    lb.paged_attention(q.cuda(), gpu, 0, lb.AttentionMeta([0], [L], [L], table.cuda(), slots.cuda()), scale, out_g,
                       kernel=kernel)
    close(out_g.cpu(), out_c, "f16", atol_scale=TC_ATOL_SCALE)


def check_per_channel(kernel, prefix, chunk, hq, hkv, d, kt, vt, bs, seed, scale=None):
    out, ref, inside = per_channel_case(prefix, chunk, hq, hkv, d, kt, vt, bs, seed, "cuda", kernel=kernel, scale=scale)
    assert torch.isnan(out[~inside]).all(), "a row outside every sequence was written"
    # The model of the kernel's roundings (K, V and P to f16, the output once) against this reference used at most
    # 32% of the tolerance on these shapes (an outlier channel of +6 in K included).
    close(out[inside], ref[inside], "f16", atol_scale=TC_ATOL_SCALE)


# (K, V, head_dim, block size = K group, Hq, Hkv): 4- and 2-bit K with every V type, GQA 1-8, blocks of 16-128 keys
# (48: blocks end inside 128-key tiles and 32-row warps at odd places).
PC = [("u4", "u4", 128, 64, 8, 2), ("u4", "u8", 64, 32, 9, 3), ("u2", "u2", 128, 64, 8, 1), ("u2", "u4", 64, 48, 4, 4),
      ("u4", "f16", 128, 128, 8, 2), ("u4", "u2", 64, 16, 8, 2), ("u2", "u8", 128, 32, 16, 2), ("u2", "f16", 64, 64, 6, 2)]
PC_LENS = {
    # fresh prompts around the 128-row / 128-key edges: windows partly full at every length, one token
    "fresh": lambda bs: ([0, 0, 0, 0, 0], [1, 63, 65, 129, 300]),
    # chunked prefill over a cached prefix: one token inside a block (its window), one token at a block's last key
    # (no window at all: the block seals), a chunk sealing blocks inside itself, the diagonal crossing key tiles
    "chunked": lambda bs: ([100, bs - 1, 255, 500, 7], [1, 1, 129, 200, 58]),
}


@pytest.mark.parametrize("lens", ["fresh", "chunked"])
@pytest.mark.parametrize("kt,vt,d,bs,hq,hkv", PC, ids=["kc-{}-{}-d{}-bs{}-{}-{}".format(*c) for c in PC])
@KERNELS
def test_prefill_sm90_per_channel_k_matches_float64(kernel, lens, kt, vt, d, bs, hq, hkv):
    prefix, chunk = PC_LENS[lens](bs)
    check_per_channel(kernel, prefix, chunk, hq, hkv, d, kt, vt, bs, seed=hq * 7 + d + bs)


@pytest.mark.parametrize("kv", [("u4", "u4"), ("u2", "u2")], ids=lambda k: "-".join(k))
@KERNELS
def test_prefill_sm90_per_channel_k_llama_heads_long(kernel, kv):
    # Llama-3-8B heads (GQA 4:1, D 128), G = 64: a 700-row chunk over 1000 cached tokens (tiles read as codes, then
    # the diagonal ones twice), beside a short sequence.
    check_per_channel(kernel, [1000, 30], [700, 40], 32, 8, 128, *kv, 64, seed=9)


@pytest.mark.parametrize("scale", [0.0, -0.2, 1e-30], ids=["zero", "negative", "tiny"])
@KERNELS
def test_prefill_sm90_per_channel_k_any_softmax_scale(kernel, scale):
    # A row can see no key in a view of a tile (all its keys in the other view): its maximum must not take a masked
    # score. Zero and negative scales take the unfolded path; a tiny positive one (1e-30) too (its folded start
    # would sit near real scores).
    check_per_channel(kernel, [70, 0], [129, 100], 8, 2, 64, "u4", "u4", 32, seed=19, scale=scale)


def test_prefill_sm90_is_the_registry_choice_for_per_token_kv():
    for d, k, v, want in [(64, "u4", "u8", KERNEL), (128, "u4", "u8", KERNEL), (128, "u8", "u8", KERNEL),
                          (128, "u4", "u2", KERNEL), (128, "f16", "f16", KERNEL)]:
        r = lb.kernels.select_attention(device="cuda", sm=sm(), phase="prefill", head_dim=d, q="f16", k=k, v=v, gqa=4)
        assert r["kernel"] == want and not r["fallback"], r
    for k, v in [("u4", "u4"), ("u2", "u8")]:  # per-channel K too
        pc = lb.kernels.select_attention(device="cuda", sm=sm(), phase="prefill", head_dim=128, q="f16", k=k, v=v,
                                         gqa=4, block_size=64, k_per_channel=True)
        assert pc["kernel"] == KERNEL and not pc["fallback"], pc


@KERNELS
def test_prefill_sm90_refuses_what_it_does_not_cover_by_name(kernel):
    cache = lb.KVCache(1, 2, 64, 4, 16, "f16", "f16", "cuda")
    table = torch.tensor([[0, 1]], dtype=torch.int32).cuda()
    meta = lb.AttentionMeta([0], [5], [5], table, torch.arange(5, dtype=torch.int32).cuda())
    k = torch.randn(5, 2, 64, device="cuda").half()
    lb.kv_write(cache, 0, k, k, meta)
    # q heads 66 halves (132 bytes) apart are not 16-byte aligned: the kernel copies rows in 16-byte pieces.
    q = torch.randn(5, 4, 66, device="cuda").half()[:, :, :64]
    out = torch.full((5, 4, 64), float("nan"), device="cuda").half()
    with pytest.raises(NotImplementedError, match="q rows 16-byte aligned"):
        lb.paged_attention(q, cache, 0, meta, 1 / math.sqrt(64), out, kernel=kernel)
    # The automatic choice takes the mma.sync kernel for these rows (it reads q in 4-byte pairs) and is right.
    lb.paged_attention(q, cache, 0, meta, 1 / math.sqrt(64), out)
    ref = torch.full_like(out, float("nan"))
    lb.paged_attention(q.contiguous(), cache, 0, meta, 1 / math.sqrt(64), ref, kernel=kernel)
    close(out.cpu(), ref.cpu(), "f16", atol_scale=TC_ATOL_SCALE)
    with pytest.raises(NotImplementedError, match="head_dim 64 and 128"):
        big = lb.KVCache(1, 1, 256, 2, 16, "f16", "f16", "cuda")
        x = torch.randn(5, 1, 256, device="cuda").half()
        lb.paged_attention(x, big, 0, meta, 0.1, x.clone(), kernel=kernel)
