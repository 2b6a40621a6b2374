"""The Hopper prefill kernel over per-channel K (u4c / u2c) with the dequantized copy of the sealed keys (kernel option
prefill_dequant_copy): the keys every query of a chunk sees as sealed codes (whole key tiles below min(first_pos,
codes_end(first_pos))) dequantized once into an f16 copy and read by the f16 instance as the first splits of a key
split, the rest (the chunk's own blocks, the window, the diagonal) by the per-channel instance as the last split,
and the merge. Summed in another order than the fused kernel, so not bit-identical to it: (1) against the float64
reference of the cache's contents (per_channel_ref.py) at odd lengths: prefixes ending inside a block, chunks sealing
0, 1 or 2 blocks, windows partly full, a prefix shorter than one key tile (no copied key: empty head splits) and a
fresh prompt beside them; K groups (block sizes) 16-64, head_dim 64 / 128, GQA 1-4; forced splits; (2) close to the
fused kernel on the same cache and q; (3) through the launch's own rule (Llama-3-8B heads)."""
import pytest
import torch

from per_channel_ref import per_channel_case
from test_gpu_ops import SM90_ONLY, TC_ATOL_SCALE, close

pytestmark = SM90_ONLY
KERNEL = "prefill_attention_sm90"
ON = {"prefill_dequant_copy": "on"}
OFF = {"prefill_dequant_copy": "off"}


def lens(bs):
    """(prefix, chunk) per sequence: ends inside a block with a chunk sealing none, one block, two blocks (the
    window partly full after each), a long prefix with a long chunk, a prefix below one key tile, a fresh prompt."""
    mid = 4 * 128 + bs // 2 + 3
    return [mid, 611, mid + 200, 1000, 37, 0], [5, bs, 2 * bs + 7, 300, 40, 20]


# (K, V, head_dim, block size = K group, Hq, Hkv)
SHAPES = [("u4", "u4", 128, 64, 8, 2), ("u2", "u2", 128, 32, 8, 1), ("u4", "u2", 64, 32, 9, 3),
          ("u2", "u8", 64, 64, 4, 4), ("u4", "u8", 128, 16, 8, 2), ("u2", "u4", 128, 48, 6, 2)]
IDS = ["kc-{}-{}-d{}-bs{}-{}-{}".format(*s) for s in SHAPES]


def run(kt, vt, d, bs, hq, hkv, seed, options, prefix=None, chunk=None, scale=None):
    p, c = lens(bs) if prefix is None else (prefix, chunk)
    out, ref, inside = per_channel_case(p, c, hq, hkv, d, kt, vt, bs, seed, "cuda", kernel=KERNEL, scale=scale,
                                        options=options)
    assert torch.isnan(out[~inside]).all(), "a row outside every sequence was written"
    return out, ref, inside


@pytest.mark.parametrize("splits", ["auto", "4"])
@pytest.mark.parametrize("kt,vt,d,bs,hq,hkv", SHAPES, ids=IDS)
def test_prefill_sm90_kc_copy_matches_float64(kt, vt, d, bs, hq, hkv, splits):
    out, ref, inside = run(kt, vt, d, bs, hq, hkv, seed=hq * 5 + d + bs,
                           options={**ON, "prefill_key_split": splits})
    close(out[inside], ref[inside], "f16", atol_scale=TC_ATOL_SCALE)


@pytest.mark.parametrize("kt,vt,d,bs,hq,hkv", SHAPES[:4], ids=IDS[:4])
def test_prefill_sm90_kc_copy_close_to_fused(kt, vt, d, bs, hq, hkv):
    seed = hq * 3 + d + bs
    copy, ref, inside = run(kt, vt, d, bs, hq, hkv, seed, ON)
    fused, _, _ = run(kt, vt, d, bs, hq, hkv, seed, OFF)
    copy, fused, ref = copy[inside].double(), fused[inside].double(), ref[inside]
    # Both use the same dequantized K and V (the copy holds the fused producer's values); P's f16 rounding (against
    # each split's own row maximum), the f32 order of the sums and the merge's rounding differ. A mixed-up key range
    # or a key counted twice would put the gap far above the fused kernel's own error against float64.
    gap, err = (copy - fused).abs(), (fused - ref).abs()
    assert gap.mean() <= 1.2 * err.mean() and gap.max() <= 2 * err.max() + 1e-4, (
        f"copy vs fused mean {gap.mean():.3g} max {gap.max():.3g}; fused vs float64 {err.mean():.3g} / {err.max():.3g}")
    close(copy, ref, "f16", atol_scale=TC_ATOL_SCALE)


@pytest.mark.parametrize("kv", [("u4", "u4"), ("u2", "u2")], ids=lambda k: "-".join(k))
def test_prefill_sm90_kc_copy_rule_llama_heads(kv):
    # Llama-3-8B heads, G = 64: a 256-token chunk over 1500 cached keys (8 CTAs per kv head: the rule takes the
    # copy), beside a 19-token chunk over 300.
    out, ref, inside = run(*kv, 128, 64, 32, 8, seed=11, options={}, prefix=[1500, 300], chunk=[256, 19])
    close(out[inside], ref[inside], "f16", atol_scale=TC_ATOL_SCALE)


@pytest.mark.parametrize("scale", [0.0, -0.2], ids=["zero", "negative"])
def test_prefill_sm90_kc_copy_any_softmax_scale(scale):
    out, ref, inside = run("u4", "u4", 64, 32, 8, 2, seed=23, options=ON, prefix=[700, 129], chunk=[70, 100],
                           scale=scale)
    close(out[inside], ref[inside], "f16", atol_scale=TC_ATOL_SCALE)
