"""The Hopper prefill kernel's dequantized copy (kernel option prefill_dequant_copy: a per-token u8 / u4 / u2 cache's
keys dequantized once into an f16 paged copy, then the f16 instance over it). (1) Against the fused kernel on the
same cache and q, both unpacked and unsplit: the copy holds the values the fused producer stores in shared memory and
the consumers are the same code, so the outputs must have the same bits. (2) Against a float64 reference of the
cache's own contents (relative error, test_gpu_prefill_sm90_pack's reference), forced on and through the launch's rule
(Llama-3-8B heads, a 256-token chunk over a cached prefix: 8 CTAs per kv head, above the rule's 4, so the rule takes
the copy for every format)."""
import math

import pytest
import torch

from lowbit import _core as lb
from test_gpu_ops import SM90_ONLY, nan_like
from test_gpu_prefill_sm90_pack import random_pages, run_case

pytestmark = SM90_ONLY
KERNEL = "prefill_attention_sm90"


def outputs(lens_q, lens_kv, hq, hkv, d, kt, vt, bs, seed, option_sets):
    g = torch.Generator().manual_seed(seed)
    n = len(lens_q)
    num_blocks, table, slots = random_pages(lens_kv, bs, 3, g)
    cache = lb.KVCache(1, hkv, d, num_blocks, bs, kt, vt, "cuda")
    total = int(slots.numel())
    mag = 10 ** torch.empty(total, hkv, 1).uniform_(-2, 2, generator=g)
    k = (torch.randn(total, hkv, d, generator=g) * mag + torch.randn(1, hkv, d, generator=g)).half()
    v = (torch.randn(total, hkv, d, generator=g) * mag.flip(0) + torch.randn(total, hkv, 1, generator=g)).half()
    lb.kv_write(cache, 0, k.cuda(), v.cuda(), lb.AttentionMeta([0], [total], [total], table[:1].cuda(), slots.cuda()))
    q_start = [sum(lens_q[:i]) + i for i in range(n)]  # a gap row before each sequence but the first
    q = (torch.randn(sum(lens_q) + n, hq, d, generator=g) * 0.3).half().cuda()
    meta = lb.AttentionMeta(q_start, lens_q, lens_kv, table.cuda(), slots[:1].cuda())
    res = []
    for options in option_sets:
        out = nan_like(q)
        lb.paged_attention(q, cache, 0, meta, 1 / math.sqrt(d), out, kernel=KERNEL, options=options)
        res.append(out.cpu())
    return res


# Odd lengths end inside a page (the copy's partial last page); "whole_pages" ends on a page boundary at every
# block size here (96 and 480 keys: multiples of 16, 24 and 32), the copy's full-page path for the last page too.
LENS = {"fresh": ([1, 37, 300], [1, 37, 300]), "chunked": ([3, 40, 129], [260, 647, 379]),
        "long_chunk": ([256], [1500]), "whole_pages": ([16, 48], [96, 480])}
# Each code width on each side: u2 K with u8 V has the most output per code byte on K and the least on V.
KV = [("u8", "u8"), ("u4", "u4"), ("u2", "u2"), ("u4", "u2"), ("u8", "u4"), ("u2", "u8")]
SHAPES = [(32, 8, 128, 16), (9, 3, 64, 24), (8, 8, 128, 32)]
FUSED = {"prefill_pack_heads": "off", "prefill_key_split": "off"}


@pytest.mark.parametrize("lens", list(LENS))
@pytest.mark.parametrize("kv", KV, ids=["-".join(k) for k in KV])
@pytest.mark.parametrize("hq,hkv,d,bs", SHAPES, ids=["{}-{}-d{}-bs{}".format(*s) for s in SHAPES])
def test_prefill_sm90_dequant_copy_bit_identical_to_fused(lens, kv, hq, hkv, d, bs):
    sets = [{**FUSED, "prefill_dequant_copy": "on"}, {**FUSED, "prefill_dequant_copy": "off"}]
    copy, fused = outputs(*LENS[lens], hq, hkv, d, *kv, bs, seed=hq + d + bs + len(lens), option_sets=sets)
    inside = ~torch.isnan(fused).all(-1).all(-1)
    assert inside.any() and not torch.isnan(copy[inside]).any()
    assert torch.isnan(copy[~inside]).all(), "a row outside every sequence was written"
    diff = (copy.view(torch.int16) != fused.view(torch.int16)).sum().item()
    assert diff == 0, f"{diff} of {copy.numel()} outputs differ in bits (max abs {(copy - fused).abs().max():.3g})"


@pytest.mark.parametrize("option", ["on", "rule"])
@pytest.mark.parametrize("kv", KV, ids=["-".join(k) for k in KV])
def test_prefill_sm90_dequant_copy_matches_float64(option, kv):
    opts = {"prefill_dequant_copy": "on"} if option == "on" else {}
    # Llama-3-8B heads: one 256-token chunk over 1244 cached keys, and a second sequence with a short chunk.
    run_case([256, 19], [1500, 300], 32, 8, 128, *kv, 16, seed=7 + len(option), options=opts)
