"""The Hopper prefill kernel's key split (prefill_split_plan.h: the CTAs of a query tile each take a range of its key
tiles, write unnormalized O and (max, sum) per row, and a merge combines them) against float64 references computed
from the cache's own contents, by relative error, on fresh random data, outputs poisoned with NaN. Split counts are
forced with the kernel option prefill_key_split (auto = the launch's plan, the default; off = no split; N forces N).
Shapes: single chunks of 1, 17,
65 and 300 tokens over prefixes that cross 128-key tiles, pages and per-channel groups at odd places, beside a fresh
prompt (no prefix: every split but the last is empty); GQA groups 1, 4 and 8; head_dim 64 and 128; every cache
format. Tolerance as the unsplit kernel's tests: the merge is exact up to f32 rounding."""
import pytest
import torch

from per_channel_ref import per_channel_case
from test_gpu_ops import SM90_ONLY, TC_ATOL_SCALE, close
from test_gpu_prefill_sm90_pack import run_case

pytestmark = SM90_ONLY
KERNEL = "prefill_attention_sm90"


# chunk lengths and kv lengths: 17 over 1100 (prefix crosses a tile at 1024 + 76), 1 over 777, 65 over 1300, 300
# over 640 (the chunk spans 3 tiles), and a fresh 5-token prompt.
LENS_Q = [17, 1, 65, 300, 5]
LENS_KV = [17 + 1100, 1 + 777, 65 + 1300, 300 + 640, 5]
SPLITS = [1, 2, 3, 8, 0]
# (Hq, Hkv, head_dim, block size): GQA 1, 4, 8 and Llama-3-8B heads; pages of 24 change inside a key tile.
SHAPES = [(6, 6, 64, 16), (8, 2, 128, 24), (16, 2, 64, 16), (32, 8, 128, 32)]
KV = [("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u2", "u2"), ("u8", "u4")]


def split_option(splits):
    """The kernel option of a split count: 0 the launch's plan, 1 none, N forced."""
    return {"prefill_key_split": {0: "auto", 1: "off"}.get(splits, str(splits))}


@pytest.mark.parametrize("splits", SPLITS, ids=lambda s: f"s{s}" if s else "auto")
@pytest.mark.parametrize("kv", KV, ids=["-".join(k) for k in KV])
@pytest.mark.parametrize("hq,hkv,d,bs", SHAPES, ids=["{}-{}-d{}-bs{}".format(*s) for s in SHAPES])
def test_prefill_sm90_key_split_matches_float64(splits, kv, hq, hkv, d, bs):
    run_case(LENS_Q, LENS_KV, hq, hkv, d, *kv, bs, seed=hq * 5 + d + bs + splits, options=split_option(splits))


@pytest.mark.parametrize("variant", [1, 2], ids=["unpacked", "packed"])
@pytest.mark.parametrize("splits", [4, 5, 16])
def test_prefill_sm90_key_split_with_and_without_packing(variant, splits):
    # Packing (query heads of a kv head sharing a CTA) forced on and off under the split.
    options = {**split_option(splits), "prefill_pack_heads": "off" if variant == 1 else "on"}
    run_case([64, 3], [64 + 2049, 3 + 129], 32, 8, 128, "u8", "u8", 16, seed=splits + variant, options=options)


# Per-channel K (K, V, head_dim, block size = K group, Hq, Hkv): the last split holds the window views.
PC = [("u4", "u4", 128, 64, 8, 2), ("u2", "u2", 64, 32, 8, 1), ("u4", "f16", 64, 48, 4, 4), ("u2", "u8", 128, 16, 16, 2)]


@pytest.mark.parametrize("splits", [1, 2, 5, 8, 0], ids=lambda s: f"s{s}" if s else "auto")
@pytest.mark.parametrize("kt,vt,d,bs,hq,hkv", PC, ids=["kc-{}-{}-d{}-bs{}-{}-{}".format(*c) for c in PC])
def test_prefill_sm90_key_split_per_channel_k_matches_float64(splits, kt, vt, d, bs, hq, hkv):
    # prefix bs - 1: the chunk's first token seals a block (its codes end is past the prefix).
    prefix, chunk = [1100, 777, bs - 1 + 640, 640, 0], [17, 1, 65, 300, 5]
    out, ref, inside = per_channel_case(prefix, chunk, hq, hkv, d, kt, vt, bs, seed=hq + d + bs + splits, device="cuda",
                                        kernel=KERNEL, options=split_option(splits))
    assert torch.isnan(out[~inside]).all(), "a row outside every sequence was written"
    close(out[inside], ref[inside], "f16", atol_scale=TC_ATOL_SCALE)
    rel = float((out[inside].double() - ref[inside]).norm() / ref[inside].norm())
    assert rel < 2e-3, f"relative error {rel:.2e}"
