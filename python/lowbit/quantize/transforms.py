"""Equivalence transforms on a TorchLlama's weights: each leaves the float model's outputs unchanged.

* fold_norms: RMSNorm weights g folded into the next linears' input columns (W <- W·diag(g), g <- 1), the
  final norm into an untied lm_head (QuaRot, needed before any rotation: RMSNorm commutes with an orthogonal
  map only without its elementwise weight).
* rotate_residual: residual stream x -> x·H with orthogonal H (QServe 001 App. B.2.1): embeddings E·H, input
  modules W·H, output modules Hᵀ·W, lm_head W·H.
* rotate_block_inputs: only the inputs of chosen block-input sites rotated, online (x·H at run time, W·H):
  an ablation of rotate_residual, whose effect on those inputs is the same in float; needs the torch model's
  `FakeQuant.input_rotation` (the engine has no runtime rotation).
* smooth_* : x -> x / s on a linear's input, s folded into the producer (SmoothQuant; QServe App. B.2.2):
  norm weights (q/k/v, gate/up inputs), v_proj rows (o_proj input), up_proj rows (down_proj input).
* smooth_attention: keys / λ, queries · λ (QServe §3.2) with λ_i = λ_{i+D/2} so it commutes with RoPE.
* permute_intermediate: reorders the MLP's intermediate channels (gate/up rows, down columns).
All updates run in float64 and store float32.
"""
from __future__ import annotations

import torch

from .torch_model import TorchLlama, linear_name


def _update(model: TorchLlama, name: str, fn) -> None:
    model.weights[name] = fn(model.weights[name].double()).float()


def fold_norms(model: TorchLlama) -> None:
    c = model.config
    for i in range(c.num_layers):
        for norm, users in (("input_layernorm", ("q_proj", "k_proj", "v_proj")),
                            ("post_attention_layernorm", ("gate_proj", "up_proj"))):
            key = f"model.layers.{i}.{norm}.weight"
            g = model.weights[key].double()
            for u in users:
                _update(model, linear_name(i, u), lambda w: w * g[None, :])
            model.weights[key] = torch.ones_like(model.weights[key])
    g = model.weights["model.norm.weight"].double()
    model.weights["lm_head.weight"] = (model.lm_head_weight().double() * g[None, :]).float()
    model.weights["model.norm.weight"] = torch.ones_like(model.weights["model.norm.weight"])


def norms_are_folded(model: TorchLlama) -> bool:
    names = ["model.norm.weight"] + [f"model.layers.{i}.{n}.weight" for i in range(model.config.num_layers)
                                     for n in ("input_layernorm", "post_attention_layernorm")]
    return all(bool((model.weights[n] == 1).all()) for n in names)


def rotate_residual(model: TorchLlama, h: torch.Tensor) -> None:
    """h: float64 orthogonal [hidden, hidden]. Requires fold_norms first."""
    if not norms_are_folded(model):
        raise ValueError("rotate_residual: fold_norms must run first (RMSNorm weights must be all ones)")
    h = h.double()
    _update(model, "model.embed_tokens.weight", lambda e: e @ h)
    _update(model, "lm_head.weight", lambda w: w @ h)
    for i in range(model.config.num_layers):
        for u in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            _update(model, linear_name(i, u), lambda w: w @ h)
        for u in ("o_proj", "down_proj"):
            _update(model, linear_name(i, u), lambda w: h.T @ w)


BLOCK_INPUTS = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}


def rotate_block_inputs(model: TorchLlama, sites, h: torch.Tensor) -> None:
    """Online rotation of the block inputs in `sites` (a subset of "qkv", "gate_up"): W <- W·H and the linear's
    input x -> x·H before activation quantization. h: float64 orthogonal [hidden, hidden]. Unlike rotate_residual
    it needs no fold_norms: the rotated input is the RMSNorm output with or without its weight, whichever the
    model holds."""
    unknown = set(sites) - set(BLOCK_INPUTS)
    if unknown or not sites:
        raise ValueError(f"rotate_block_inputs: sites must be a non-empty subset of {sorted(BLOCK_INPUTS)}, "
                         f"got {sorted(sites)}")
    h = h.double()
    for i in range(model.config.num_layers):
        for site in sites:
            for u in BLOCK_INPUTS[site]:
                _update(model, linear_name(i, u), lambda w: w @ h)
                model.fake.input_rotation[linear_name(i, u)] = h.float()


def smooth_block_input(model: TorchLlama, layer: int, which: str, s: torch.Tensor) -> None:
    """which = "attn" (q/k/v after input_layernorm) or "mlp" (gate/up after post_attention_layernorm)."""
    norm, users = {"attn": ("input_layernorm", ("q_proj", "k_proj", "v_proj")),
                   "mlp": ("post_attention_layernorm", ("gate_proj", "up_proj"))}[which]
    s = s.double()
    _update(model, f"model.layers.{layer}.{norm}.weight", lambda g: g / s)
    for u in users:
        _update(model, linear_name(layer, u), lambda w: w * s[None, :])


def expand_kv_channels(model: TorchLlama, per_kv: torch.Tensor) -> torch.Tensor:
    """[Hkv * D] per-kv-channel factors -> [H * D] for the query heads (GQA: head h uses kv head h // rep)."""
    c = model.config
    rep = c.num_heads // c.num_kv_heads
    return per_kv.view(c.num_kv_heads, 1, c.head_dim).expand(c.num_kv_heads, rep, c.head_dim).reshape(-1)


def smooth_v_o(model: TorchLlama, layer: int, s: torch.Tensor) -> None:
    """o_proj input / s, folded into v_proj rows; s: [Hkv * D] (shared by the query heads of a group)."""
    s = s.double()
    _update(model, linear_name(layer, "v_proj"), lambda w: w / s[:, None])
    full = expand_kv_channels(model, s)
    _update(model, linear_name(layer, "o_proj"), lambda w: w * full[None, :])


def smooth_up_down(model: TorchLlama, layer: int, s: torch.Tensor) -> None:
    s = s.double()
    _update(model, linear_name(layer, "up_proj"), lambda w: w / s[:, None])
    _update(model, linear_name(layer, "down_proj"), lambda w: w * s[None, :])


def smooth_attention_scales(keys: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """λ [Hkv * D] from post-RoPE keys [B, Hkv, T, D]: λ_i = λ_{i+D/2} = max(max|K_i|, max|K_{i+D/2}|)^α."""
    amax = keys.abs().amax(dim=(0, 2))  # [Hkv, D]
    half = amax.shape[1] // 2
    paired = torch.maximum(amax[:, :half], amax[:, half:])
    lam = torch.cat([paired, paired], dim=1).clamp(min=1e-5).pow(alpha)
    return lam.reshape(-1)


def smooth_attention(model: TorchLlama, layer: int, lam: torch.Tensor) -> None:
    """W_Q <- Λ·W_Q, W_K <- Λ⁻¹·W_K (QServe §3.2); scores q·k are unchanged."""
    lam = lam.double()
    _update(model, linear_name(layer, "k_proj"), lambda w: w / lam[:, None])
    full = expand_kv_channels(model, lam)
    _update(model, linear_name(layer, "q_proj"), lambda w: w * full[:, None])
    for u, l in (("k_proj", lam), ("q_proj", full)):
        bias = linear_name(layer, u)[: -len("weight")] + "bias"
        if bias in model.weights:
            _update(model, bias, lambda b: b * (l if u == "q_proj" else 1 / l))


def permute_intermediate(model: TorchLlama, layer: int, perm: torch.Tensor) -> None:
    for u in ("gate_proj", "up_proj"):
        _update(model, linear_name(layer, u), lambda w: w[perm])
    _update(model, linear_name(layer, "down_proj"), lambda w: w[:, perm])
