"""Shared search for a per-input-channel smoothing scale s (x -> x / s, W -> W·diag(s)).

The loss is the output MSE of the fake-quantized linears that read x, on a calibration subsample:
    || x·Wᵀ - q_a(x / s)·Q(W·diag(s))ᵀ ||²
where q_a is the activation fake-quant of the recipe (identity for weight-only). The candidate list always
includes s = 1, so a search can never do worse on its calibration loss than no scaling.
"""
from __future__ import annotations

from typing import Callable

import torch

from .activation_quant import fake_quant_per_token_int8


def output_loss(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, fake_quant: Callable, act: str | None,
                ref: torch.Tensor) -> float:
    xs = x / s
    if act == "int8":
        xs = fake_quant_per_token_int8(xs)
    return float((xs @ fake_quant(w * s).T - ref).pow(2).mean())


def best_scale(x: torch.Tensor, w: torch.Tensor, candidates: list[tuple[float, torch.Tensor]],
               fake_quant: Callable, act: str | None = None) -> tuple[torch.Tensor, float, float, float]:
    """candidates: [(label, s)]. Returns (best s, its label, its loss, the loss of s = 1)."""
    ref = x @ w.T
    ones = torch.ones(w.shape[1])
    base = output_loss(x, w, ones, fake_quant, act, ref)
    best = (ones, None, base)
    for label, s in candidates:
        loss = output_loss(x, w, s, fake_quant, act, ref)
        if loss < best[2]:
            best = (s, label, loss)
    return best[0], best[1], best[2], base


def normalized(s: torch.Tensor) -> torch.Tensor:
    s = s.clamp(min=1e-5)
    return s / (s.max() * s.min()).sqrt()
