"""Fake quantization of activations, matching include/lowbit/quant/activation.h.

* per-token int8 (SmoothQuant / QServe W8A8, W4A8): s[m] = max|x[m, :]| / 127 (1 for a zero row), q = round(x / s).
* per-token e4m3 (wfp8a8): s[m] = max|x[m, :]| / 448 (1 for a zero row), q = e4m3(x / s) rounded to nearest even
  (the CPU GEMM's rule, cpp/kernels/cpu/gemm_cpu.cpp).
* COMET FMPQ (002 §3): channels in blocks of 128 (last block short); each block int4 (values in [-8, 7],
  scale max|x| / 7) or int8 (scale max|x| / 127) per token.
* FMPQ with power-of-two block scales ("pow2", issue 19): one f32 scale s per token; int8 blocks use s, each int4
  block s * 2^e with the smallest e in 0..4 that holds the block (values in [-7, 7]), so an int4 value q is the s8
  value q << e and the whole row is one per-token s8 row (the W4A8 GEMM's input). s = max(max|int8 blocks| / 127,
  max|int4 blocks| / 112): 7 << 4 = 112 keeps every widened value in s8.
"""
from __future__ import annotations

import numpy as np
import torch

FMPQ_BLOCK = 128


def _sym_fake_quant(x: torch.Tensor, qmax: float, qmin: float) -> torch.Tensor:
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    return torch.clamp(torch.round(x / scale), qmin, qmax) * scale


def fake_quant_per_token_int8(x: torch.Tensor) -> torch.Tensor:
    return _sym_fake_quant(x, 127.0, -127.0)


def fake_quant_per_token_e4m3(x: torch.Tensor) -> torch.Tensor:
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (x / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale


POW2_MAX_SHIFT = 4  # 7 << 4 = 112 <= 127


def _check_bits(k: int, block_bits) -> int:
    nb = (k + FMPQ_BLOCK - 1) // FMPQ_BLOCK
    if len(block_bits) != nb:
        raise ValueError(f"fake_quant_fmpq: block_bits has {len(block_bits)} entries, expected {nb} for k={k}")
    for b in block_bits:
        if b not in (4, 8):
            raise ValueError(f"fake_quant_fmpq: block_bits holds {b}, expected 4 or 8")
    return nb


def pow2_token_scale(x: torch.Tensor, block_bits) -> tuple[torch.Tensor, torch.Tensor]:
    """(s [..., 1], e [..., nb] int64): the per-token scale and each block's shift (0 for int8 blocks)."""
    k = x.shape[-1]
    nb = _check_bits(k, block_bits)
    pad = nb * FMPQ_BLOCK - k
    a = torch.nn.functional.pad(x.abs(), (0, pad)).unflatten(-1, (nb, FMPQ_BLOCK)).amax(-1)  # [..., nb]
    is8 = torch.as_tensor(np.asarray(block_bits) == 8)
    zero = torch.zeros((), dtype=x.dtype)
    need = torch.maximum(torch.where(is8, a / 127.0, zero), torch.where(is8, zero, a / (7.0 * 2 ** POW2_MAX_SHIFT)))
    s = need.amax(-1, keepdim=True)
    s = torch.where(s > 0, s, torch.ones_like(s))
    e = torch.zeros(a.shape, dtype=torch.int64)
    for _ in range(POW2_MAX_SHIFT):  # smallest e with a <= 7 s 2^e (a loop in f32, as a kernel would)
        e = e + ((a > 7.0 * s * torch.exp2(e.to(x.dtype))) & ~is8).to(torch.int64)
    return s, e


def fake_quant_fmpq_pow2(x: torch.Tensor, block_bits) -> torch.Tensor:
    s, e = pow2_token_scale(x, block_bits)
    nb = e.shape[-1]
    lim = torch.where(torch.as_tensor(np.asarray(block_bits) == 8), 127.0, 7.0)  # [nb]
    step = s * torch.exp2(e.to(x.dtype))  # [..., nb]
    pad = nb * FMPQ_BLOCK - x.shape[-1]
    xb = torch.nn.functional.pad(x, (0, pad)).unflatten(-1, (nb, FMPQ_BLOCK))
    q = torch.maximum(torch.minimum(torch.round(xb / step[..., None]), lim[:, None]), -lim[:, None])
    return (q * step[..., None]).flatten(-2)[..., : x.shape[-1]]


def fake_quant_fmpq(x: torch.Tensor, block_bits: np.ndarray) -> torch.Tensor:
    k = x.shape[-1]
    nb = _check_bits(k, block_bits)
    out = torch.empty_like(x)
    for b in range(nb):
        sl = slice(b * FMPQ_BLOCK, min(k, (b + 1) * FMPQ_BLOCK))
        if block_bits[b] == 8:
            out[..., sl] = _sym_fake_quant(x[..., sl], 127.0, -127.0)
        else:
            out[..., sl] = _sym_fake_quant(x[..., sl], 7.0, -8.0)
    return out
