"""rope, kv_write and paged_attention from Python, against torch: HF-style rotary embedding
(transformers' own llama3 frequencies and apply_rotary_pos_emb) and scaled_dot_product_attention
over the cache contents dequantized here in torch."""
import math

import pytest

torch = pytest.importorskip("torch")
import lowbit  # noqa: E402,F401
from lowbit import _core as lb  # noqa: E402

TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
ROUNDING = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}


# ---- helpers ---------------------------------------------------------------------------------
def dequantized_cache(data, params, kv_type, head_dim):
    """Cache side as float64 [num_blocks, heads, block_size, head_dim], decoded independently."""
    if kv_type in TORCH_DTYPE:
        return torch.from_dlpack(data).to(torch.float64)
    raw = torch.from_dlpack(data.view_as_bytes()).reshape(*data.shape[:3], -1)
    if kv_type == "u4":  # element 2i in the low nibble of byte i
        raw = torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(*data.shape[:3], head_dim)
    p = torch.from_dlpack(params).to(torch.float64)
    return raw.to(torch.float64) * p[..., :1] + p[..., 1:]


def gather(side, table, kv_len, block_size):
    """Rows of one sequence in position order: [kv_len, heads, head_dim]."""
    pos = torch.arange(kv_len)
    blocks = torch.tensor(table)[pos // block_size]
    return side[blocks, :, pos % block_size, :]


def reference_attention(q, k_all, v_all, meta, tables, block_size, scale):
    out = torch.empty(q.shape, dtype=torch.float64)
    hq, hkv = q.shape[1], k_all.shape[1]
    for i, (qs, ql, kl) in enumerate(zip(meta.q_start, meta.q_len, meta.kv_len)):
        k = gather(k_all, tables[i], kl, block_size).repeat_interleave(hq // hkv, dim=1)
        v = gather(v_all, tables[i], kl, block_size).repeat_interleave(hq // hkv, dim=1)
        qi = q[qs:qs + ql].to(torch.float64)
        mask = torch.arange(kl)[None, :] <= (kl - ql + torch.arange(ql))[:, None]  # causal with offset
        o = torch.nn.functional.scaled_dot_product_attention(
            qi.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale)
        out[qs:qs + ql] = o.transpose(0, 1)
    return out


def build_step(seqs, hkv, head_dim, block_size, k_type, v_type, in_dtype=torch.float32, seed=0):
    """Allocates blocks with a BlockAllocator, writes each sequence's history and then one mixed
    step's new tokens through kv_write; returns the cache, the step's meta and the block tables."""
    g = torch.Generator().manual_seed(seed)
    alloc = lb.BlockAllocator(num_blocks=sum(-(-kl // block_size) for _, kl in seqs) + 4, block_size=block_size)
    cache = lb.KVCache(num_layers=2, num_kv_heads=hkv, head_dim=head_dim, num_blocks=alloc.num_blocks,
                       block_size=block_size, k_type=k_type, v_type=v_type)
    ids = [alloc.create_sequence() for _ in seqs]
    filler = alloc.create_sequence()  # interleaves allocations so tables are not contiguous

    def write(slots):
        t = len(slots)
        k = torch.randn(t, hkv, head_dim, generator=g).to(in_dtype)
        v = torch.randn(t, hkv, head_dim, generator=g).to(in_dtype)
        meta = lb.AttentionMeta([], [], [], slot_mapping=torch.tensor(slots, dtype=torch.int32))
        lb.kv_write(cache, 1, k, v, meta)

    for sid, (ql, kl) in zip(ids, seqs):  # history: the kl - ql tokens cached before this step
        alloc.append_tokens(filler, 1)
        alloc.append_tokens(sid, kl - ql)
        if kl - ql:
            write([alloc.slot_of(sid, j) for j in range(kl - ql)])
    step_slots, q_start, t = [], [], 0
    for sid, (ql, kl) in zip(ids, seqs):
        assert alloc.append_tokens(sid, ql)[0]
        step_slots += [alloc.slot_of(sid, j) for j in range(kl - ql, kl)]
        q_start.append(t)
        t += ql
    write(step_slots)
    tables = [alloc.block_table(s) for s in ids]
    width = max(len(tb) for tb in tables) + 1
    bt = torch.full((len(seqs), width), -1, dtype=torch.int32)
    for i, tb in enumerate(tables):
        bt[i, :len(tb)] = torch.tensor(tb, dtype=torch.int32)
    meta = lb.AttentionMeta(q_start, [ql for ql, _ in seqs], [kl for _, kl in seqs], block_tables=bt,
                            slot_mapping=torch.tensor(step_slots, dtype=torch.int32))
    return cache, meta, tables, t


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


MIXED = [(1, 37), (23, 23), (5, 50), (1, 1), (19, 70)]  # decode, prefill, chunked prefill, first token, > 1 tile


# ---- paged attention -------------------------------------------------------------------------
@pytest.mark.parametrize("k_type", ["f32", "f16", "bf16", "u8", "u4"])
@pytest.mark.parametrize("v_type", ["f32", "f16", "bf16", "u8", "u4"])
def test_paged_attention_matches_sdpa_for_every_kv_type_pair(k_type, v_type):
    hq, hkv, d, bs = 9, 3, 64, 16
    cache, meta, tables, t = build_step(MIXED, hkv, d, bs, k_type, v_type, seed=len(k_type) * 7 + len(v_type) + ord(k_type[-1]) * 11 + ord(v_type[-1]))
    q = torch.randn(t, hq, d, dtype=torch.float32)
    out = torch.full_like(q, float("nan"))
    scale = 1 / math.sqrt(d)
    lb.paged_attention(q, cache, 1, meta, scale, out)
    k_all = dequantized_cache(cache.k_data(1), cache.k_params(1), k_type, d)
    v_all = dequantized_cache(cache.v_data(1), cache.v_params(1), v_type, d)
    ref = reference_attention(q, k_all, v_all, meta, tables, bs, scale)
    torch.testing.assert_close(out.to(torch.float64), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hq,hkv,d,bs", [(5, 5, 80, 32), (7, 1, 96, 64), (8, 2, 128, 16), (2, 1, 256, 32)])
@pytest.mark.parametrize("q_type", ["f16", "bf16"])
def test_paged_attention_head_layouts_and_half_precision(hq, hkv, d, bs, q_type):
    cache, meta, tables, t = build_step(MIXED, hkv, d, bs, "u8", "u4", in_dtype=TORCH_DTYPE[q_type], seed=d)
    q = torch.randn(t, hq, d).to(TORCH_DTYPE[q_type])
    out = lb.paged_attention(q, cache, 1, meta, 1 / math.sqrt(d), None)  # allocated like q
    out = torch.from_dlpack(out)
    assert out.dtype == TORCH_DTYPE[q_type]
    k_all = dequantized_cache(cache.k_data(1), cache.k_params(1), "u8", d)
    v_all = dequantized_cache(cache.v_data(1), cache.v_params(1), "u4", d)
    ref = reference_attention(q, k_all, v_all, meta, tables, bs, 1 / math.sqrt(d))
    torch.testing.assert_close(out.to(torch.float64), ref, rtol=1.01 * ROUNDING[q_type], atol=1e-5)


def test_fork_with_copy_on_write_keeps_the_shared_prefix():
    """A forked sequence's decode step reads the parent's prefix through shared blocks plus its own
    copied last block; attention equals the same sequence built without sharing."""
    d, bs = 64, 16
    alloc = lb.BlockAllocator(8, bs)
    cache = lb.KVCache(1, 1, d, 8, bs, "u4", "u8")
    g = torch.Generator().manual_seed(4)
    parent = alloc.create_sequence()
    alloc.append_tokens(parent, 20)
    k = torch.randn(21, 1, d, generator=g)
    v = torch.randn(21, 1, d, generator=g)
    slots = torch.tensor([alloc.slot_of(parent, j) for j in range(20)], dtype=torch.int32)
    lb.kv_write(cache, 0, k[:20], v[:20], lb.AttentionMeta([], [], [], slot_mapping=slots))
    child = alloc.fork(parent)
    ok, copies = alloc.append_tokens(child, 1)
    assert ok and len(copies) == 1
    for src, dst in copies:
        cache.copy_block(src, dst)
    slot = alloc.slot_of(child, 20)
    lb.kv_write(cache, 0, k[20:], v[20:], lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([slot], dtype=torch.int32)))
    q = torch.randn(1, 2, d, generator=g)

    def attend(seq, n):
        bt = torch.tensor([alloc.block_table(seq)], dtype=torch.int32)
        return torch.from_dlpack(lb.paged_attention(q, cache, 0, lb.AttentionMeta([0], [1], [n], bt), 0.125, None))

    out_child = attend(child, 21)
    k_all = dequantized_cache(cache.k_data(0), cache.k_params(0), "u4", d)
    v_all = dequantized_cache(cache.v_data(0), cache.v_params(0), "u8", d)
    meta = lb.AttentionMeta([0], [1], [21])
    ref = reference_attention(q, k_all, v_all, meta, [alloc.block_table(child)], bs, 0.125)
    torch.testing.assert_close(out_child.to(torch.float64), ref, rtol=1e-5, atol=1e-5)
    # The parent's partially filled block was not written by the child's append.
    torch.testing.assert_close(attend(parent, 20).to(torch.float64),
                               reference_attention(q, k_all, v_all, lb.AttentionMeta([0], [1], [20]),
                                                   [alloc.block_table(parent)], bs, 0.125), rtol=1e-5, atol=1e-5)


# ---- kv_write ------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_type,bits", [("u8", 8), ("u4", 4)])
def test_kv_write_round_trip_within_half_a_step(kv_type, bits):
    d, bs = 96, 16
    cache = lb.KVCache(1, 2, d, 4, bs, kv_type, kv_type)
    k = torch.randn(9, 2, d) * torch.linspace(0.1, 3, d)
    k[3, 1] = 0.5  # constant row: scale 0, exact
    slots = torch.tensor([0, 5, 17, 63, 2, 40, 41, 9, 30], dtype=torch.int32)
    lb.kv_write(cache, 0, k, k.clone(), lb.AttentionMeta([], [], [], slot_mapping=slots))
    deq = dequantized_cache(cache.k_data(0), cache.k_params(0), kv_type, d)
    params = torch.from_dlpack(cache.k_params(0))
    for t, s in enumerate(slots.tolist()):
        got = deq[s // bs, :, s % bs]
        step = (k[t].amax(-1) - k[t].amin(-1)) / (2**bits - 1)
        torch.testing.assert_close(params[s // bs, :, s % bs, 1], k[t].amin(-1))  # zero = min
        assert ((got - k[t].double()).abs() <= step.double()[:, None] / 2 * 1.0001 + 1e-7).all()
    assert torch.equal(deq[63 // bs, 1, 63 % bs], torch.full((d,), 0.5, dtype=torch.float64))


# ---- rope --------------------------------------------------------------------------------------
def hf_rope(q, k, positions, inv_freq):
    """transformers' apply_rotary_pos_emb on float64 cos/sin built from the given frequencies."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    freqs = positions.double()[:, None] * inv_freq.double()[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    # HF layout is [batch, heads, seq, dim]; ours [seq, heads, dim].
    qr, kr = apply_rotary_pos_emb(q.double().transpose(0, 1)[None], k.double().transpose(0, 1)[None],
                                  emb.cos()[None], emb.sin()[None])
    return qr[0].transpose(0, 1), kr[0].transpose(0, 1)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_rope_matches_transformers_default(dtype):
    d, theta = 64, 100000.0
    q = torch.randn(11, 9, d).to(TORCH_DTYPE[dtype])
    k = torch.randn(11, 3, d).to(TORCH_DTYPE[dtype])
    pos = torch.tensor([0, 1, 2, 3, 10, 100, 511, 1000, 2047, 3000, 4095], dtype=torch.int32)
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    qr, kr = hf_rope(q, k, pos, inv)
    lb.rope(q, k, pos, theta=theta)
    tol = dict(rtol=1.01 * ROUNDING[dtype] + 1e-6, atol=1e-5)
    torch.testing.assert_close(q.double(), qr, **tol)
    torch.testing.assert_close(k.double(), kr, **tol)


def test_rope_llama3_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    d = 128
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = LlamaConfig(hidden_size=8 * d, num_attention_heads=8, rope_theta=500000.0, rope_scaling=scaling)
    inv_hf, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")  # float32 frequencies
    q = torch.randn(6, 4, d)
    k = torch.randn(6, 2, d)
    pos = torch.tensor([0, 7, 300, 1500, 2900, 4000], dtype=torch.int32)
    qr, kr = hf_rope(q, k, pos, inv_hf)
    lb.rope(q, k, pos, theta=500000.0, llama3=True, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position=8192)
    # HF's f32 frequencies carry ~6e-8 relative error: at position 4000 that is ~3e-4 rad.
    torch.testing.assert_close(q.double(), qr, rtol=0, atol=2e-3)
    torch.testing.assert_close(k.double(), kr, rtol=0, atol=2e-3)
    plain = torch.randn(1, 1, d)
    scaled = plain.clone()
    lb.rope(plain, None, torch.tensor([4000], dtype=torch.int32), theta=500000.0)
    lb.rope(scaled, None, torch.tensor([4000], dtype=torch.int32), theta=500000.0, llama3=True, factor=8.0)
    assert not torch.allclose(plain, scaled)  # the scaling is applied


def test_rope_gptj_and_partial_rotation():
    d, rd = 80, 32
    q = torch.randn(5, 2, d, dtype=torch.float64).float()
    pos = torch.tensor([0, 3, 17, 250, 999], dtype=torch.int32)
    ref = q.double().clone()
    inv = 1.0 / 10000.0 ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    ang = pos.double()[:, None] * inv[None, :]
    x, y = ref[..., 0:rd:2].clone(), ref[..., 1:rd:2].clone()  # GPT-J pairs (2i, 2i+1)
    ref[..., 0:rd:2] = x * ang.cos()[:, None] - y * ang.sin()[:, None]
    ref[..., 1:rd:2] = y * ang.cos()[:, None] + x * ang.sin()[:, None]
    before = q.clone()
    lb.rope(q, None, pos, neox=False, rotary_dim=rd)
    torch.testing.assert_close(q.double(), ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(q[..., rd:], before[..., rd:])


# ---- errors ------------------------------------------------------------------------------------
def small_setup():
    cache = lb.KVCache(2, 1, 64, 4, 16, "f16", "u4")
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    return cache, lb.AttentionMeta([0], [2], [20], block_tables=bt, slot_mapping=torch.tensor([3, 4], dtype=torch.int32))


def test_attention_errors_name_op_argument_and_values():
    cache, meta = small_setup()
    q = torch.randn(2, 3, 64)
    with pytest.raises(TypeError, match="paged_attention: argument 'q' must be f32, f16 or bf16, got s32"):
        lb.paged_attention(q.int(), cache, 0, meta, 0.1, None)
    with pytest.raises(ValueError, match="argument 'q' has head_dim 32 but the cache has 64"):
        lb.paged_attention(torch.randn(2, 3, 32), cache, 0, meta, 0.1, None)
    with pytest.raises(IndexError, match="argument 'layer' = 2 out of range \\[0, 2\\)"):
        lb.paged_attention(q, cache, 2, meta, 0.1, None)
    with pytest.raises(ValueError, match=r"argument 'out' must have shape \[2, 3, 64\].*got \[2, 3, 63\]"):
        lb.paged_attention(q, cache, 0, meta, 0.1, torch.empty(2, 3, 63))
    with pytest.raises(ValueError, match="argument 'meta.block_tables' is an undefined tensor"):
        lb.paged_attention(q, cache, 0, lb.AttentionMeta([0], [2], [20]), 0.1, None)
    bad = lb.AttentionMeta([0], [2], [1], block_tables=meta.block_tables)
    with pytest.raises(ValueError, match="sequence 0 has kv_len 1 < q_len 2"):
        lb.paged_attention(q, cache, 0, bad, 0.1, None)
    bad = lb.AttentionMeta([0], [2], [40], block_tables=meta.block_tables)
    with pytest.raises(ValueError, match="needs 3 blocks for kv_len 40 but meta.block_tables has 2 columns"):
        lb.paged_attention(q, cache, 0, bad, 0.1, None)
    bad = lb.AttentionMeta([0], [2], [20], block_tables=torch.tensor([[0, 7]], dtype=torch.int32))
    with pytest.raises(IndexError, match=r"meta.block_tables\[0, 1\] = 7 is not a block of the cache \[0, 4\)"):
        lb.paged_attention(q, cache, 0, bad, 0.1, None)
    bad = lb.AttentionMeta([1], [2], [20], block_tables=meta.block_tables)
    with pytest.raises(ValueError, match="outside the 2 query tokens"):
        lb.paged_attention(q, cache, 0, bad, 0.1, None)
    with pytest.raises(ValueError, match="argument 'scale' must be finite, got inf"):
        lb.paged_attention(q, cache, 0, meta, float("inf"), None)


def test_kv_write_and_rope_errors():
    cache, meta = small_setup()
    k = torch.randn(2, 1, 64)
    with pytest.raises(ValueError, match=r"kv_write: argument 'v' must have shape \[2, 1, 64\].*got \[2, 2, 64\]"):
        lb.kv_write(cache, 0, k, torch.randn(2, 2, 64), meta)
    with pytest.raises(IndexError, match="meta.slot_mapping\\[1\\] = 64 is past the cache's 64 slots"):
        lb.kv_write(cache, 0, k, k, lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 64], dtype=torch.int32)))
    with pytest.raises(TypeError, match="kv_write: argument 'meta.slot_mapping' must have dtype s32, got s64"):
        lb.kv_write(cache, 0, k, k, lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 1])))  # int64
    q = torch.randn(3, 2, 64)
    with pytest.raises(ValueError, match="rope: rotary_dim 33 must be even"):
        lb.rope(q, None, torch.tensor([0, 1, 2], dtype=torch.int32), rotary_dim=33)
    with pytest.raises(ValueError, match=r"rope: argument 'positions' must have shape \[3\].*got \[2\]"):
        lb.rope(q, None, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="rope: arguments 'q' and 'k' are both undefined"):
        lb.rope(None, None, torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="llama3 needs 0 < low_freq_factor < high_freq_factor"):
        lb.rope(q, None, torch.tensor([0, 1, 2], dtype=torch.int32), llama3=True, low_freq_factor=4.0)


def test_rope_kv_write_errors_are_those_of_rope_and_kv_write():
    """The fused op checks both ops' arguments (naming itself) before it changes anything."""
    cache, meta = small_setup()
    q, k, pos = torch.randn(2, 3, 64), torch.randn(2, 1, 64), torch.tensor([5, 6], dtype=torch.int32)
    q0, k0 = q.clone(), k.clone()
    with pytest.raises(ValueError, match=r"rope_kv_write: argument 'v' must have shape \[2, 1, 64\].*got \[2, 2, 64\]"):
        lb.rope_kv_write(q, k, torch.randn(2, 2, 64), pos, cache, 0, meta)
    with pytest.raises(IndexError, match="rope_kv_write: meta.slot_mapping\\[1\\] = 64 is past the cache's 64 slots"):
        lb.rope_kv_write(q, k, k, pos, cache, 0,
                         lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 64], dtype=torch.int32)))
    with pytest.raises(TypeError, match="rope_kv_write: argument 'meta.slot_mapping' must have dtype s32, got s64"):
        lb.rope_kv_write(q, k, k, pos, cache, 0, lb.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="rope_kv_write: rotary_dim 33 must be even"):
        lb.rope_kv_write(q, k, k, pos, cache, 0, meta, rotary_dim=33)
    with pytest.raises(ValueError, match=r"rope_kv_write: argument 'positions' must have shape \[2\].*got \[3\]"):
        lb.rope_kv_write(q, k, k, torch.tensor([0, 1, 2], dtype=torch.int32), cache, 0, meta)
    with pytest.raises(ValueError, match="rope_kv_write: arguments 'q' .* and 'k' .* must agree on tokens"):
        lb.rope_kv_write(torch.randn(3, 3, 64), k, k, pos, cache, 0, meta)
    with pytest.raises(IndexError, match="rope_kv_write: argument 'layer' = 2 out of range"):
        lb.rope_kv_write(q, k, k, pos, cache, 2, meta)
    with pytest.raises(ValueError, match="llama3 needs 0 < low_freq_factor < high_freq_factor"):
        lb.rope_kv_write(q, k, k, pos, cache, 0, meta, llama3=True, low_freq_factor=4.0)
    with pytest.raises(TypeError, match="rope_kv_write: argument 'k' must be f32, f16 or bf16, got s32"):
        lb.rope_kv_write(q, k.int(), k, pos, cache, 0, meta)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # nothing rotated by a refused call


@pytest.mark.parametrize("kv", ["f32", "u8", "u4"])
def test_rope_kv_write_is_rope_then_kv_write(kv):
    hq, hkv, d, bs, t = 6, 2, 64, 16, 9
    qkv = torch.randn(t, hq + 2 * hkv, d, generator=torch.Generator().manual_seed(3))
    pos = torch.arange(29, 29 + t, dtype=torch.int32)
    slots = torch.tensor([17, 18, 19, 20, -1, 40, 41, 3, 4], dtype=torch.int32)
    meta = lb.AttentionMeta([], [], [], slot_mapping=slots)
    caches, bufs = [], []
    for fused in (False, True):
        cache, buf = lb.KVCache(2, hkv, d, 4, bs, kv, kv), qkv.clone()
        q, k, v = buf[:, :hq], buf[:, hq:hq + hkv], buf[:, hq + hkv:]
        if fused:
            lb.rope_kv_write(q, k, v, pos, cache, 1, meta, theta=5e5, neox=False)
        else:
            lb.rope(q, k, pos, theta=5e5, neox=False)
            lb.kv_write(cache, 1, k, v, meta)
        caches.append(cache)
        bufs.append(buf)
    assert torch.equal(bufs[0], bufs[1])
    for get in ("k_data", "v_data", "k_params", "v_params"):
        a, b = getattr(caches[0], get)(1), getattr(caches[1], get)(1)
        if a is None:
            assert b is None
            continue
        assert torch.equal(torch.from_dlpack(a).view(torch.uint8), torch.from_dlpack(b).view(torch.uint8)), get


def test_strided_views_of_a_fused_qkv_buffer():
    """The model hands q, k, v as views into one [T, Hq + 2 Hkv, D] projection output."""
    hq, hkv, d, bs = 9, 3, 64, 16
    t = 7
    qkv = torch.randn(t, hq + 2 * hkv, d)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    assert not q.is_contiguous()
    pos = torch.arange(3, 3 + t, dtype=torch.int32)
    q_ref, k_ref = q.clone(), k.clone()
    lb.rope(q_ref, k_ref, pos, theta=1e5)
    lb.rope(q, k, pos, theta=1e5)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    cache = lb.KVCache(1, hkv, d, 2, bs, "f32", "f32")
    slots = torch.arange(t, dtype=torch.int32)
    bt = torch.tensor([[0]], dtype=torch.int32)
    meta = lb.AttentionMeta([0], [t], [t], block_tables=bt, slot_mapping=slots)
    lb.kv_write(cache, 0, k, v, meta)
    k_cache = torch.from_dlpack(cache.k_data(0))[0, :, :t].transpose(0, 1)
    assert torch.equal(k_cache, k)
    out_buf = torch.full((t, 2 * hq, d), float("nan"))
    out = out_buf[:, hq:]  # strided output too
    lb.paged_attention(q, cache, 0, meta, 0.125, out)
    ref = reference_attention(q, torch.from_dlpack(cache.k_data(0)).double(), torch.from_dlpack(cache.v_data(0)).double(),
                              meta, [[0]], bs, 0.125)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.isnan(out_buf[:, :hq]).all()


def cuda_labelled(t):
    """A lowbit tensor over `t`'s host memory whose DLPack device says CUDA: lets a CPU-only build
    check that the ops refuse GPU tensors before touching them."""
    import ctypes
    cap = t.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    managed = get(cap, b"dltensor")
    ctypes.c_int32.from_address(managed + ctypes.sizeof(ctypes.c_void_p)).value = 2  # DLTensor.device = kDLCUDA
    x = lb.from_dlpack(cap)
    assert x.device == "cuda:0"
    return x


def test_gpu_tensors_are_refused_by_the_cpu_kernels():
    if lb.cuda_available():
        pytest.skip("the CUDA-labelled host tensors would reach a real GPU kernel")
    cache, meta = small_setup()
    q = torch.randn(2, 3, 64)
    # Mixed placements name both arguments.
    with pytest.raises(TypeError, match="paged_attention: argument 'out' is on cpu but argument 'q' is on cuda:0; "
                                        "all operands must be on one device"):
        lb.paged_attention(cuda_labelled(q), cache, 0, meta, 0.1, torch.empty_like(q))
    k = torch.randn(2, 1, 64)
    with pytest.raises(TypeError, match="kv_write: argument 'v' is on cpu but argument 'k' is on cuda:0"):
        lb.kv_write(cache, 0, cuda_labelled(k), k, meta)
    # Every operand on the GPU, on a machine (or build) without one: the reason is given.
    pos = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises((NotImplementedError, RuntimeError),
                       match="rope: device cuda:0 requested but (this lowbit build has no CUDA support"
                             "|no CUDA GPU is available)"):
        lb.rope(cuda_labelled(q), None, cuda_labelled(pos))
