"""Fake quantization of activations, matching include/lowbit/quant/activation.h.

* per-token int8 (SmoothQuant / QServe W8A8, W4A8): s[m] = max|x[m, :]| / 127 (1 for a zero row), q = round(x / s).
* per-token e4m3 (wfp8a8): s[m] = max|x[m, :]| / 448 (1 for a zero row), q = e4m3(x / s) rounded to nearest even
  (the CPU GEMM's rule, cpp/kernels/cpu/gemm_cpu.cpp).
* COMET FMPQ (002 §3): channels in blocks of 128 (last block short); each block int4 (values in [-8, 7],
  scale max|x| / 7) or int8 (scale max|x| / 127) per token.
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


def fake_quant_fmpq(x: torch.Tensor, block_bits: np.ndarray) -> torch.Tensor:
    k = x.shape[-1]
    nb = (k + FMPQ_BLOCK - 1) // FMPQ_BLOCK
    if len(block_bits) != nb:
        raise ValueError(f"fake_quant_fmpq: block_bits has {len(block_bits)} entries, expected {nb} for k={k}")
    out = torch.empty_like(x)
    for b in range(nb):
        sl = slice(b * FMPQ_BLOCK, min(k, (b + 1) * FMPQ_BLOCK))
        if block_bits[b] == 8:
            out[..., sl] = _sym_fake_quant(x[..., sl], 127.0, -127.0)
        elif block_bits[b] == 4:
            out[..., sl] = _sym_fake_quant(x[..., sl], 7.0, -8.0)
        else:
            raise ValueError(f"fake_quant_fmpq: block_bits[{b}] = {block_bits[b]}, expected 4 or 8")
    return out
