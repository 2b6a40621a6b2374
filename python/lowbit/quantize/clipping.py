"""Weight clipping by layer-output MSE (AWQ §3.3 auto-clip; QServe 001 App. B.2.4).

For each clip ratio r, every group of a row is clipped to [r·min, r·max] and quantized; the ratio that gives the
smallest output error ||X_g·(w_g - Q(w_g))ᵀ||² is kept per (row, group). The clipped weight is accepted only
if its whole-layer output error on the calibration tokens does not exceed the unclipped one.
"""
from __future__ import annotations

from typing import Callable

import torch

from .formats import group_slices

RATIOS = tuple(1.0 - 0.05 * i for i in range(9))  # 1.00 .. 0.60


def _clip_groups(w: torch.Tensor, group: int, ratio: torch.Tensor) -> torch.Tensor:
    """ratio: [n, G] (or scalar) -> w clipped to ratio * [min, max] of each group."""
    out = torch.empty_like(w)
    for gi, sl in enumerate(group_slices(w.shape[1], group)):
        r = ratio if ratio.ndim == 0 else ratio[:, gi:gi + 1]
        lo = w[:, sl].amin(dim=1, keepdim=True).clamp(max=0) * r
        hi = w[:, sl].amax(dim=1, keepdim=True).clamp(min=0) * r
        out[:, sl] = torch.maximum(torch.minimum(w[:, sl], hi), lo)
    return out


def _group_errors(x: torch.Tensor, d: torch.Tensor, group: int) -> torch.Tensor:
    """[n, G] output error of each group's weight error d (x: [T, k], d: [n, k])."""
    cols = []
    for sl in group_slices(d.shape[1], group):
        cols.append((x[:, sl] @ d[:, sl].T).pow(2).sum(0))
    return torch.stack(cols, dim=1)


def clip_search(w: torch.Tensor, x: torch.Tensor, fake_quant: Callable[[torch.Tensor], torch.Tensor],
                group: int) -> tuple[torch.Tensor, float]:
    """Returns (clipped w, mean clip ratio). x: calibration inputs [T, k] (a subsample is enough)."""
    group = group or w.shape[1]
    best_err, best_ratio = None, None
    for r in RATIOS:
        wc = _clip_groups(w, group, torch.tensor(r))
        err = _group_errors(x, w - fake_quant(wc), group)
        if best_err is None:
            best_err, best_ratio = err, torch.full_like(err, r)
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_ratio = torch.where(better, torch.full_like(err, r), best_ratio)
    clipped = _clip_groups(w, group, best_ratio)
    ref = x @ w.T
    if (x @ fake_quant(clipped).T - ref).pow(2).sum() > (x @ fake_quant(w).T - ref).pow(2).sum():
        return w, 1.0
    return clipped, float(best_ratio.mean())
