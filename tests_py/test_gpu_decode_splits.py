"""Decode attention's split-KV plan and the merge of the splits: forced split sizes from one split to hundreds (the
merge reads them in chunks of 128), lengths at 1 token, on and off block boundaries, sequences of a batch shorter than
its longest (empty splits), GQA groups 1-16, head_dim 64/128/256, against a float64 reference by relative error on
exact codes, outputs NaN-poisoned; the merge's grid (a head's columns over 1-8 blocks at batches 1-3, one block per
head at larger batches; strided outputs); and the chosen split at small batches and long contexts (the whole-wave rule)."""
import math

import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_attention import reference
from test_gpu_kv2 import random_side

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


def run_case(kv, hq, hkv, d, lens, split, seed, pad=0):
    """pad > 0: the output is a view of a wider NaN tensor (head stride d + pad), whose padding must stay untouched."""
    kt, vt = kv.split("/")
    g = torch.Generator().manual_seed(seed)
    bs = 16
    blocks_per_seq = [max(1, math.ceil(n / bs)) for n in lens]
    num_blocks = sum(blocks_per_seq) + 2
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.full((len(lens), max(blocks_per_seq)), -1, dtype=torch.int32)
    pos = 0
    for i, nb in enumerate(blocks_per_seq):
        table[i, :nb] = perm[pos:pos + nb]
        pos += nb
    shape = (num_blocks, hkv, bs, d)
    k, kp, kd = random_side(kt, shape, g)
    v, vp, vd = random_side(vt, shape, g)
    seq_k, seq_v = [], []
    for i, n in enumerate(lens):
        t = torch.arange(n)
        blk = table[i, t // bs].long()
        seq_k.append(kd[blk, :, t % bs, :])
        seq_v.append(vd[blk, :, t % bs, :])
    q = torch.randn(len(lens), hq, d, generator=g).half()
    wide = torch.full((len(lens), hq, d + pad), float("nan"), dtype=torch.float16, device="cuda")
    out = wide[..., :d]
    scale = 1.0 / math.sqrt(d)
    _core.decode_attention(q.cuda(), k, v, kp, vp, table.cuda(), torch.tensor(lens, dtype=torch.int32, device="cuda"),
                           max(lens), scale, out, kv_dtype=kt, split_tokens=split, v_dtype=vt)
    torch.cuda.synchronize()
    ref = reference(q, seq_k, seq_v, scale)
    got = out.cpu().double()
    assert not torch.isnan(got).any(), "unwritten outputs"
    assert torch.isnan(wide[..., d:]).all(), "writes past the head's d columns"
    rel = float((got - ref).norm() / ref.norm())
    assert rel < 2e-3, f"relative error {rel:.2e}"


@pytest.mark.parametrize("kv", ["u4/u4", "u2/u2", "f16/f16", "u8/u4"])
@pytest.mark.parametrize("lens,split", [
    ([1], 16),                 # one token, one split
    ([16], 16),                # one whole block
    ([17], 16),                # 1 + a one-token split
    ([4097], 16),              # 257 splits: three chunks of the merge
    ([3001, 1, 16, 1000], 48),  # 63 splits, most of them empty for the short sequences
    ([2048, 33], 112),         # splits off block boundaries of the cache's pages
    ([5000], 4096),            # two uneven splits
    ([700, 5], 0),             # the chosen split
])
def test_decode_attention_forced_splits(kv, lens, split):
    run_case(kv, 32, 8, 128, lens, split, seed=sum(lens) + split)


@pytest.mark.parametrize("kv", ["u4/u4", "u2/u2", "f16/f16"])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (16, 4), (16, 2), (12, 1), (16, 1)])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("split", [16, 160, 0])
def test_decode_attention_splits_gqa_head_dims(kv, hq, hkv, d, split):
    if d == 256 and "u2" in kv:
        pytest.skip("2-bit K/V: head_dim 64 and 128 only")
    run_case(kv, hq, hkv, d, [1203, 77, 1], split, seed=hq * 7 + hkv + d + split)


@pytest.mark.parametrize("kv", ["u4/u4", "u2/u2"])
@pytest.mark.parametrize("lens", [[12000], [6000, 5999, 1, 3000], [2500] * 6])
def test_decode_attention_chosen_split_long_context(kv, lens):
    """Small batches at long contexts take the whole-wave rule (tens of splits per (sequence, head))."""
    run_case(kv, 32, 8, 128, lens, 0, seed=len(lens) + max(lens))


# The merge spreads a head's columns over up to 8 blocks while batch x heads x blocks fits one block per SM (132 SMs:
# 32 heads at batch 1 take 4, at 2 take 2, at 3 one; 8 heads of d64 take 8 / 8 / 4; 16 heads of d256 8 / 4 / 2; the
# spread kernel, each thread reading 8 of its group's splits per round, 300 splits: several rounds); one block per head
# is the per-head kernel (batch 3 at 32 heads, 64 heads at batch 2 and 3). Lengths 16 * splits - 5 at split 16
# give exactly `splits` splits for the longest sequence; the others are shorter (empty splits, a 1-token one).
@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (64, 8, 128), (8, 8, 64), (16, 2, 256)])
@pytest.mark.parametrize("splits", [2, 5, 66, 300])
def test_decode_attention_merge_grid(batch, hq, hkv, d, splits):
    kv = "u4/u4" if d == 256 else ["u4/u4", "u2/u2", "f16/f16"][(batch + splits) % 3]
    length = 16 * splits - 5
    lens = [length, 1, length // 2 + 3][:batch]
    run_case(kv, hq, hkv, d, lens, 16, seed=batch * 1000 + hq + d + splits, pad=8)


@pytest.mark.parametrize("d", [80, 96])
def test_decode_attention_merge_grid_odd_head_dims(d):
    """head_dim 80 / 96: 20 / 24 float4 columns (spread 4 / 8 at one sequence of 8 heads; 80's 128 threads hold 6 groups
    of 20 and 8 idle threads at spread 1)."""
    from test_gpu_attention import skip_unless_built
    skip_unless_built(d, "u4", "u4")
    run_case("u4/u4", 8, 2, d, [16 * 70 - 3], 16, seed=d, pad=8)
    run_case("u4/u4", 8, 2, d, [900, 17] * 20, 16, seed=d + 1)


def test_decode_attention_merge_grid_large_batch():
    """40 sequences x 32 heads: the per-head merge kernel, 3 splits for the longest, strided output."""
    run_case("u4/u4", 32, 8, 128, [43 if i % 4 == 0 else 1 + i for i in range(40)], 16, seed=40, pad=8)
