"""The Hopper prefill kernel with packed query heads (integer per-token K or V: a CTA's 128 rows are 128 / G positions
x the G query heads of one kv head) against a float64 reference computed from the cache's own contents (codes and
per-token scale / zero read back from the GPU cache), by relative error, on fresh random data. The shapes aim at the
packing's edges: groups that do not divide 128 (G = 7: 18 positions, 126 live rows; G = 3), one head per CTA row
group of 4 or 8 positions (G = 32, 16), several sequences of odd lengths, chunked prefill over a cached prefix whose
diagonal crosses CTA and key-tile edges, pages of 1, 24 and 32 keys. Packing is forced (option prefill_pack_heads=on):
the launch packs on its own only where one head per CTA would take more than one wave of CTAs, which these small
cases mostly do not; test_gpu_prefill_sm90.py covers the launch's own choice.

Tolerance: the kernel rounds dequantized K / V and P to f16 and accumulates in f32 (test_gpu_ops' tensor-core
tolerance, TC_ATOL_SCALE); packing changes which heads share a CTA, not the arithmetic. A row or head mixed up gives
errors of ~0.1 and fails it."""
import math

import pytest
import torch

from lowbit import _core as lb
from per_channel_ref import BITS, host, host_bytes, unpack, v_rows
from test_gpu_ops import SM90_ONLY, TC_ATOL_SCALE, close, nan_like

pytestmark = SM90_ONLY
KERNEL = "prefill_attention_sm90"


def k_rows(cache, pages, offs, d):
    """float64 [L, Hkv, d]: per-token K of the keys at (pages, offs), as the cache holds it."""
    data = cache.k_data(0)
    if cache.k_type == "f16":
        return host(data).double()[pages, :, offs]
    codes = unpack(host_bytes(data)[pages, :, offs], BITS[cache.k_type], d).double()
    p = host(cache.k_params(0)).double()[pages, :, offs]  # [L, Hkv, 2] = (scale, zero)
    return codes * p[..., 0:1] + p[..., 1:2]


def reference(q, cache, table_row, q_len, kv_len, scale):
    """float64 [q_len, Hq, d]: causal attention of one sequence's rows over its kv_len cached keys."""
    bs, d = cache.block_size, q.shape[-1]
    j = torch.arange(kv_len)
    pages, offs = table_row[j // bs].long(), j % bs
    k, v = k_rows(cache, pages, offs, d), v_rows(cache, pages, offs, d)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    pos = kv_len - q_len + torch.arange(q_len)
    s = s.masked_fill(j.view(1, 1, -1) > pos.view(1, -1, 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


def random_pages(lens_kv, bs, spare, g):
    """Shuffled blocks for sequences of lens_kv tokens (`spare` blocks left over): (num_blocks, the s32 block table
    padded with -1, the s32 slot of every token, sequence after sequence)."""
    blocks_per = [math.ceil(L / bs) for L in lens_kv]
    num_blocks = sum(blocks_per) + spare
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    table = torch.full((len(lens_kv), max(blocks_per)), -1, dtype=torch.int32)
    p = 0
    for i, nb in enumerate(blocks_per):
        table[i, :nb] = perm[p:p + nb]
        p += nb
    slots = torch.cat([table[i, torch.arange(L) // bs].long() * bs + torch.arange(L) % bs
                       for i, L in enumerate(lens_kv)]).to(torch.int32)
    return num_blocks, table, slots


def run_case(lens_q, lens_kv, hq, hkv, d, kt, vt, bs, seed, options=None):
    g = torch.Generator().manual_seed(seed)
    scale = 1 / math.sqrt(d)
    n = len(lens_q)
    num_blocks, table, slots = random_pages(lens_kv, bs, 2, g)
    cache = lb.KVCache(1, hkv, d, num_blocks, bs, kt, vt, "cuda")
    total = int(slots.numel())
    # An offset per channel beside the random part: the codes' zero points differ between keys and channels.
    k = (torch.randn(total, hkv, d, generator=g) + torch.randn(1, hkv, d, generator=g)).half()
    v = torch.randn(total, hkv, d, generator=g).half()
    lb.kv_write(cache, 0, k.cuda(), v.cuda(), lb.AttentionMeta([0], [total], [total], table[:1].cuda(), slots.cuda()))
    gap = 1
    q_start = [sum(lens_q[:i]) + gap * (i + 1) for i in range(n)]
    T = sum(lens_q) + gap * n + 1
    q = torch.randn(T, hq, d, generator=g).half()
    out = nan_like(q)
    meta = lb.AttentionMeta(q_start, lens_q, lens_kv, table.cuda(), slots[:1].cuda())
    lb.paged_attention(q.cuda(), cache, 0, meta, scale, out, kernel=KERNEL, options=options or {})
    out = out.cpu()
    inside = torch.zeros(T, dtype=torch.bool)
    for i in range(n):
        s0, L = q_start[i], lens_q[i]
        inside[s0:s0 + L] = True
        ref = reference(q[s0:s0 + L], cache, table[i], L, lens_kv[i], scale)
        close(out[s0:s0 + L], ref, "f16", atol_scale=TC_ATOL_SCALE)
        rel = float((out[s0:s0 + L].double() - ref).norm() / ref.norm())
        assert rel < 2e-3, f"sequence {i}: relative error {rel:.2e}"
    assert torch.isnan(out[~inside]).all(), "a row outside every sequence was written"


LENS = {
    # fresh prompts: one token, lengths around CTA edges of 4 / 8 / 18 / 32 / 42 positions and the 128-key tile
    "fresh": ([1, 5, 19, 37, 130, 300], [1, 5, 19, 37, 130, 300]),
    # chunked prefill over a cached prefix: the diagonal crossing key tiles and CTAs at odd places; a decode row
    "chunked": ([3, 18, 40, 129, 1], [260, 118, 47, 379, 77]),
}
# (Hq, Hkv, head_dim, block size): G = 7 (126 of 128 rows live), 3, 32, 16, 4 (Llama-3-8B heads), 2 with pages of 1.
SHAPES = [(14, 2, 128, 16), (9, 3, 64, 24), (32, 1, 128, 32), (16, 1, 64, 16), (32, 8, 128, 32), (6, 3, 64, 1)]
KV = [("u8", "u8"), ("u4", "u4"), ("u2", "u2"), ("u4", "f16"), ("f16", "u8")]


@pytest.mark.parametrize("lens", ["fresh", "chunked"])
@pytest.mark.parametrize("kv", KV, ids=["-".join(k) for k in KV])
@pytest.mark.parametrize("hq,hkv,d,bs", SHAPES, ids=["{}-{}-d{}-bs{}".format(*s) for s in SHAPES])
def test_prefill_sm90_packed_heads_match_float64(lens, kv, hq, hkv, d, bs):
    lens_q, lens_kv = LENS[lens]
    run_case(lens_q, lens_kv, hq, hkv, d, *kv, bs, seed=hq * 13 + d + bs + len(lens), options={"prefill_pack_heads": "on"})
