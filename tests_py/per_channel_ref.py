"""Chunked prefill over a per-channel K cache (kc4 / kc2: K per channel per block, the newest keys in f16, V per
token; include/lowbit/kv/kv_cache.h) and its float64 reference, for the GPU kernels' tests and for a CPU test that
holds the reference to the CPU cache's own attention (test_per_channel_reference.py).

The reference reads the cache as kv_write left it (codes and per-channel scales / zeros of sealed blocks, V codes and
parameters) and takes a query's window rows from the f16 K that was written: a query at position pos sees key j as
codes when j < codes_end(pos) = (pos + 1) // bs * bs, as its f16 row when codes_end(pos) <= j <= pos."""
import math

import torch

from lowbit import _core as lb


def host(t):
    return torch.from_dlpack(t.to("cpu")).clone()


def host_bytes(t):
    return torch.from_dlpack(t.to("cpu").view_as_bytes()).clone()


def unpack(codes, bits, d):
    """uint8 [..., d * bits / 8] -> int64 [..., d]: value i in bits (i % (8 / bits)) * bits of byte i * bits / 8."""
    per = 8 // bits
    x = codes.long()
    return torch.stack([(x >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], -1).flatten(-2)[..., :d]


BITS = {"u8": 8, "u4": 4, "u2": 2}


def v_rows(cache, pages, offs, d):
    """float64 [L, Hkv, d]: V of the keys at (pages, offs)."""
    data = cache.v_data(0)
    if cache.v_type == "f16":
        return host(data).double()[pages, :, offs]
    codes = unpack(host_bytes(data)[pages, :, offs], BITS[cache.v_type], d).double()
    p = host(cache.v_params(0)).double()[pages, :, offs]  # [L, Hkv, 2] = (scale, zero)
    return codes * p[..., 0:1] + p[..., 1:2]


def k_code_rows(cache, pages, offs, d):
    """float64 [L, Hkv, d]: K as codes with the per-channel (scale, zero) of each key's block (garbage for blocks
    not sealed yet; the reference never selects those)."""
    codes = unpack(host_bytes(cache.k_data(0))[pages, :, offs], BITS[cache.k_type], d).double()
    p = host(cache.k_params(0)).double()[pages]  # [L, Hkv, 2, d]
    return codes * p[:, :, 0] + p[:, :, 1]


def reference(q, k_written, cache, table_row, q_len, kv_len, scale):
    """float64 [q_len, Hq, d] attention of one sequence's q rows (f16 [q_len, Hq, d]) over its kv_len keys."""
    bs, d = cache.block_size, q.shape[-1]
    j = torch.arange(kv_len)
    pages, offs = table_row[j // bs].long(), j % bs
    kc, kw, v = k_code_rows(cache, pages, offs, d), k_written.double(), v_rows(cache, pages, offs, d)
    group = q.shape[1] // kc.shape[1]
    kc, kw, v = (x.repeat_interleave(group, dim=1) for x in (kc, kw, v))
    pos = kv_len - q_len + torch.arange(q_len)
    ce = (pos + 1) // bs * bs
    codes = j[None, :] < ce[:, None]
    window = (j[None, :] >= ce[:, None]) & (j[None, :] <= pos[:, None])
    qd = q.double()
    s_codes = torch.einsum("qhd,khd->hqk", qd, kc) * scale
    s_window = torch.einsum("qhd,khd->hqk", qd, kw) * scale
    s = torch.where(codes, s_codes, torch.where(window, s_window, torch.tensor(-math.inf, dtype=torch.float64)))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


def per_channel_case(prefix, chunk, hq, hkv, d, kt, vt, bs, seed, device, kernel="", scale=None, gap=1, q_dtype=None,
                     options=None, run=None):
    """Writes `prefix[i]` cached tokens of each sequence (one kv_write), then its `chunk[i]` new tokens (another),
    and runs paged_attention for the chunks on `device` (`kernel` forces the GPU's, `options` its tuning). Returns (output on the host,
    float64 reference, mask of the rows inside the sequences); output rows are poisoned with NaN before (`gap` rows
    before each sequence's stay outside every sequence). `run(q, cache, meta, scale, out)`, if given, makes the GPU
    call(s) in place of the one paged_attention (tests that run one case several ways)."""
    scale = 1 / math.sqrt(d) if scale is None else scale
    g = torch.Generator().manual_seed(seed)
    n = len(chunk)
    lens = [p + c for p, c in zip(prefix, chunk)]
    blocks_per = [math.ceil(L / bs) for L in lens]
    num_blocks = sum(blocks_per) + 2
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.full((n, max(blocks_per)), -1, dtype=torch.int32)
    at = 0
    for i, nb in enumerate(blocks_per):
        table[i, :nb] = perm[at:at + nb]
        at += nb
    gpu = str(device).startswith("cuda")
    cache = lb.KVCache(1, hkv, d, num_blocks, block_size=bs, k_type=kt, v_type=vt, device=device, k_per_channel=True,
                       k_window_slots=num_blocks if gpu else 0)
    ks, vs = [], []
    for L in lens:
        k = torch.randn(L, hkv, d, generator=g)
        k[:, :, 3] += 6.0  # an outlier channel: what per-channel K is for
        ks.append(k.half())
        vs.append(torch.randn(L, hkv, d, generator=g).half())

    def slots_of(i, a, b):
        pos = torch.arange(a, b)
        return (table[i, pos // bs].long() * bs + pos % bs).to(torch.int32)

    def write(ranges):
        slots = torch.cat([slots_of(i, a, b) for i, a, b in ranges])
        k = torch.cat([ks[i][a:b] for i, a, b in ranges])
        v = torch.cat([vs[i][a:b] for i, a, b in ranges])
        t = int(slots.numel())
        meta = lb.AttentionMeta([0], [t], [t], table[:1].to(device), slots.to(device))
        if gpu:
            lb.prepare_k_window(cache, slots)
        lb.kv_write(cache, 0, k.to(device), v.to(device), meta)
        return slots

    if any(p > 0 for p in prefix):
        write([(i, 0, p) for i, p in enumerate(prefix) if p > 0])
    slots = write([(i, p, p + c) for i, (p, c) in enumerate(zip(prefix, chunk))])
    q_start = [sum(chunk[:i]) + gap * (i + 1) for i in range(n)]
    T = sum(chunk) + gap * n + 1
    q = torch.randn(T, hq, d, generator=g).half()
    meta = lb.AttentionMeta(q_start, chunk, lens, table.to(device), slots.to(device))
    qx = q if q_dtype is None else q.to(q_dtype)
    out = torch.full(qx.shape, float("nan"), dtype=qx.dtype, device=device)
    if gpu and run is not None:
        run(qx.to(device), cache, meta, scale, out)
    elif gpu:
        lb.paged_attention(qx.to(device), cache, 0, meta, scale, out, kernel=kernel, options=options or {})
    else:
        lb.paged_attention(qx, cache, 0, meta, scale, out)
    ref = torch.full((T, hq, d), float("nan"), dtype=torch.float64)
    inside = torch.zeros(T, dtype=torch.bool)
    for i in range(n):
        rows = slice(q_start[i], q_start[i] + chunk[i])
        ref[rows] = reference(q[rows], ks[i], cache, table[i], chunk[i], lens[i], scale)
        inside[rows] = True
    return out.cpu(), ref, inside
