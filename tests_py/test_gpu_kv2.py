"""2-bit KV on the GPU (kv2, k4v2, k8v2, kc2..): decode attention over 2-bit codes against a float64 reference,
the per-token 2-bit cache against the CPU cache (same bytes, same attention through chunked prefill and decode), and
the engine against the CPU engine on a random Llama. Per-channel 2-bit K's window and sealing are covered with kc4
in test_gpu_kv_per_channel.py; the bytes of kv_write / rope_kv_write in test_gpu_ops.py."""
import math

import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_attention import reference
from test_gpu_engine import graph_and_eager_greedy, greedy_margin_violations, random_llama, rel_err, run_greedy
from test_gpu_kv_per_channel import as_bytes, step

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

LEVELS = {"f16": None, "u8": 256, "u4": 16, "u2": 4}


def random_side(kind, shape, g):
    """(stored bytes on the GPU, params or None, float64 values) of K or V in the cache layout (kv_cache.h)."""
    if kind == "f16":
        x = torch.randn(shape, generator=g).half()
        return x.cuda(), None, x.double()
    q = torch.randint(0, LEVELS[kind], shape, generator=g)
    params = torch.stack([torch.rand(shape[:3], generator=g) * 0.3 + 0.05, torch.randn(shape[:3], generator=g)], -1)
    values = q.double() * params[..., :1].double() + params[..., 1:].double()
    per = 8 // int(kind[1:])  # codes per byte, little end first
    stored = sum(q[..., j::per] << (8 // per * j) for j in range(per)).to(torch.uint8)
    return stored.cuda(), params.float().cuda(), values


@pytest.mark.parametrize("kv", ["u2/u2", "u2/f16", "f16/u2", "u8/u2", "u2/u8", "u4/u2", "u2/u4"])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (32, 8, 128), (8, 1, 128), (4, 4, 64), (16, 1, 64), (24, 2, 128)])
@pytest.mark.parametrize("lens,split", [([1], 0), ([17, 5, 301], 0), ([1000, 33], 64), ([2049, 1, 77], 0)])
def test_decode_attention_2bit_matches_float64(kv, hq, hkv, d, lens, split):
    """Exact codes and parameters, so the only error is f32 accumulation and the f16 output; odd lengths (partial
    tiles), GQA groups 1-16 (two slices of 8 past 8), forced and chosen splits; NaN-poisoned output."""
    kt, vt = kv.split("/")
    g = torch.Generator().manual_seed(sum(lens) + hq + d + len(kv))
    bs = 16
    blocks_per_seq = [math.ceil(n / bs) for n in lens]
    num_blocks = sum(blocks_per_seq) + 3
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
    out = torch.full((len(lens), hq, d), float("nan"), dtype=torch.float16, device="cuda")
    scale = 1.0 / math.sqrt(d)
    _core.decode_attention(q.cuda(), k, v, kp, vp, table.cuda(), torch.tensor(lens, dtype=torch.int32, device="cuda"),
                           max(lens), scale, out, kv_dtype=kt, split_tokens=split, v_dtype=vt)
    torch.cuda.synchronize()
    ref = reference(q, seq_k, seq_v, scale)
    got = out.cpu().double()
    assert not torch.isnan(got).any(), "unwritten outputs"
    rel = float((got - ref).norm() / ref.norm())
    assert rel < 2e-3, f"relative error {rel:.2e}"


def test_decode_attention_2bit_other_head_dims_are_refused_by_name():
    g = torch.Generator().manual_seed(1)
    for d in (80, 256):
        k, kp, _ = random_side("u2", (2, 1, 16, d), g)
        q = torch.randn(1, 4, d, device="cuda").half()
        with pytest.raises(NotImplementedError, match=f"2-bit K/V .*head_dim 64 and 128 only, got {d}"):
            _core.decode_attention(q, k, k, kp, kp, torch.zeros(1, 1, dtype=torch.int32, device="cuda"),
                                   torch.tensor([5], dtype=torch.int32, device="cuda"), 5, 1.0, torch.empty_like(q),
                                   kv_dtype="u2")


@pytest.mark.parametrize("d,kt,vt", [(128, "u2", "u2"), (64, "u2", "u2"), (128, "u4", "u2"), (64, "u8", "u2"),
                                     (128, "u2", "f16"), (64, "u2", "u4")])
def test_per_token_2bit_cache_matches_the_cpu_cache(d, kt, vt):
    """Chunked prefill (the tensor-core prefill kernel reading 2-bit codes) and decode steps over a GPU cache and a
    CPU cache written from the same f16 rows: the bytes agree, and so does attention (f16 vs f32 arithmetic)."""
    hkv, blocks, bs = 2, 40, 16
    g = torch.Generator().manual_seed(d + len(kt + vt))
    cpu = _core.KVCache(1, hkv, d, blocks, block_size=bs, k_type=kt, v_type=vt)
    gpu = _core.KVCache(1, hkv, d, blocks, block_size=bs, k_type=kt, v_type=vt, device="cuda")
    perm = torch.randperm(blocks, generator=g).tolist()
    tables = [perm[0:14], perm[14:28]]
    errs = [step(cpu, gpu, tables, [(0, 0, 93), (1, 0, 37)], g, d),  # q_len < kv_len from here on
            step(cpu, gpu, tables, [(0, 93, 70), (1, 37, 1)], g, d)]
    pos = [163, 38]
    for _ in range(5):
        errs.append(step(cpu, gpu, tables, [(0, pos[0], 1), (1, pos[1], 1)], g, d))
        pos = [p + 1 for p in pos]
    for name in ("k_data", "v_data", "k_params", "v_params"):
        a, b = getattr(cpu, name)(0), getattr(gpu, name)(0)
        if a is None:
            assert b is None
            continue
        assert torch.equal(as_bytes(a), as_bytes(b)), name
    print(f"d={d} k={kt} v={vt}: worst relative error vs the CPU over {len(errs)} steps: {max(errs):.2e}")
    assert max(errs) < 1e-2, errs


# ---- the engine ------------------------------------------------------------------------------------------------
# The CPU engine computes in f32, the GPU in f16: K/V rows differ by f16 rounding before they are quantized, and a
# 2-bit code is a third of the row's (or channel's) range, so a row value near a rounding boundary moves by that
# much where the two round apart. Wrong indexing or unpacking is off by O(1).
KV2_TOLERANCE = 1.5e-1


@pytest.mark.parametrize("recipe", ["w16a16kv2", "w4a16k4v2", "w16a16k8v2", "w16a16k2v8", "w16a16kc2v2",
                                    "w4a16kc2g32v4", "w16a16kc4v2", "w8a8kc2g128v2"])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_random_llama_2bit_kv_logits_match_cpu(recipe, head_dim):
    cpu = random_llama(recipe, "cpu", "f32", head_dim=head_dim)
    gpu = random_llama(recipe, "cuda", "f16", head_dim=head_dim)
    plan = {p["role"]: p for p in gpu.plan() if p["role"].startswith("attention")}
    assert plan and all(not p["fallback"] for p in plan.values()), plan
    ids = torch.randint(0, 1000, (203,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = torch.from_dlpack(_core.Engine(cpu, max_batch_tokens=48).logits(ids))
    got = torch.from_dlpack(_core.Engine(gpu, max_batch_tokens=48).logits(ids))  # chunked prefill
    assert got.shape == ref.shape and not torch.isnan(got).any()
    err = rel_err(got, ref)
    print(recipe, head_dim, "relative logit error vs the CPU:", err)
    assert err < KV2_TOLERANCE


@pytest.mark.parametrize("recipe", ["w16a16kv2", "w16a16kc2g32v2", "w4a16kc4v2"])
def test_2bit_decode_graphs_agree_with_eager_steps(recipe):
    """CUDA-graph decode steps vs eager steps of the same GPU engine (same cache format, same kernels): every graph
    token within 0.05 logits of the eager argmax given the same history."""
    ref, got = graph_and_eager_greedy(random_llama(recipe, "cuda", "f16", seed=5))
    assert sum(a == b for a, b in zip(ref, got)) >= 3


@pytest.mark.parametrize("recipe", ["w16a16kv2", "w16a16kc2g32v4"])
def test_random_llama_2bit_batched_greedy_decode_follows_cpu(recipe):
    """Greedy GPU decoding of a batch (odd prompt lengths, block and group boundaries crossed while decoding),
    teacher-forced through the CPU engine: the GPU's tokens stay near the CPU's argmax (a looser margin than kv8's
    0.1 for the 2-bit codes the f16 and f32 rows round apart)."""
    cpu = random_llama(recipe, "cpu", "f32", seed=3)
    gpu = random_llama(recipe, "cuda", "f16", seed=3)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (1, 5, 16, 17, 40, 99)]
    gpu_tokens = run_greedy(_core.Engine(gpu, max_batch_tokens=64), prompts, 24)
    assert all(len(t) == 24 for t in gpu_tokens)
    bad = greedy_margin_violations(_core.Engine(cpu), prompts, gpu_tokens, 0.5)
    assert bad == [], bad


@pytest.mark.parametrize("recipe", ["w16a16kc2g32v4", "w16a16kc4g32v2"])
def test_per_channel_k_window_survives_preemption_on_the_gpu(recipe):
    """A pool of 6 blocks for 4 requests of up to 4 blocks each: requests wait and are preempted (blocks freed with
    their window rows, the sequence recomputed by prefill chunks). The GPU's tokens, teacher-forced through the CPU
    engine, stay near its argmax (as the batched test's), and every block comes back."""
    cpu = random_llama(recipe, "cpu", "f32", seed=3)
    gpu = random_llama(recipe, "cuda", "f16", seed=3)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (70, 5, 40, 33)]
    eng = _core.Engine(gpu, max_batch_tokens=16, kv_cache_bytes=6 * 32 * gpu.info()["kv_bytes_per_token"])
    gpu_tokens = run_greedy(eng, prompts, 30)
    st = eng.stats()
    assert st["block_size"] == 32 and st["preemptions"] > 0 and st["num_free_blocks"] == st["num_blocks"]
    assert all(len(t) == 30 for t in gpu_tokens)
    bad = greedy_margin_violations(_core.Engine(cpu), prompts, gpu_tokens, 0.5)
    assert bad == [], bad


@pytest.mark.parametrize("head_dim", [256, 80])
def test_2bit_kv_on_other_head_dims_is_refused_at_load(head_dim):
    with pytest.raises(NotImplementedError, match=f"2-bit KV.*head_dim 64 and 128 only, this model has {head_dim}"):
        random_llama("w16a16kv2", "cuda", "f16", head_dim=head_dim)
