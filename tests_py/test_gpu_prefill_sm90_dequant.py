"""The Hopper prefill kernel's u4 / u2 dequantization (fields masked in place, the scale pre-multiplied by the field's
power of two) against the previous one (each code shifted down and masked; kernel option prefill_ref_dequant=on) on
the same cache and queries: the outputs must be bit-identical, since each dequantized value is the same f32
code * scale + zero rounded once (to f16). Fresh random data whose rows span ranges from 1e-4 to 1e3 (scales from
~1e-5 to ~1e2, zeros of either sign), fresh prompts and chunks over a cached prefix, packed and unpacked heads, split
and unsplit keys, head_dim 64 and 128. The float64 accuracy of the new path is the other prefill test files' job.
Per-channel K (u4c / u2c, the block's per-channel scale pre-multiplied the same way) likewise against its previous
extraction, at head_dim 128 with u4 / u2 V. The dequantized copy (prefill_dequant_copy) is off here: its own file
holds it to the fused kernel."""
import math

import pytest
import torch

from lowbit import _core as lb
from test_gpu_ops import SM90_ONLY, nan_like
from per_channel_ref import per_channel_case
from test_gpu_prefill_sm90_pack import random_pages

pytestmark = SM90_ONLY
KERNEL = "prefill_attention_sm90"


def outputs(lens_q, lens_kv, hq, hkv, d, kv, bs, seed, options):
    """The kernel's out for the new and the reference dequantization on one cache and one q."""
    g = torch.Generator().manual_seed(seed)
    n = len(lens_q)
    num_blocks, table, slots = random_pages(lens_kv, bs, 1, g)
    cache = lb.KVCache(1, hkv, d, num_blocks, bs, kv, kv, "cuda")
    total = int(slots.numel())
    # Per-row magnitudes over seven decades and offsets of either sign: scales and zeros far apart.
    mag = 10 ** torch.empty(total, hkv, 1).uniform_(-4, 3, generator=g)
    k = (torch.randn(total, hkv, d, generator=g) * mag + torch.randn(total, hkv, 1, generator=g) * mag * 3).half()
    v = (torch.randn(total, hkv, d, generator=g) * mag.flip(0) + torch.randn(total, hkv, 1, generator=g)).half()
    lb.kv_write(cache, 0, k.cuda(), v.cuda(), lb.AttentionMeta([0], [total], [total], table[:1].cuda(), slots.cuda()))
    q_start = [sum(lens_q[:i]) for i in range(n)]
    q = (torch.randn(sum(lens_q), hq, d, generator=g) * 0.05).half().cuda()
    meta = lb.AttentionMeta(q_start, lens_q, lens_kv, table.cuda(), slots[:1].cuda())
    res = []
    for ref in ("off", "on"):
        out = nan_like(q)
        lb.paged_attention(q, cache, 0, meta, 1 / math.sqrt(d), out, kernel=KERNEL,
                           options={**options, "prefill_ref_dequant": ref, "prefill_dequant_copy": "off"})
        res.append(out.cpu())
    return res


LENS = {
    "fresh": ([1, 37, 300], [1, 37, 300]),
    "chunked": ([3, 40, 129], [260, 647, 379]),
    "long_chunk": ([64], [2100]),
}
OPTIONS = {"plan": {}, "unpacked_unsplit": {"prefill_pack_heads": "off", "prefill_key_split": "off"},
           "packed_split3": {"prefill_pack_heads": "on", "prefill_key_split": "3"}}


@pytest.mark.parametrize("opt", list(OPTIONS))
@pytest.mark.parametrize("lens", list(LENS))
@pytest.mark.parametrize("kv", ["u4", "u2"])
@pytest.mark.parametrize("hq,hkv,d,bs", [(32, 8, 128, 16), (9, 3, 64, 24)], ids=["32-8-d128-bs16", "9-3-d64-bs24"])
def test_prefill_sm90_dequant_bit_identical_to_reference(opt, lens, kv, hq, hkv, d, bs):
    new, ref = outputs(*LENS[lens], hq, hkv, d, kv, bs, seed=hq + d + len(lens) + len(opt), options=OPTIONS[opt])
    inside = ~torch.isnan(ref).all(-1).all(-1)
    assert inside.any() and not torch.isnan(new[inside]).any()
    diff = (new.view(torch.int16) != ref.view(torch.int16)).sum().item()
    assert diff == 0, f"{diff} of {new.numel()} outputs differ in their bits (max abs {(new - ref).abs().max():.3g})"


def test_prefill_sm90_reference_dequant_only_for_matching_u4_u2():
    q = torch.randn(4, 2, 64).half().cuda()
    cache = lb.KVCache(1, 1, 64, 2, 16, "u4", "u8", "cuda")
    meta = lb.AttentionMeta([0], [4], [4], torch.tensor([[0]], dtype=torch.int32).cuda(),
                            torch.arange(4, dtype=torch.int32).cuda())
    with pytest.raises(Exception, match="reference dequantization"):
        lb.paged_attention(q, cache, 0, meta, 0.125, kernel=KERNEL, options={"prefill_ref_dequant": "on"})


# Per-channel K: (prefix, chunk) per sequence, K / V types, (Hq, Hkv), block size (= the K group).
# (per_channel_case takes the code type of K; the cache holds it per channel.)
KC = [(([200, 0], [70, 140]), ("u4", "u4"), (8, 2), 16), (([300], [64]), ("u2", "u2"), (32, 8), 32),
      (([130, 47], [129, 3]), ("u4", "u4"), (4, 4), 32), (([517], [200]), ("u2", "u2"), (6, 2), 16)]


@pytest.mark.parametrize("opt", ["plan", "unpacked_unsplit"])
@pytest.mark.parametrize("case", KC, ids=[f"{c[1][0]}c-{c[2][0]}-{c[2][1]}-bs{c[3]}-{i}" for i, c in enumerate(KC)])
def test_prefill_sm90_per_channel_dequant_bit_identical_to_reference(opt, case):
    (prefix, chunk), (kt, vt), (hq, hkv), bs = case
    # The fused kernel's own dequantization against the reference one: the dequantized copy of the sealed keys
    # (bit-different by its summation order; test_gpu_prefill_sm90_kccopy.py) stays off.
    opts = {"plan": {}, "unpacked_unsplit": {"prefill_key_split": "off"}}[opt]
    opts = {**opts, "prefill_dequant_copy": "off"}
    outs = [per_channel_case(prefix, chunk, hq, hkv, 128, kt, vt, bs, seed=hq + bs + len(opt), device="cuda",
                             kernel=KERNEL, options={**opts, "prefill_ref_dequant": ref})
            for ref in ("off", "on")]
    (new, ref64, inside), (old, _, _) = outs
    assert not torch.isnan(new[inside]).any()
    assert torch.isnan(new[~inside]).all(), "a row outside every sequence was written"
    rel = float((new[inside].double() - ref64[inside]).norm() / ref64[inside].norm())
    assert rel < 2e-3, f"relative error {rel:.2e} against float64"
    diff = (new.view(torch.int16) != old.view(torch.int16)).sum().item()
    assert diff == 0, f"{diff} of {new.numel()} outputs differ in their bits (max abs {(new - old).abs().max():.3g})"
