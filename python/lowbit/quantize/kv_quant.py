"""Fake quantization of the KV cache (applied to post-RoPE keys and to values).

Modes (QServe §3.2 / §4.1; BitDecoding for 2 bits):
  * "token"   (default, what the engine's KV cache stores, include/lowbit/kv/kv_cache.h): dynamic asymmetric
              per token and head: zero = min(x), scale = (max - min) / (2^b - 1), q = round((x - zero) / scale).
  * "channel" keys only: asymmetric per channel of each head, over the tokens of the sequence (KIVI-style).
  * "static"  keys and values: per channel of each head, scales calibrated offline (min/max over calibration
              tokens), values clamped to that range at run time.
The engine runs "token" (recipes kv8/kv4/kv2/k8v4...) and its own grouped form of "channel" (recipes kc4v4,
kc2g32v2...: ranges over groups of G tokens, the newest < G tokens in f16; include/lowbit/kv/kv_cache.h), which
`lowbit quantize` calibrates with this whole-sequence "channel" mode; "static" is evaluated here only.
"""
from __future__ import annotations

import torch


def fake_quant_asym(x: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    lo = x.amin(dim=dim, keepdim=True)
    hi = x.amax(dim=dim, keepdim=True)
    return fake_quant_range(x, bits, lo, hi)


def fake_quant_range(x: torch.Tensor, bits: int, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    levels = float(2 ** bits - 1)
    scale = (hi - lo) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round((x - lo) / safe), 0, levels)
    return torch.where(scale > 0, q * scale + lo, lo.expand_as(x))


class KVQuantizer:
    """Callable (layer, k, v) -> (k', v'); k, v: [B, Hkv, T, D]. Bits 16 leaves a tensor as is."""

    MODES = ("token", "channel", "static")

    def __init__(self, k_bits: int = 16, v_bits: int = 16, k_mode: str = "token", v_mode: str = "token",
                 static_ranges: dict | None = None):
        for name, mode in (("k_mode", k_mode), ("v_mode", v_mode)):
            if mode not in self.MODES:
                raise ValueError(f"KVQuantizer: {name} {mode!r} is not one of {self.MODES}")
        if v_mode == "channel":
            raise ValueError("KVQuantizer: v_mode 'channel' is not supported (values are quantized per token)")
        for name, b in (("k_bits", k_bits), ("v_bits", v_bits)):
            if b not in (16, 8, 4, 2):
                raise ValueError(f"KVQuantizer: {name} must be 16, 8, 4 or 2, got {b}")
        if "static" in (k_mode, v_mode) and not static_ranges:
            raise ValueError("KVQuantizer: static mode needs static_ranges from calibrate_static_kv_ranges")
        self.k_bits, self.v_bits, self.k_mode, self.v_mode = k_bits, v_bits, k_mode, v_mode
        self.static_ranges = static_ranges or {}

    def _one(self, layer: int, which: str, x: torch.Tensor, bits: int, mode: str) -> torch.Tensor:
        if bits == 16:
            return x
        if mode == "token":
            return fake_quant_asym(x, bits, dim=-1)
        if mode == "channel":
            return fake_quant_asym(x, bits, dim=-2)
        lo, hi = self.static_ranges[(layer, which)]
        return fake_quant_range(torch.maximum(torch.minimum(x, hi), lo), bits, lo, hi)

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        return (self._one(layer, "k", k, self.k_bits, self.k_mode),
                self._one(layer, "v", v, self.v_bits, self.v_mode))


def kv_ranges_from_capture(keys: torch.Tensor, values: torch.Tensor) -> dict:
    """Per head and channel min/max over batch and tokens: shapes [1, Hkv, 1, D]."""
    out = {}
    for which, x in (("k", keys), ("v", values)):
        out[which] = (x.amin(dim=(0, 2), keepdim=True), x.amax(dim=(0, 2), keepdim=True))
    return out
