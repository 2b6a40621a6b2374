"""QoQ, the W4A8KV4 algorithm of QServe (001 §3 and App. B).

  1. Block-input rotation (App. B.2.1): RMSNorm weights folded into the next linears, then the residual stream
     is rotated by a scaled Hadamard matrix folded into embeddings, input modules (q/k/v, gate/up: W·H),
     output modules (o, down: Hᵀ·W) and an untied lm_head.
  2. SmoothAttention (§3.2): λ_i = λ_{i+D/2} = max(max|K_i|, max|K_{i+D/2}|)^0.5 from post-RoPE calibration
     keys, folded as W_Q <- Λ·W_Q, W_K <- Λ⁻¹·W_K.
  3. Block-output smoothing (App. B.2.2): o_proj and down_proj inputs divided by λ = max|X|^α / max|W|^(1-α),
     α searched per layer on a small grid near 0 (the paper finds α ≈ 0), folded into v_proj / up_proj rows.
  4. Activation-aware channel reordering (App. B.2.3): down_proj input channels sorted by max|X| so channels of
     similar salience share a group; folded into gate/up rows (no runtime permutation). The inputs of q/k/v,
     gate/up and o_proj are not reordered (that would need a runtime permutation of the activations).
  5. Weight clipping (App. B.2.4) by layer-output MSE for every linear (the paper uses block-output MSE for
     q/k; here layer-output MSE is used for all).
  6. Progressive group quantization (§3.1): s8 per channel in [-119, 119], then u4 per group of 128 with u8
     step and u4 zero (formats.py, format "qoq").

Options (all default to QServe's choices): rotate (True: the residual-stream rotation of step 1; False: none;
"qkv", "gate_up" or a list of both: only those block inputs rotated, online, in the torch model only: an
ablation, not writable as a checkpoint; with fold_norms=False the RMSNorm weights stay in the norms and the
rotation applies to the weighted norm output), smooth_attention, reorder, protective_range (False: level 1 uses the
plain s8 range [-127, 127]; an ablation, not writable: the kernels would overflow int8).
"""
from __future__ import annotations

import torch

from . import transforms as T
from .formats import PROTECTIVE_MAX, dequantize
from .hadamard import scaled_hadamard
from .pipeline import RTNBase, SITES, subsample
from .scale_search import best_scale
from .torch_model import linear_name

SMOOTH_ATTENTION_ALPHA = 0.5
OUTPUT_SMOOTH_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
SEARCH_TOKENS = 512


def smoothing_candidates(x: torch.Tensor, w: torch.Tensor, grid) -> list[tuple[float, torch.Tensor]]:
    xmax = x.abs().amax(0).clamp(min=1e-5)
    wmax = w.abs().amax(0).clamp(min=1e-5)
    return [(a, (xmax.pow(a) / wmax.pow(1 - a)).clamp(min=1e-5)) for a in grid]


def rotation_sites(rotate) -> tuple[str, ...] | None:
    """The `rotate` option as block-input sites for an online rotation; None for True/False (residual or none)."""
    if isinstance(rotate, bool):
        return None
    sites = (rotate,) if isinstance(rotate, str) else tuple(rotate)
    if not sites or set(sites) - set(T.BLOCK_INPUTS):
        raise ValueError(f"qoq: rotate must be True, False or block-input sites among {sorted(T.BLOCK_INPUTS)}, "
                         f"got {rotate!r}")
    return sites


def writable(options: dict) -> bool:
    """Whether QoQ with these options yields weights the engine runs as they are (no ablation-only option)."""
    return rotation_sites(options.get("rotate", True)) is None and options.get("protective_range", True)


class QoQ(RTNBase):
    name = "qoq"
    clip = True

    def __init__(self, spec, **options):
        super().__init__(spec, **options)
        rotation_sites(options.get("rotate", True))  # validates
        self.s8_max = PROTECTIVE_MAX if options.get("protective_range", True) else 127

    def prepare(self, model, tokens, progress) -> None:
        rotate = self.options.get("rotate", True)
        sites = rotation_sites(rotate)
        h = torch.from_numpy(scaled_hadamard(model.config.hidden_size))
        if sites is not None:
            fold = self.options.get("fold_norms", True)
            progress(None, f"{'fold RMSNorm weights, ' if fold else ''}rotate the {'/'.join(sites)} inputs online")
            if fold:
                T.fold_norms(model)
            T.rotate_block_inputs(model, sites, h)
            self.params["rotation"] = (f"scaled Hadamard {model.config.hidden_size}, online at {'/'.join(sites)}"
                                       + ("" if fold else ", RMSNorm weights not folded"))
        elif rotate:
            progress(None, "fold RMSNorm weights, rotate residual stream (scaled Hadamard)")
            T.fold_norms(model)
            T.rotate_residual(model, h)
            self.params["rotation"] = f"scaled Hadamard {model.config.hidden_size}"

    def quantize_linear(self, model, name, x):
        f = super().quantize_linear(model, name, x)
        if self.s8_max != PROTECTIVE_MAX and f.format == "qoq":
            # level-2 dequantized s8 outside [-128, 127]: what an int8 dequantization would wrap
            s8 = dequantize(f) / f.channel_scales[:, None]
            out = float(((s8 > 127.5) | (s8 < -128.5)).mean())
            self.params.setdefault("s8_overflow_fraction", {})[name] = out
        return f

    def _output_smoothing(self, model, i, site, x, kv_shared):
        c = model.config
        users = SITES[site]
        w = torch.cat([model.weights[linear_name(i, u)] for u in users])
        cands = smoothing_candidates(x, w, OUTPUT_SMOOTH_GRID)
        if kv_shared:  # o_proj: one factor per kv channel (max over the query heads of a group)
            grouped = []
            for a, s in cands:
                s_kv = s.view(c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim).amax(1).reshape(-1)
                grouped.append((a, s_kv))
            full = [(a, T.expand_kv_channels(model, s)) for a, s in grouped]
            s_full, alpha, loss, base = best_scale(subsample(x, SEARCH_TOKENS), w, full, self.fake_quant, "int8")
            s = next((s for a, s in grouped if a == alpha), None)
        else:
            s, alpha, loss, base = best_scale(subsample(x, SEARCH_TOKENS), w, cands, self.fake_quant, "int8")
            if alpha is None:
                s = None
        return s, {"alpha": alpha, "loss": loss, "loss_unsmoothed": base}

    def transform_layer(self, model, i, cap) -> bool:
        record = {}
        if self.options.get("smooth_attention", True):
            lam = T.smooth_attention_scales(cap["keys"], SMOOTH_ATTENTION_ALPHA)
            T.smooth_attention(model, i, lam)
            record["smooth_attention_max_lambda"] = float(lam.max())
        s, record["o_proj"] = self._output_smoothing(model, i, "o_proj", cap["o_proj"], kv_shared=True)
        if s is not None:
            T.smooth_v_o(model, i, s)
        x_down = cap["down_proj"]
        s, record["down_proj"] = self._output_smoothing(model, i, "down_proj", x_down, kv_shared=False)
        if s is not None:
            T.smooth_up_down(model, i, s)
            x_down = x_down / s
        if self.options.get("reorder", True):
            perm = torch.argsort(x_down.abs().amax(0), descending=True)
            T.permute_intermediate(model, i, perm)
            record["reordered_down_proj_input"] = True
        self.params.setdefault("layers", {})[i] = record
        return True
