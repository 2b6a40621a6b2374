"""The algebra of gemm_fmpq_s4_sm80's int4 stream, on the host: from the packed layout pack_sm80_w4a8 documents
(built here from the codes, independently of the packer) and s8 activation codes in [-8, 7], form the
m16n8k64 s4 fragments exactly as the kernel does (A = packed word XOR 0x88888888, B = (lo & 0x0f0f0f0f) |
(hi << 4 & 0xf0f0f0f0) of the two s8 words the s8 stream reads), place them by PTX's m16n8k64 fragment map,
and check s * (A @ B) + (8s + a - 128) * (1 @ B) against the int64 product of the paper's s8 weights for every
row, chunk and token. A GPU run checks the kernel itself (test_gpu_fmpq.py); this pins the identity and the
fragment order it relies on where no GPU is."""
import numpy as np
import pytest
import torch

from lowbit import _core


def s4(v):
    return v - 16 if v >= 8 else v


def packed_word(q, n, nt, kc, lane, word):
    """pack_sm80_w4a8's word: row g + 8 (word % 2), nibble i = chunk column 32 (word / 2) + 16 (i % 2) + 4t + i / 2."""
    g, t = lane // 4, lane % 4
    v = 0
    for i in range(8):
        row, col = nt * 16 + g + 8 * (word % 2), kc * 64 + 32 * (word // 2) + 16 * (i % 2) + 4 * t + i // 2
        v |= (int(q[row, col]) if row < n else 0) << (4 * i)
    return v


@pytest.mark.parametrize("fmt,n,k,group", [("qoq", 40, 256, 64), ("liquid", 33, 384, 128), ("qoq", 16, 128, 128)])
def test_s4_stream_fragments_reproduce_the_s8_weight_products(fmt, n, k, group):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, ::89] *= 8
    qw = _core.quantize_weight(w, fmt, group)
    q = torch.from_dlpack(qw.q_values).long().numpy()
    sg, zg = torch.from_dlpack(qw.scales).long().numpy(), torch.from_dlpack(qw.zeros).long().numpy()
    s, z = np.repeat(sg, group, 1)[:, :k], np.repeat(zg, group, 1)[:, :k]
    w8 = q * s - z * s if fmt == "qoq" else q * s + z - 128  # the paper's s8 weights
    x = torch.randint(-8, 8, (8, k), generator=g).numpy().astype(np.int64)  # 8 tokens, the whole s4 range
    for nt in range((n + 15) // 16):
        for kc in range(k // 64):
            a_mat, b_mat = np.zeros((16, 64), np.int64), np.zeros((64, 8), np.int64)
            for lane in range(32):
                gg, t = lane // 4, lane % 4
                a = [packed_word(q, n, nt, kc, lane, wd) ^ 0x88888888 for wd in range(4)]  # q - 8 as s4
                # PTX m16n8k64 A: a0 row g k 8t+p, a1 row g+8, a2 / a3 the same rows at k + 32.
                for reg, (row, base) in enumerate([(gg, 0), (gg + 8, 0), (gg, 32), (gg + 8, 32)]):
                    for p in range(8):
                        a_mat[row, base + 8 * t + p] = s4((a[reg] >> (4 * p)) & 0xF)
                for step in range(2):  # B: b0 k 8t+p, b1 k 32+8t+p, token g
                    xs = x[gg, kc * 64 + 32 * step:]
                    lo = sum((int(xs[4 * t + b]) & 0xFF) << (8 * b) for b in range(4))
                    hi = sum((int(xs[16 + 4 * t + b]) & 0xFF) << (8 * b) for b in range(4))
                    breg = (lo & 0x0F0F0F0F) | ((hi << 4) & 0xF0F0F0F0)
                    for p in range(8):
                        b_mat[32 * step + 8 * t + p, gg] = s4((breg >> (4 * p)) & 0xF)
            d = a_mat @ b_mat
            xsum = np.ones((16, 64), np.int64) @ b_mat
            gi = kc * 64 // group
            for r in range(min(16, n - nt * 16)):
                row = nt * 16 + r
                step = sg[row, gi]
                offset = 128 - zg[row, gi] * step if fmt == "qoq" else zg[row, gi]  # the packer's byte offset
                got = step * d[r] + (8 * step + offset - 128) * xsum[r]
                ref = x[:, kc * 64:(kc + 1) * 64] @ w8[row, kc * 64:(kc + 1) * 64]
                assert np.array_equal(got, ref), (nt, kc, r)
