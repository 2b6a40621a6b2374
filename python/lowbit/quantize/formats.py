"""The arch-neutral weight formats of include/lowbit/quant/format.h, in torch (round-to-nearest core).

A weight W[n, k] (n = out features) is stored as the fields of `QuantizedWeight`:
  w8     q s8 [n, k], scales f32 [n]:             w = q * scale, scale = max|row| / 127
  w4     q u4 [n, k], scales f16 [n, G], zeros f16 [n, G]: w = (q - zero) * scale (AWQ/GPTQ);
         asymmetric: scale = (max - min) / 15, zero = round(-min / scale); symmetric: zero 8 (not stored),
         scale = max|group| / 7
  qoq    QServe 001 §3.1: level 1 s8 = round(w / cs), cs = max|row| / 119 (protective range [-119, 119]);
         level 2 per group over [min(s8, 0), max(s8, 0)]: step s = ceil((max - min) / 15) (u8, <= 16),
         zero z = round(-min / s) (u4),
         q = clamp(round(s8 / s) + z, 0, 15);  s8' = q*s - z*s ("subtraction after multiplication")
  liquid LiquidGEMM 003 §4 Eq. 7-12: level 1 as qoq; level 2 per group: s = ceil((max - min) / 15) (<= 16),
         a = 128 + min (u8), q = clamp(round((s8 - min) / s), 0, 15); s8' = (q*s + a) XOR 0x80 in u8
  e4m3   q fp8 e4m3 [n, k] (stored as its bit pattern, u8), scales f32 [n] = max|row| / 448
Groups run along k; the last group may be short. Rounding is round-half-to-even (torch.round / np.rint).
The f16 scale of w4 is rounded to f16 *before* q is computed, so q and the stored scale agree exactly.
"""
from __future__ import annotations

import numpy as np
import torch

from ..quant_fields import QuantFields  # noqa: F401  (defined below models/ and quantize/, used by both)

FORMATS = ("w8", "w4", "qoq", "liquid", "e4m3")
GROUPED = ("w4", "qoq", "liquid")
PROTECTIVE_MAX = 119  # QServe §3.1: keeps the level-2 dequantized s8 inside [-128, 127]


def group_slices(k: int, group: int) -> list[slice]:
    return [slice(s, min(k, s + group)) for s in range(0, k, group)]


def check_format(fmt: str, group: int) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"lowbit.quantize: unknown weight format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt in GROUPED and (not isinstance(group, int) or group <= 0):
        raise ValueError(f"lowbit.quantize: format {fmt} needs a positive group size, got {group!r}")


# ---- level 1: per-channel symmetric ----------------------------------------------------------------
def channel_scale(w: torch.Tensor, qmax: float) -> torch.Tensor:
    amax = w.abs().amax(dim=1)
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def quantize_channel_s8(w: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    cs = channel_scale(w, float(qmax))
    return torch.clamp(torch.round(w / cs[:, None]), -qmax, qmax), cs


# ---- level 2 / group parameters -------------------------------------------------------------------
def w4_group_params(wg: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """f16-exact (scale, zero) [n] of one group of columns wg [n, g]."""
    if symmetric:
        scale = wg.abs().amax(dim=1) / 7.0
        zero = torch.full_like(scale, 8.0)
    else:
        lo = torch.clamp(wg.amin(dim=1), max=0.0)  # keep 0 representable (AWQ/GPTQ convention)
        hi = torch.clamp(wg.amax(dim=1), min=0.0)
        scale = (hi - lo) / 15.0
    scale = scale.half().float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if not symmetric:
        zero = torch.clamp(torch.round(-lo / scale), 0, 15)
    return scale, zero


def w4_quantize_cols(wg: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(wg / scale[:, None]) + zero[:, None], 0, 15)


def int_group_step(s8g: torch.Tensor, include_zero: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(step, min) for qoq/liquid level 2: step = ceil((max - min) / 15) in [1, 16]. QoQ widens the range to
    include 0 (so a u4 zero point in [0, 15] exists); LiquidQuant uses the true min/max."""
    lo, hi = s8g.amin(dim=1), s8g.amax(dim=1)
    if include_zero:
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    step = torch.clamp(torch.ceil((hi - lo) / 15.0), min=1.0)
    return step, lo


def qoq_level2(s8: torch.Tensor, group: int):
    q = torch.empty_like(s8)
    n = s8.shape[0]
    gs = group_slices(s8.shape[1], group)
    scales = torch.empty(n, len(gs))
    zeros = torch.empty(n, len(gs))
    for gi, sl in enumerate(gs):
        step, lo = int_group_step(s8[:, sl], True)
        z = torch.clamp(torch.round(-lo / step), 0, 15)
        q[:, sl] = torch.clamp(torch.round(s8[:, sl] / step[:, None]) + z[:, None], 0, 15)
        scales[:, gi], zeros[:, gi] = step, z
    return q, scales, zeros


def liquid_level2(s8: torch.Tensor, group: int):
    q = torch.empty_like(s8)
    n = s8.shape[0]
    gs = group_slices(s8.shape[1], group)
    steps = torch.empty(n, len(gs))
    offsets = torch.empty(n, len(gs))
    for gi, sl in enumerate(gs):
        step, lo = int_group_step(s8[:, sl], False)
        q[:, sl] = torch.clamp(torch.round((s8[:, sl] - lo[:, None]) / step[:, None]), 0, 15)
        steps[:, gi], offsets[:, gi] = step, 128 + lo
    return q, steps, offsets


# ---- whole-weight round-to-nearest -----------------------------------------------------------------
def quantize_rtn(w, fmt: str, group: int = 128, symmetric: bool = False, s8_max: int = PROTECTIVE_MAX) -> QuantFields:
    """Round-to-nearest quantization of a float weight [n, k] into the fields of `fmt`. s8_max: the level-1 range
    of qoq/liquid ([-s8_max, s8_max]); 127 (the plain s8 range) is for ablations only: the level-2 dequantized
    value can then leave [-128, 127], which an int8 kernel would wrap."""
    check_format(fmt, group)
    w = torch.as_tensor(np.asarray(w, dtype=np.float32)) if not isinstance(w, torch.Tensor) else w.float()
    if w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"quantize_rtn: weight must be a non-empty 2-D [n, k] array, got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise ValueError("quantize_rtn: weight holds NaN or Inf")
    n, k = w.shape
    f = QuantFields(fmt, n, k, group if fmt in GROUPED else 0, symmetric if fmt == "w4" else False)
    if fmt == "w8":
        q, cs = quantize_channel_s8(w, 127)
        f.q, f.scales = q.to(torch.int8).numpy(), cs.numpy().astype(np.float32)
    elif fmt == "e4m3":
        cs = channel_scale(w, 448.0)
        f.q = (w / cs[:, None]).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        f.scales = cs.numpy().astype(np.float32)
    elif fmt == "w4":
        gs = group_slices(k, group)
        q = torch.empty_like(w)
        scales, zeros = torch.empty(n, len(gs)), torch.empty(n, len(gs))
        for gi, sl in enumerate(gs):
            s, z = w4_group_params(w[:, sl], symmetric)
            q[:, sl] = w4_quantize_cols(w[:, sl], s, z)
            scales[:, gi], zeros[:, gi] = s, z
        f.q = q.to(torch.uint8).numpy()
        f.scales = scales.numpy().astype(np.float16)
        f.zeros = None if symmetric else zeros.numpy().astype(np.float16)
    else:
        if not 1 <= s8_max <= 127:
            raise ValueError(f"quantize_rtn: s8_max must be in [1, 127], got {s8_max}")
        s8, cs = quantize_channel_s8(w, s8_max)
        q, a, b = (qoq_level2 if fmt == "qoq" else liquid_level2)(s8, group)
        f.q = q.to(torch.uint8).numpy()
        f.scales, f.zeros = a.to(torch.uint8).numpy(), b.to(torch.uint8).numpy()
        f.channel_scales = cs.numpy().astype(np.float32)
    return f


def dequantize(f: QuantFields) -> np.ndarray:
    """Exact float32 reconstruction (what the kernels compute with), computed the way the kernels do."""
    if f.format == "w8":  # per channel, or one scale per group (GGUF Q8_0 as stored)
        scales = f.scales[:, np.arange(f.k) // f.group] if f.group else f.scales[:, None]
        return f.q.astype(np.float32) * scales
    if f.format == "e4m3":
        vals = torch.from_numpy(np.ascontiguousarray(f.q)).view(torch.float8_e4m3fn).float().numpy()
        return vals * f.scales[:, None]
    g = np.minimum(np.arange(f.k) // f.group, f.num_groups - 1)
    q = f.q.astype(np.int32)
    if f.format == "w4":
        scale = f.scales.astype(np.float32)[:, g]
        zero = 8.0 if f.zeros is None else f.zeros.astype(np.float32)[:, g]
        return ((q - zero) * scale).astype(np.float32)
    step = f.scales.astype(np.int32)[:, g]
    if f.format == "qoq":
        s8 = q * step - f.zeros.astype(np.int32)[:, g] * step  # subtraction after multiplication
    else:
        u8 = (q * step + f.zeros.astype(np.int32)[:, g]) & 0xFF
        s8 = (u8 ^ 0x80).astype(np.uint8).view(np.int8).astype(np.int32)
    return (s8.astype(np.float32) * f.channel_scales[:, None]).astype(np.float32)


def fake_quant(w: torch.Tensor, fmt: str, group: int = 128, symmetric: bool = False) -> torch.Tensor:
    return torch.from_numpy(dequantize(quantize_rtn(w, fmt, group, symmetric)))


# ---- u4 packing for the checkpoint ------------------------------------------------------------------
def pack_u4(q: np.ndarray) -> np.ndarray:
    """[n, k] values 0..15 -> uint8 [n, ceil(k/2)], low nibble = even k (a pad nibble of 0 when k is odd)."""
    n, k = q.shape
    if q.min(initial=0) < 0 or q.max(initial=0) > 15:
        raise ValueError("pack_u4: values must lie in [0, 15]")
    padded = np.zeros((n, k + (k & 1)), dtype=np.uint8)
    padded[:, :k] = q
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8)


def unpack_u4(packed: np.ndarray, k: int) -> np.ndarray:
    if packed.shape[1] != (k + 1) // 2:
        raise ValueError(f"unpack_u4: packed has {packed.shape[1]} bytes per row, expected {(k + 1) // 2} for k={k}")
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0x0F, packed >> 4
    return out[:, :k]
