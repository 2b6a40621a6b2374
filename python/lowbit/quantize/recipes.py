"""Recipes (what precision) and algorithms (how to get there), and which pairs exist.

Recipe strings are parsed by the C++ parser only (`lowbit._core.parse_recipe`, include/lowbit/quant/recipe.h,
grammar in docs/formats.md); `parse_recipe` here wraps its result into a `RecipeSpec` and its errors into
`RecipeError` with the C++ message unchanged. There is no second grammar in Python: without the extension
(LOWBIT_NO_CORE=1 or a broken build) parsing a recipe is an error that says so.

w4a8 stores the QoQ format (g128) unless "-liquid" (LiquidQuant, g64); w4a4 is COMET's mixed W4A4/W4A8 (FMPQ)
activations with QoQ-format g128 weights (u4 holding s8 per group: what the engine's int32 FMPQ GEMM reads).
"""
from __future__ import annotations

from dataclasses import dataclass

# algorithm -> recipes it handles (by weight/activation part, RecipeSpec.wa_key) and a one-line description
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

# The C++ activation mode -> the fake quantizer's name (torch_model.FakeQuant.act_quant, manifest "activation").
_ACT_QUANT = {"float16": None, "int8_per_token": "int8", "fmpq_mixed": "fmpq", "fp8_per_token": "fp8"}


class RecipeError(ValueError):
    pass


@dataclass(frozen=True)
class RecipeSpec:
    """A parsed recipe: the C++ `Recipe` fields (see `_core.parse_recipe`), as Python reads them."""
    text: str                  # canonical spelling (C++ to_string): "w4a16g128" -> "w4a16", "w4a8-qoq" -> "w4a8"
    weight_format: str | None  # None = float (the 16-bit part means the compute dtype; C++ says "f32")
    weight_bits: int           # 16, 8 (w8 and fp8) or 4
    group: int                 # group size of group-wise formats (defaults filled in), else 0
    activation: str            # C++ ActivationMode name: float16 | int8_per_token | fmpq_mixed | fp8_per_token
    activation_bits: int       # 16, 8 or 4
    variant: str               # w4a8 weight format chosen by the -qoq/-liquid suffix ("qoq", "liquid"), else ""
    k_bits: int
    v_bits: int
    has_kv2: bool
    k_per_channel: bool = False  # "kc": K per channel over groups of k_group tokens (KIVI-style)
    k_group: int = 0             # tokens per K group when k_per_channel (32, 64, 128), else 0
    kv_format: str = "kv16"      # the KV part of the spelling: "kv4", "k8v4", "kc4v4", "kc2g32v2"

    @classmethod
    def from_core(cls, d: dict) -> "RecipeSpec":
        fmt = None if d["weight_bits"] == 16 else d["weight_format"]
        return cls(d["text"], fmt, d["weight_bits"], d["group"], d["activation"], d["activation_bits"],
                   d["variant"], d["k_bits"], d["v_bits"], d["has_kv2"], d["k_per_channel"], d["k_group"],
                   d["kv_format"])

    @property
    def act(self) -> str | None:
        """The fake activation quantizer: None (float) | "int8" | "fmpq" | "fp8"."""
        return _ACT_QUANT[self.activation]

    @property
    def wa_key(self) -> str:
        """The weight/activation part used to look up algorithm support (e.g. w4a8, w4a8-liquid)."""
        w = "wfp8" if self.weight_format == "e4m3" else f"w{self.weight_bits}"
        return f"{w}a{self.activation_bits}" + ("-liquid" if self.variant == "liquid" else "")


def _core_parse():
    try:
        from .. import _core
    except ImportError as e:
        raise RecipeError(f"parsing a recipe needs lowbit's C++ extension (lowbit._core), which did not import "
                          f"({e}); recipes have one parser, in C++. Unset LOWBIT_NO_CORE / reinstall lowbit") from None
    return _core.parse_recipe


def parse_recipe(text: str) -> RecipeSpec:
    """Parses `text` with the C++ parser; a bad recipe raises RecipeError (a ValueError) with its message, which
    names the recipe, the bad part and its position, and lists valid recipes."""
    if not isinstance(text, str):
        raise RecipeError(f"a recipe is a string such as 'w4a16kv8', got {type(text).__name__} {text!r}")
    parse = _core_parse()
    try:
        d = parse(text)
    except ValueError as e:
        raise RecipeError(str(e)) from None
    return RecipeSpec.from_core(d)


def same_recipe(a: str, b: str) -> bool:
    """Whether two spellings mean the same recipe (e.g. "w4a16g128kv8" and "W4A16k8v8"); False when either is bad."""
    try:
        return parse_recipe(a).text == parse_recipe(b).text
    except RecipeError:
        return False


def same_weights(a: str, b: str) -> bool:
    """Whether two recipes agree on everything but the KV cache (weights, group, activations); False when either
    is bad. An HF quantized checkpoint fixes the weights, while the KV precision stays the user's choice."""
    try:
        pa, pb = parse_recipe(a), parse_recipe(b)
    except RecipeError:
        return False
    key = lambda p: (p.weight_format, p.weight_bits, p.group, p.activation, p.variant)  # noqa: E731
    return key(pa) == key(pb)


def supported_pairs() -> str:
    return "; ".join(f"{algo}: {recipes}" for algo, (recipes, _) in ALGORITHMS.items())


def check_pair(algo: str, spec: RecipeSpec) -> None:
    """Whether `lowbit quantize` can produce `spec` with `algo` (a quantize-time rule, not grammar)."""
    if algo not in ALGORITHMS:
        raise RecipeError(f"unknown algorithm {algo!r}; known: {', '.join(ALGORITHMS)} (pairs: {supported_pairs()})")
    if spec.weight_format == "e4m3" and spec.act is not None:
        raise RecipeError(f"recipe {spec.text!r}: `lowbit quantize` writes fp8 weights for 16-bit activations only "
                          "(wfp8a16); wfp8a8 (per-token fp8 activations) needs no calibration: load the model with "
                          "that recipe")
    if spec.weight_format == "w8" and spec.group:
        raise RecipeError(f"recipe {spec.text!r}: grouped int8 weights are the load-time form of a GGUF Q8_0 file; "
                          "`lowbit quantize` writes per-channel w8 (w8a16, w8a8)")
    if spec.wa_key not in ALGORITHMS[algo][0].split():
        raise RecipeError(f"algorithm {algo!r} does not handle recipe {spec.text!r} ({spec.wa_key}); "
                          f"pairs that exist: {supported_pairs()}")
