"""SmoothQuant (Xiao et al., 2023, §4.2): per-channel smoothing s_j = max|X_j|^α / max|W_j|^(1-α).

x -> x / s is folded into the producer of each linear input (RMSNorm weights for q/k/v and gate/up; up_proj
rows for down_proj). α is one number per model, searched on a grid by the calibration loss (mean NLL of the
fake-quantized model on held-out calibration sequences; quantize.py runs the search).
"""
from __future__ import annotations

import torch

from . import transforms as T
from .pipeline import RTNBase, SITES
from .torch_model import linear_name

ALPHA_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def smoothing_scale(x: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    xmax = x.abs().amax(0).clamp(min=1e-5)
    wmax = w.abs().amax(0).clamp(min=1e-5)
    return (xmax.pow(alpha) / wmax.pow(1 - alpha)).clamp(min=1e-5)


class SmoothQuant(RTNBase):
    name = "smoothquant"

    @property
    def alpha(self) -> float:
        return float(self.options.get("alpha", 0.5))

    def transform_layer(self, model, i, cap) -> bool:
        for site, fold in (("q_proj", lambda s: T.smooth_block_input(model, i, "attn", s)),
                           ("gate_proj", lambda s: T.smooth_block_input(model, i, "mlp", s)),
                           ("down_proj", lambda s: T.smooth_up_down(model, i, s))):
            w = torch.cat([model.weights[linear_name(i, u)] for u in SITES[site]])
            fold(smoothing_scale(cap[site], w, self.alpha))
        self.params["alpha"] = self.alpha
        return True
