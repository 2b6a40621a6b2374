"""What a GGUF file's quantized linears become: the recipe a file implies when none is given, the Q8_0 -> w8 g32
choice, and the log line for the types lowbit can only dequantize (K-quants, Q5_*, IQ*, ...).

model_loading.choose_stored calls these; the Q4_0 / Q4_1 choice stays there. Every line printed starts with
"lowbit: <file>:" and says what was chosen, so a user sees once how the file's weights run.
"""
from __future__ import annotations

import re

from .gguf_native import GROUP, NATIVE_FORMAT

FLOAT_TYPES = ("F32", "F16", "BF16")


def quantized_types(linear_types: dict | None) -> list[str]:
    """The GGUF types of the linears that are not plain floats, sorted."""
    return sorted(t for t in (linear_types or {}) if t not in FLOAT_TYPES)


def file_recipe(linear_types: dict | None) -> tuple[str, str]:
    """The recipe a GGUF file implies when the user gives none, and why (for the log line).

    A file whose linears are all one type lowbit runs as stored keeps that precision, on the CPU and the GPU:
    Q4_0 / Q4_1 -> w4a16g32, Q8_0 -> w8a16g32. Float files, K-quants (no kernel runs them as stored) and files
    mixing types load their exact dequantized values as float weights (w16a16)."""
    types = quantized_types(linear_types)
    if not types:
        return "w16a16", "its linears are float"
    if len(types) == 1 and types[0] in NATIVE_FORMAT:
        recipe = "w4a16g32" if NATIVE_FORMAT[types[0]] == "w4" else "w8a16g32"
        return recipe, f"its linears are {types[0]}"
    if len(types) > 1 and all(t in NATIVE_FORMAT for t in types):
        return "w16a16", f"it mixes {'/'.join(types)} linears, which no one recipe keeps as stored"
    return "w16a16", f"no lowbit kernel runs its {'/'.join(types)} linears as stored"


def w8_choice(w8_fields: dict, spec, recipe: str, source: str):
    """Q8_0 linears under an 8-bit, float-activation recipe: (recipe, fields to upload, note).

    "w8a16..." with no group or g32 keeps them as stored, on the CPU and the GPU (the recipe becomes
    w8a16g32...); an explicit other group re-quantizes from the exact dequantized values, and the note says so."""
    count = len(w8_fields)  # spec.group: 0 unless the recipe names one (w8 is per channel by default)
    if spec.group and spec.group != GROUP:
        return recipe, {}, (f"lowbit: {source}: recipe {spec.text} re-quantizes the file's {count} Q8_0 linears "
                            f"(groups of {GROUP}) to groups of {spec.group}; recipe 'w8a16' keeps them as stored")
    kept = spec.text if spec.group else spec.text.replace("w8a16", f"w8a16g{GROUP}", 1)
    return kept, dict(w8_fields), (f"lowbit: {source}: {count} Q8_0 weights loaded as stored (w8 g{GROUP}, "
                                   f"no re-quantization); recipe {kept}")


_KIND_ORDER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, v in enumerate(layers):
        if start is None:
            start = v
        if i + 1 == len(layers) or layers[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def describe_linears(gguf_names: list[str]) -> str:
    """GGUF linear names, grouped for a log line: 'attn_q, attn_k of blk.0-29; ffn_down of blk.0, 3 (62 tensors)'."""
    layers: dict[str, list[int]] = {}
    for name in gguf_names:
        m = re.match(r"blk\.(\d+)\.(.+)\.weight$", name)
        kind, layer = (m.group(2), int(m.group(1))) if m else (name, -1)
        layers.setdefault(kind, []).append(layer)
    by_layers: dict[str, list[str]] = {}  # the same layer set -> its kinds
    order = lambda k: (_KIND_ORDER.index(k) if k in _KIND_ORDER else len(_KIND_ORDER), k)  # noqa: E731
    for kind in sorted(layers, key=order):
        by_layers.setdefault(_ranges(sorted(layers[kind])), []).append(kind)
    parts = [f"{', '.join(kinds)} of blk.{where}" for where, kinds in by_layers.items()]
    count = len(gguf_names)
    return "; ".join(parts) + f" ({count} tensor{'' if count == 1 else 's'})"


_HF_LINEARS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
               "up_proj.weight", "down_proj.weight")


def is_linear(hf_name: str) -> bool:
    return hf_name.startswith("model.layers.") and hf_name.endswith(_HF_LINEARS)


def gguf_name(hf_name: str) -> str:
    """The GGUF spelling of an HF tensor name (model.layers.3.mlp.down_proj.weight -> blk.3.ffn_down.weight)."""
    from .gguf_loader import _GLOBAL_NAMES, _LAYER_NAMES

    for g, h in _GLOBAL_NAMES.items():
        if h == hf_name:
            return g
    m = re.match(r"model\.layers\.(\d+)\.(.+)$", hf_name)
    if m:
        for g, h in _LAYER_NAMES.items():
            if h == m.group(2):
                return f"blk.{m.group(1)}.{g}"
    return hf_name


def float_linears_note(tensor_types: dict, kept: set, spec, source: str) -> str | None:
    """When some linears run as stored and the file's float linears are quantized by the recipe (round to nearest),
    one line says which: the recipe that keeps the quantized ones is lossy for those. None otherwise."""
    if not kept or spec.weight_format is None:
        return None
    floats = [gguf_name(n) for n, t in tensor_types.items() if is_linear(n) and t in FLOAT_TYPES]
    if not floats:
        return None
    group = f" g{spec.group}" if spec.group else ""
    return (f"lowbit: {source}: the file's float linears are quantized round-to-nearest to {spec.weight_format}{group} "
            f"(recipe {spec.text}; recipe w16a16 keeps every linear exact): {describe_linears(floats)}")


def dequantized_note(tensor_types: dict, kept: set, spec, dtype: str, source: str) -> str | None:
    """One line for the linears whose GGUF type no lowbit kernel runs as stored (K-quants, Q5_0, IQ4_NL, ... or a
    Q4/Q8 linear the chosen recipe does not keep): they are dequantized exactly by gguf-py and then either kept as
    float weights or re-quantized by the recipe. None when there are none."""
    rest = {n: t for n, t in tensor_types.items() if is_linear(n) and t not in FLOAT_TYPES and n not in kept}
    if not rest:
        return None
    by_type: dict[str, list[str]] = {}
    for name, t in rest.items():
        by_type.setdefault(t, []).append(gguf_name(name))
    what = "; ".join(f"{t}: {describe_linears(names)}" for t, names in sorted(by_type.items()))
    if spec.weight_format is None:
        target = f"kept as {dtype} weights (recipe {spec.text})"
    else:
        group = f" g{spec.group}" if spec.group else ""
        target = f"re-quantized round-to-nearest to {spec.weight_format}{group} (recipe {spec.text})"
    return (f"lowbit: {source}: {len(rest)} linears dequantized exactly (gguf-py's reference) and {target}, as no "
            f"lowbit kernel runs them as stored: {what}")
