"""GPU decode attention over the paged KV cache (f16 / u8 / u4 K and V) vs a float64 reference."""
import math

import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]


def random_kv_tensor(kind, shape, g):
    """(stored tensor on the GPU, params or None, float64 values) for one of K/V."""
    if kind == "f16":
        x = torch.randn(shape, generator=g).half()
        return x.cuda(), None, x.double()
    hi = 256 if kind == "u8" else 16
    q = torch.randint(0, hi, shape, generator=g)
    params = torch.stack([torch.rand(shape[:3], generator=g) * 0.1 + 0.01, torch.randn(shape[:3], generator=g)], -1)
    values = q.double() * params[..., :1].double() + params[..., 1:].double()
    stored = q.to(torch.uint8) if kind == "u8" else (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)
    return stored.cuda(), params.float().cuda(), values


def make_cache(kv, lens, hkv, d, block_size, seed):
    """Random paged cache in the kv_cache.h layout; returns device tensors and float64 K/V per sequence.
    kv is 'f16' / 'u8' / 'u4' for both, or 'K/V' such as 'u8/u4'."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g)
    max_blocks = max(blocks_per_seq)
    table = torch.full((len(lens), max_blocks), -1, dtype=torch.int32)
    pos = 0
    for i, nb in enumerate(blocks_per_seq):
        table[i, :nb] = perm[pos:pos + nb]
        pos += nb
    shape = (num_blocks, hkv, block_size, d)
    kt, vt = kv.split("/") if "/" in kv else (kv, kv)
    k_store, kp, kd = random_kv_tensor(kt, shape, g)
    v_store, vp, vd = random_kv_tensor(vt, shape, g)
    seq_k, seq_v = [], []
    for i, n in enumerate(lens):
        t = torch.arange(n)
        blk = table[i, t // block_size].long()
        seq_k.append(kd[blk, :, t % block_size, :])  # [n, hkv, d]
        seq_v.append(vd[blk, :, t % block_size, :])
    return k_store, v_store, kp, vp, table.cuda(), seq_k, seq_v


def skip_unless_built(d, kt, vt):
    """head_dim 80 and 96 are compiled only with LOWBIT_ATTN_ALL_INSTANCES=ON (docs/build.md)."""
    r = _core.kernels.select_attention(device="cuda", sm=90, phase="decode", head_dim=d, q="f16", k=kt, v=vt)
    if r["kernel"] != "decode_attention_sm80":
        pytest.skip(f"decode instance d{d} k={kt} v={vt} not in this build: {r['reasons']}")


def reference(q, seq_k, seq_v, scale):
    b, hq, d = q.shape
    out = torch.zeros(b, hq, d, dtype=torch.float64)
    for i in range(b):
        k, v = seq_k[i], seq_v[i]
        grp = hq // k.shape[1]
        kk = k.repeat_interleave(grp, dim=1)  # [n, hq, d]
        vv = v.repeat_interleave(grp, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].double(), kk) * scale
        out[i] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), vv)
    return out


@pytest.mark.parametrize("kv", ["f16", "u8", "u4", "u8/u4", "f16/u8", "u4/f16"])
# GQA groups 12 and 16 run as slices of 8 heads (two blocks per kv head); head_dim 256 has its own instances.
# head_dim 80 and 96 have lane runs that are not whole 16-byte loads (and an odd u4 K k-step at 80).
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (32, 8, 128), (8, 1, 128), (4, 4, 64), (24, 2, 64), (16, 1, 128),
                                      (32, 2, 128), (8, 2, 256), (16, 1, 256), (12, 1, 80), (32, 2, 80), (9, 3, 80),
                                      (16, 1, 96), (24, 2, 96), (8, 8, 96)])
@pytest.mark.parametrize("lens,split", [([1], 0), ([17, 5, 300], 0), ([1000, 33], 64), ([700], 512), ([2049, 1], 0)])
def test_decode_attention_matches_float64(kv, hq, hkv, d, lens, split):
    skip_unless_built(d, *(kv.split("/") if "/" in kv else (kv, kv)))
    k, v, kp, vp, table, seq_k, seq_v = make_cache(kv, lens, hkv, d, 16, seed=sum(lens) + hq + d)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(7)).half()
    out = torch.full((len(lens), hq, d), float("nan"), dtype=torch.float16, device="cuda")
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    scale = 1.0 / math.sqrt(d)
    kt, vt = kv.split("/") if "/" in kv else (kv, kv)
    _core.decode_attention(q.cuda(), k, v, kp, vp, table, seq_lens, max(lens), scale, out, kv_dtype=kt,
                           split_tokens=split, v_dtype=vt)
    torch.cuda.synchronize()
    ref = reference(q, seq_k, seq_v, scale)
    got = out.cpu().double()
    assert not torch.isnan(got).any(), "unwritten outputs"
    # f32 softmax/accumulation, f16 output: ~1e-3 relative is the f16 rounding of the output.
    rel = (got - ref).norm() / ref.norm()
    assert rel < 2e-3, f"relative error {rel:.2e}"


@pytest.mark.parametrize("splits", [1, 7])
def test_decode_attention_whole_wave_grid(splits):
    """u4 K and V at head_dim 128 on a grid of 1-2 waves of resident blocks: on sm_90 the split plan feeds the ring
    by bulk copies there (decode_attention_sm80.cu, ring_bulk). The grid is ~6 blocks per SM (1.5 waves at 4 resident
    blocks per SM, within 1-2 waves for 3-5); lengths mix whole 16-token tiles (bulk copies) with partial ones (the
    lanes' copies on the same stage barriers). splits 7: split_tokens 64 over lengths up to 400."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = -(-6 * sms // (8 * splits))
    g = torch.Generator().manual_seed(splits)
    hi = 64 * splits if splits > 1 else 400
    lens = [int(x) for x in torch.randint(1, hi + 1, (batch,), generator=g)]
    lens[:3] = [hi, 16 * (hi // 32), 1]  # a full-length sequence, whole tiles only, one token
    k, v, kp, vp, table, seq_k, seq_v = make_cache("u4", lens, 8, 128, 16, seed=11 + splits)
    q = torch.randn(batch, 32, 128, generator=g).half()
    out = torch.full((batch, 32, 128), float("nan"), dtype=torch.float16, device="cuda")
    scale = 1.0 / math.sqrt(128)
    _core.decode_attention(q.cuda(), k, v, kp, vp, table, torch.tensor(lens, dtype=torch.int32, device="cuda"),
                           max(lens), scale, out, kv_dtype="u4", split_tokens=0 if splits == 1 else 64, v_dtype="u4")
    torch.cuda.synchronize()
    ref = reference(q, seq_k, seq_v, scale)
    got = out.cpu().double()
    assert not torch.isnan(got).any(), "unwritten outputs"
    rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)  # per (sequence, head): a wrong tile shows in its row
    assert rel.max() < 4e-3, f"worst (sequence, head) relative error {rel.max():.2e} at {divmod(int(rel.argmax()), 32)}"


@pytest.mark.parametrize("kv", ["f16", "u4", "u8/u4"])
@pytest.mark.parametrize("block_size,split", [(8, 0), (16, 40), (32, 100), (1, 0)])
@pytest.mark.parametrize("d", [64, 80, 96])
def test_decode_attention_pages_straddling_tiles(kv, block_size, split, d):
    """Block sizes / splits that are not multiples of 16 take the per-token page lookup."""
    kt, vt = kv.split("/") if "/" in kv else (kv, kv)
    skip_unless_built(d, kt, vt)
    lens = [77, 300, 5]
    k, v, kp, vp, table, seq_k, seq_v = make_cache(kv, lens, 2, d, block_size, seed=block_size + split)
    q = torch.randn(len(lens), 8, d, generator=torch.Generator().manual_seed(3)).half()
    out = torch.full((len(lens), 8, d), float("nan"), dtype=torch.float16, device="cuda")
    _core.decode_attention(q.cuda(), k, v, kp, vp, table, torch.tensor(lens, dtype=torch.int32, device="cuda"),
                           max(lens), 0.125, out, kv_dtype=kt, split_tokens=split, v_dtype=vt)
    torch.cuda.synchronize()
    ref = reference(q, seq_k, seq_v, 0.125)
    got = out.cpu().double()
    assert not torch.isnan(got).any()
    assert (got - ref).norm() / ref.norm() < 2e-3


def test_decode_attention_bad_inputs():
    k, v, kp, vp, table, _, _ = make_cache("u8", [20], 2, 64, 16, seed=1)
    q = torch.randn(1, 4, 64, device="cuda").half()
    out = torch.empty(1, 4, 64, device="cuda").half()
    lens = torch.tensor([20], dtype=torch.int32, device="cuda")
    k72, v72, kp72, vp72, table72, _, _ = make_cache("u8", [20], 2, 72, 16, seed=1)  # a consistent head_dim-72 cache
    with pytest.raises(NotImplementedError, match="head_dim 72 has no kernel"):
        _core.decode_attention(torch.randn(1, 4, 72, device="cuda").half(), k72, v72, kp72, vp72, table72, lens, 20,
                               1.0, torch.empty(1, 4, 72, device="cuda").half(), kv_dtype="u8")
    with pytest.raises(ValueError, match=r"'k_data' must have shape \[5, 2, 16, 72\]"):  # q and cache disagree
        _core.decode_attention(torch.randn(1, 4, 72, device="cuda").half(), k, v, kp, vp, table, lens, 20, 1.0,
                               torch.empty(1, 4, 72, device="cuda").half(), kv_dtype="u8")
    with pytest.raises(ValueError, match="k_params"):
        _core.decode_attention(q, k, v, kp[:1].contiguous(), vp, table, lens, 20, 1.0, out, kv_dtype="u8")
    with pytest.raises(ValueError, match="max_seq_len 999"):
        _core.decode_attention(q, k, v, kp, vp, table, lens, 999, 1.0, out, kv_dtype="u8")
    with pytest.raises(TypeError, match="'q' must have dtype f16"):
        _core.decode_attention(q.float(), k, v, kp, vp, table, lens, 20, 1.0, out, kv_dtype="u8")
    with pytest.raises(NotImplementedError, match="GQA group of 17 query heads per kv head has no kernel \\(at most 16\\)"):
        _core.decode_attention(torch.randn(1, 34, 64, device="cuda").half(), k, v, kp, vp, table, lens, 20, 1.0,
                               torch.empty(1, 34, 64, device="cuda").half(), kv_dtype="u8")
    with pytest.raises(ValueError, match="multiple of kv heads"):
        _core.decode_attention(torch.randn(1, 3, 64, device="cuda").half(), k, v, kp, vp, table, lens, 20, 1.0,
                               torch.empty(1, 3, 64, device="cuda").half(), kv_dtype="u8")


def test_decode_attention_instance_left_out_names_the_option():
    r = _core.kernels.select_attention(device="cuda", sm=90, phase="decode", head_dim=80, q="f16", k="u8", v="u8")
    if r["kernel"] == "decode_attention_sm80":
        pytest.skip("built with LOWBIT_ATTN_ALL_INSTANCES=ON: no instance is left out")
    k, v, kp, vp, table, _, _ = make_cache("u8", [20], 2, 80, 16, seed=1)
    lens = torch.tensor([20], dtype=torch.int32, device="cuda")
    with pytest.raises(NotImplementedError, match="head_dim 80 k=u8 v=u8 is not built .*LOWBIT_ATTN_ALL_INSTANCES=ON"):
        _core.decode_attention(torch.randn(1, 4, 80, device="cuda").half(), k, v, kp, vp, table, lens, 20, 1.0,
                               torch.empty(1, 4, 80, device="cuda").half(), kv_dtype="u8")
