"""LiquidQuant (LiquidGEMM 003 §4, §6): SmoothQuant-smoothed weights, then two-level quantization:
level 1 per-channel s8 in the protective range [-119, 119] (f32 scale), level 2 per group of 64: u4 with an
integer step s = ceil((max - min) / 15) <= 16 and offset a = 128 + min, dequantized as (q·s + a) XOR 0x80 in
u8 (formats.py). The SmoothQuant α is searched per model like SmoothQuant's; clip ratios by output MSE.
"""
from __future__ import annotations

from .smoothquant import SmoothQuant


class LiquidQuant(SmoothQuant):
    name = "liquid"
    clip = True
