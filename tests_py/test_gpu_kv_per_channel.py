"""Per-channel 4- and 2-bit K (kc4, kc2: KIVI / BitDecoding) on the GPU against the CPU cache, which defines the format and
its f16 window (include/lowbit/kv/kv_cache.h): the same f16 K rows quantize to the same bytes, and the attention of
every step (chunked prefill over blocks completed inside the chunk, decode over the window, a fork) matches the
CPU's. The engine-level checks (random Llama vs the CPU, graphs vs eager, prefix caching) are in
test_gpu_engine.py's recipe lists."""
import math

import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

HQ, HKV, BLOCKS = 8, 2, 40


def as_bytes(t):
    return torch.from_dlpack(t.to("cpu").view_as_bytes()).clone()


def caches(d, group, v_type, slots=8, k_type="u4"):
    cpu = _core.KVCache(1, HKV, d, BLOCKS, block_size=group, k_type=k_type, v_type=v_type, k_per_channel=True)
    gpu = _core.KVCache(1, HKV, d, BLOCKS, block_size=group, k_type=k_type, v_type=v_type, device="cuda",
                        k_per_channel=True, k_window_slots=slots)
    return cpu, gpu


def step(cpu, gpu, tables, chunks, g, d):
    """One step: chunks = [(seq, start, length)]; writes fresh K/V, runs attention on both caches and returns the
    relative error of the GPU output against the CPU's (f32 q and out there)."""
    bs = cpu.block_size
    slots, q_start, q_len, kv_len = [], [], [], []
    for seq, start, n in chunks:
        q_start.append(len(slots))
        q_len.append(n)
        kv_len.append(start + n)
        slots += [tables[seq][p // bs] * bs + p % bs for p in range(start, start + n)]
    t = len(slots)
    k = (torch.randn(t, HKV, d, generator=g) * 2).half()
    k[:, :, 3] += 8.0  # an outlier channel: the case per-channel K is for
    v = torch.randn(t, HKV, d, generator=g).half()
    q = torch.randn(t, HQ, d, generator=g).half()
    width = max(len(r) for r in tables)
    table = torch.tensor([r + [-1] * (width - len(r)) for r in (tables[s] for s, _, _ in chunks)], dtype=torch.int32)
    slot_t = torch.tensor(slots, dtype=torch.int32)
    scale = 1 / math.sqrt(d)

    meta_c = _core.AttentionMeta(q_start, q_len, kv_len, table, slot_t)
    _core.kv_write(cpu, 0, k, v, meta_c)
    ref = torch.empty(t, HQ, d)
    _core.paged_attention(q.float(), cpu, 0, meta_c, scale, ref)

    meta_g = _core.AttentionMeta(q_start, q_len, kv_len, table.cuda(), slot_t.cuda())
    _core.prepare_k_window(gpu, slot_t)
    _core.kv_write(gpu, 0, k.cuda(), v.cuda(), meta_g)
    out = torch.zeros(t, HQ, d, device="cuda").half()
    _core.paged_attention(q.cuda(), gpu, 0, meta_g, scale, out)
    torch.cuda.synchronize()
    return float((out.double().cpu() - ref.double()).abs().max() / ref.double().abs().max())


def sealed_bytes_agree(cpu, gpu, blocks):
    """Codes and per-channel (scale, zero) of sealed blocks: the same f16 rows give the same bytes."""
    for b in blocks:
        for name in ("k_data", "k_params"):
            a, c = as_bytes(getattr(cpu, name)(0))[b], as_bytes(getattr(gpu, name)(0))[b]
            assert torch.equal(a, c), (name, b)


@pytest.mark.parametrize("d,group,v_type,k_type", [
    (128, 64, "u4", "u4"), (128, 32, "u8", "u4"), (64, 64, "f16", "u4"), (64, 128, "u4", "u4"), (128, 128, "u8", "u4"),
    # kc2: 2-bit K per channel, with each V format (u2 V per token too), both head dims, all three groups.
    (128, 64, "u2", "u2"), (64, 32, "u4", "u2"), (128, 32, "f16", "u2"), (64, 128, "u8", "u2"), (64, 64, "u2", "u4"),
    (128, 128, "u2", "u2")])
def test_prefill_decode_and_fork_match_the_cpu_cache(d, group, v_type, k_type):
    g = torch.Generator().manual_seed(d + group)
    cpu, gpu = caches(d, group, v_type, k_type=k_type)
    perm = torch.randperm(BLOCKS, generator=g).tolist()
    tables = [perm[0:6], perm[6:12]]  # two sequences, blocks in random order
    errs = []
    # Chunked prefill: 1.5 groups then a chunk that completes a block mid-chunk (queries before its last key
    # read the window, later ones the codes), beside a second sequence's prefill of an odd length.
    errs.append(step(cpu, gpu, tables, [(0, 0, group + group // 2), (1, 0, 37)], g, d))
    errs.append(step(cpu, gpu, tables, [(0, group + group // 2, group), (1, 37, 1)], g, d))
    pos = [group * 5 // 2, 38]
    for _ in range(group + 3):  # decode across a block boundary of each sequence
        errs.append(step(cpu, gpu, tables, [(0, pos[0], 1), (1, pos[1], 1)], g, d))
        pos = [p + 1 for p in pos]
    sealed = [tables[0][i] for i in range(pos[0] // group)] + [tables[1][i] for i in range(pos[1] // group)]
    sealed_bytes_agree(cpu, gpu, sealed)
    # A fork of sequence 1 mid-block: copy-on-write of its partly filled last block, window rows included.
    last = pos[1] // group
    fork_block = perm[12]
    cpu.copy_block(tables[1][last], fork_block)
    gpu.copy_block(tables[1][last], fork_block)
    tables.append(tables[1][:last] + [fork_block])
    for _ in range(4):
        errs.append(step(cpu, gpu, tables, [(1, pos[1], 1), (2, pos[1], 1)], g, d))
        pos[1] += 1
    worst = max(errs)
    print(f"d={d} G={group} k={k_type} v={v_type}: worst relative error vs the CPU over {len(errs)} steps: {worst:.2e}")
    # f16 q folded with the per-channel scales and f16 P against f32 on the CPU: observed ~3e-3.
    assert worst < 2e-2, errs
    assert gpu.k_window_slots_in_use <= 8


def test_window_slots_run_out_with_a_named_error():
    cpu, gpu = caches(64, 32, "u4", slots=2)
    g = torch.Generator().manual_seed(3)
    tables = [[0, 1], [2, 3], [4, 5]]
    step(cpu, gpu, tables, [(0, 0, 5), (1, 0, 5)], g, 64)
    with pytest.raises(RuntimeError, match="all 2 per-channel K window slots are held by live blocks"):
        _core.prepare_k_window(gpu, torch.tensor([4 * 32], dtype=torch.int32))


@pytest.mark.parametrize("k_type", ["u4", "u2"])
def test_registry_plans_per_channel_k_on_the_tensor_cores(k_type):
    # Prefill on sm_90 takes the wgmma kernel (its own per-channel tests: test_gpu_prefill_sm90.py).
    for phase, kernel in [("decode", "decode_attention_sm80"), ("prefill", "prefill_attention_sm90")]:
        r = _core.kernels.select_attention(device="cuda", sm=90, phase=phase, head_dim=128, q="f16", k=k_type, v="u4",
                                           gqa=4, block_size=64, k_per_channel=True)
        assert r["kernel"] == kernel and not r["fallback"], r
