"""GPTQ (Frantar et al., 2022, Alg. 1): column-by-column quantization with Hessian error feedback.

H = 2/N · XᵀX over the calibration inputs of a linear; each quantized column's error, scaled by the inverse
Hessian's Cholesky factor, is propagated onto the columns not yet quantized (lazy batch updates in blocks).
Formats: w4 (group 32/64/128; group parameters computed when the group's first column is reached, from the
already-updated weights) and w8 (per-channel). act_order=True quantizes columns by decreasing H_ii; the group
parameters are then fixed up front from the original weights ("static groups") so the stored groups stay
contiguous along k, as format.h requires.
"""
from __future__ import annotations

import numpy as np
import torch

from .formats import QuantFields, channel_scale, group_slices, w4_group_params

DAMP = 0.01


class Hessian:
    """Accumulates 2/N · XᵀX in float64 over calibration batches."""

    def __init__(self, k: int):
        self.h = torch.zeros(k, k, dtype=torch.float64)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()
        self.h *= self.n / (self.n + x.shape[0])
        self.n += x.shape[0]
        self.h += (2.0 / self.n) * (x.T @ x)


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, fmt: str, group: int = 128, symmetric: bool = False,
                  act_order: bool = False) -> QuantFields:
    if fmt not in ("w4", "w8"):
        raise ValueError(f"gptq_quantize: format {fmt!r} is not supported (w4, w8)")
    w = w.double().clone()
    n, k = w.shape
    if hessian.shape != (k, k):
        raise ValueError(f"gptq_quantize: hessian shape {tuple(hessian.shape)} does not match k={k}")
    h = hessian.double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    group = group if fmt == "w4" else k
    G = (k + group - 1) // group
    scales = torch.zeros(n, G, dtype=torch.float64)
    zeros = torch.zeros(n, G, dtype=torch.float64)
    if fmt == "w8":
        scales[:, 0] = channel_scale(w.float(), 127.0).double()
    elif act_order:
        for gi, sl in enumerate(group_slices(k, group)):
            s, z = w4_group_params(w[:, sl].float(), symmetric)
            scales[:, gi], zeros[:, gi] = s.double(), z.double()
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w, h = w[:, perm], h[perm][:, perm]
    h += DAMP * torch.mean(torch.diag(h)) * torch.eye(k, dtype=torch.float64)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    q = torch.zeros(n, k, dtype=torch.float64)
    block = group * max(1, -(-128 // group)) if fmt == "w4" else 128
    for i1 in range(0, k, block):
        i2 = min(k, i1 + block)
        w1 = w[:, i1:i2].clone()
        err = torch.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            gi = col // group
            if fmt == "w4" and not act_order and col % group == 0:
                s, z = w4_group_params(w1[:, i:i + group].float(), symmetric)
                scales[:, gi], zeros[:, gi] = s.double(), z.double()
            s, z = scales[:, gi], zeros[:, gi]
            x = w1[:, i]
            if fmt == "w4":
                qi = torch.clamp(torch.round(x / s) + z, 0, 15)
                deq = (qi - z) * s
            else:
                qi = torch.clamp(torch.round(x / s), -127, 127)
                deq = qi * s
            q[:, col] = qi
            err[:, i] = (x - deq) / hinv1[i, i]
            w1[:, i:] -= err[:, i:i + 1] @ hinv1[i:i + 1, i:]
        w[:, i2:] -= err @ hinv[i1:i2, i2:]

    f = QuantFields(fmt, n, k, group if fmt == "w4" else 0, symmetric if fmt == "w4" else False)
    if fmt == "w8":
        f.q, f.scales = q.to(torch.int8).numpy(), scales[:, 0].float().numpy()
    else:
        f.q = q.to(torch.uint8).numpy()
        f.scales = scales.float().numpy().astype(np.float16)
        f.zeros = None if symmetric else zeros.float().numpy().astype(np.float16)
    if act_order:
        f.extra["act_order"] = True
    return f


def make_gptq_algorithm():
    from .pipeline import RTNBase

    class GPTQ(RTNBase):
        name = "gptq"

        def quantize_linear(self, model, name, x):
            hess = Hessian(x.shape[1])
            hess.add(x)
            return gptq_quantize(model.weights[name], hess.h, self.spec.weight_format, self.spec.group or 128,
                                 symmetric=False, act_order=bool(self.options.get("act_order", False)))

    return GPTQ
