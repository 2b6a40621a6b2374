"""AWQ (Lin et al., 2024, §3.2-3.3): activation-aware per-channel scaling plus weight clipping.

For each group of linears sharing an input (q/k/v; o; gate/up; down), s = mean|x|^α (normalized), α on a grid
of 20 points in [0, 1], is chosen by the output MSE of the fake-quantized linears (scale_search.py); s is folded
into the producer (RMSNorm weight, v_proj rows, up_proj rows; transforms.py). Then each linear's clip ratio
is searched by output MSE (clipping.py; AWQ skips q/k clipping, as here) and it is rounded to nearest.
"""
from __future__ import annotations

import torch

from . import transforms as T
from .pipeline import RTNBase, SITES, subsample
from .scale_search import best_scale, normalized
from .torch_model import linear_name

GRID = 20
SEARCH_TOKENS = 512
# input site -> where its scale s is folded (the producer divides by s, the consumers multiply)
FOLDS = {"q_proj": lambda model, i, s: T.smooth_block_input(model, i, "attn", s),
         "o_proj": lambda model, i, s: T.smooth_v_o(model, i, s),
         "gate_proj": lambda model, i, s: T.smooth_block_input(model, i, "mlp", s),
         "down_proj": lambda model, i, s: T.smooth_up_down(model, i, s)}


class AWQ(RTNBase):
    name = "awq"
    clip = True

    def _search(self, model, i, site, x, per_kv=False):
        names = [linear_name(i, u) for u in SITES[site]]
        w = torch.cat([model.weights[n] for n in names])
        xm = x.abs().mean(0)
        if per_kv:  # o_proj input: one scale per kv channel, shared by the query heads of the group
            c = model.config
            xm = xm.view(c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim).mean(1).reshape(-1)
        cands = []
        for a in [g / GRID for g in range(1, GRID + 1)]:
            s = normalized(xm.pow(a))
            cands.append((a, s, T.expand_kv_channels(model, s) if per_kv else s))
        s_full, label, loss, base = best_scale(subsample(x, SEARCH_TOKENS), w, [(a, f) for a, _, f in cands],
                                               self.fake_quant, None)
        s_site = next((s for a, s, _ in cands if a == label), None)
        return s_site, label, loss, base

    def transform_layer(self, model, i, cap) -> bool:
        self.params.setdefault("scale_search", {})[i] = self.scale_layer(model, i, cap)
        return True

    def scale_layer(self, model, i, cap, rescale_capture: bool = False) -> dict:
        """Searches and folds the scales of layer i's four inputs. rescale_capture: divide cap[site] by the chosen
        scale, i.e. what a recapture would give (for a caller that transforms the scaled inputs further)."""
        record = {}
        for site, fold in FOLDS.items():
            per_kv = site == "o_proj"
            s, alpha, loss, base = self._search(model, i, site, cap[site], per_kv=per_kv)
            record[site] = {"alpha": alpha, "loss": loss, "loss_unscaled": base}
            if s is not None:
                fold(model, i, s)
                if rescale_capture:
                    cap[site] = cap[site] / (T.expand_kv_channels(model, s) if per_kv else s)
        return record

    def quantize_linear(self, model, name, x):
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            self.clip = False
            try:
                return super().quantize_linear(model, name, x)
            finally:
                self.clip = True
        return super().quantize_linear(model, name, x)
