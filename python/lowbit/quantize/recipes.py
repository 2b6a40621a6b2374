"""Recipes (what precision) and algorithms (how to get there), and which pairs exist.

Recipe grammar (mirrors include/lowbit/quant/recipe.h):
    w{16|8|4|fp8} a{16|8|4} [g{32|64|128}] [kv{16|8|4|2} | k{..}v{..}] [-{qoq|liquid}]
w4a8 stores the QoQ format (g128) unless "-liquid" (LiquidQuant, g64); w4a4 is COMET's mixed W4A4/W4A8 (FMPQ)
activations with QoQ-format g128 weights (u4 holding s8 per group: what the engine's int32 FMPQ GEMM reads, as
include/lowbit/quant/recipe.h maps w4a4).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_RECIPE_RE = re.compile(r"^w(16|8|4|fp8)a(16|8|4)(?:g(32|64|128))?(?:kv(16|8|4|2)|k(16|8|4|2)v(16|8|4|2))?"
                        r"(?:-(qoq|liquid))?$")

# algorithm -> recipes it handles (by weight/activation part) and a one-line description
ALGORITHMS = {
    "rtn": ("w8a16 w8a8 w4a16 w4a8 w4a8-liquid wfp8a16 w16a16",
            "round-to-nearest (every format; w4a4 needs fmpq's activation block maps)"),
    "awq": ("w4a16 w4a8", "AWQ activation-aware scale search + clipping"),
    "gptq": ("w4a16 w8a16", "GPTQ Hessian error feedback (optional act-order)"),
    "smoothquant": ("w8a8", "SmoothQuant with alpha searched per model"),
    "qoq": ("w4a8", "QServe QoQ: rotation, SmoothAttention, smoothing, reordering, clipping, progressive w4"),
    "liquid": ("w4a8-liquid", "LiquidQuant: SmoothQuant-smoothed, two-level s8 -> u4 (step <= 16)"),
    "fmpq": ("w4a4", "COMET FMPQ: outlier channels permuted into int8 blocks, the rest int4"),
}


class RecipeError(ValueError):
    pass


@dataclass(frozen=True)
class RecipeSpec:
    text: str
    weight_format: str | None  # None = float (16-bit part means the compute dtype)
    weight_bits: int
    group: int
    act: str | None            # None | "int8" | "fmpq"
    k_bits: int
    v_bits: int

    @property
    def wa_key(self) -> str:
        """The weight/activation part used to look up algorithm support (e.g. w4a8, w4a8-liquid)."""
        w = {"e4m3": "wfp8"}.get(self.weight_format or "", f"w{self.weight_bits}")
        a = {None: "a16", "int8": "a8", "fmpq": "a4"}[self.act]
        return w + a + ("-liquid" if self.weight_format == "liquid" else "")


def parse_recipe(text: str) -> RecipeSpec:
    m = _RECIPE_RE.match(text.strip().lower())
    if not m:
        raise RecipeError(f"unknown recipe {text!r}; grammar: w{{16|8|4|fp8}}a{{16|8|4}}[g{{32|64|128}}]"
                          "[kv{16|8|4|2}|k{..}v{..}][-qoq|-liquid], e.g. w4a16, w8a8, w4a8kv4, w4a8g64kv4-liquid, "
                          "w4a4kv4, w16a16kv4")
    w, a, g, kv, k, v, variant = m.groups()
    k_bits = int(kv or k or 16)
    v_bits = int(kv or v or 16)
    act = {"16": None, "8": "int8", "4": "fmpq"}[a]
    if w == "16":
        if act is not None or g or variant:
            raise RecipeError(f"recipe {text!r}: 16-bit weights take no activation quantization, group or variant")
        fmt, bits, group = None, 16, 0
    elif w == "fp8":
        fmt, bits, group = "e4m3", 8, 0
    elif w == "8":
        fmt, bits, group = "w8", 8, 0
    else:
        bits = 4
        if act is None:
            fmt, group = "w4", int(g or 128)
        elif act == "int8":
            fmt = "liquid" if variant == "liquid" else "qoq"
            group = int(g or (64 if fmt == "liquid" else 128))
        else:  # a4: the engine's FMPQ GEMM (ops::linear_fmpq) multiplies s8 activations by s8-per-group weights
            fmt, group = "qoq", int(g or 128)
    if variant and not (bits == 4 and act == "int8"):
        raise RecipeError(f"recipe {text!r}: the -{variant} variant applies to w4a8 only")
    if g and bits != 4:
        raise RecipeError(f"recipe {text!r}: a group size applies to 4-bit weights only")
    if fmt in ("w8", "e4m3") and act == "fmpq":
        raise RecipeError(f"recipe {text!r}: a4 (FMPQ) needs 4-bit weights")
    if fmt == "e4m3" and act is not None:
        raise RecipeError(f"recipe {text!r}: `lowbit quantize` writes fp8 weights for 16-bit activations only (wfp8a16); "
                          "wfp8a8 (per-token fp8 activations) needs no calibration: load the model with that recipe")
    return RecipeSpec(text.strip().lower(), fmt, bits, group, act, k_bits, v_bits)


def supported_pairs() -> str:
    return "; ".join(f"{algo}: {recipes}" for algo, (recipes, _) in ALGORITHMS.items())


def check_pair(algo: str, spec: RecipeSpec) -> None:
    if algo not in ALGORITHMS:
        raise RecipeError(f"unknown algorithm {algo!r}; known: {', '.join(ALGORITHMS)} (pairs: {supported_pairs()})")
    if spec.wa_key not in ALGORITHMS[algo][0].split():
        raise RecipeError(f"algorithm {algo!r} does not handle recipe {spec.text!r} ({spec.wa_key}); "
                          f"pairs that exist: {supported_pairs()}")
