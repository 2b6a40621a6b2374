"""`lowbit info`'s table of a GGUF file's tensors: per group of same-kind tensors, the file's type, the lowbit format
they were loaded as, and how (stored as is, dequantized exactly, quantized at load).

Built from what the loader and model_loading.use_stored_quantization decided (LoadedModel.tensor_types, .fields,
.head_format) and the recipe, before the float tensors are dropped.
"""
from __future__ import annotations

import re

from .gguf_choice import FLOAT_TYPES, gguf_name

_FLOAT_NAMES = {"f32", "f16", "bf16"}


def _kind(gguf: str) -> str:
    """blk.3.attn_q.weight -> attn_q; token_embd.weight -> token_embd."""
    m = re.match(r"blk\.\d+\.(.+?)(\.weight|\.bias)?$", gguf)
    if m:
        return m.group(1) + (".bias" if m.group(2) == ".bias" else "")
    return gguf.removesuffix(".weight")


_ORDER = ("token_embd", "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
          "ffn_down", "output_norm", "output")


def _kind_order(kind: str):
    base = kind.split(".")[0].split(" ")[0]
    return (_ORDER.index(base) if base in _ORDER else len(_ORDER), kind)


def _format_of_fields(f) -> str:
    return f"{f.format} g{f.group}" + (" + min" if getattr(f, "mins", None) is not None else "")


def _recipe_format(spec, dtype: str) -> str:
    """The lowbit format the recipe quantizes a float linear to."""
    if spec.weight_format is None:
        return dtype
    return spec.weight_format + (f" g{spec.group}" if spec.group else "")


def _how(file_type: str, target: str) -> str:
    float_target = target in _FLOAT_NAMES
    if file_type in FLOAT_TYPES:
        return "as is" if float_target else "quantized at load (round to nearest)"
    return "dequantized exactly" if float_target else "dequantized exactly, re-quantized (round to nearest)"


def tensor_report(loaded, recipe: str, dtype: str) -> list[dict] | None:
    """Rows {"tensors", "count", "file", "loaded_as", "how"} grouping same-kind GGUF tensors that were loaded
    the same way; None for a source that is not a GGUF file."""
    types = getattr(loaded, "tensor_types", None)
    if not types:
        return None
    from ..quantize.recipes import parse_recipe

    spec = parse_recipe(recipe)
    fields = getattr(loaded, "fields", {}) or {}
    linear_target = _recipe_format(spec, dtype)
    head_target = getattr(loaded, "head_format", None) or (linear_target if spec.act is None else
                                                           ("bf16" if dtype == "bf16" else "f16"))
    entries = []  # (kind, file type, lowbit format, how)
    for hf, file_type in types.items():
        kind = _kind(gguf_name(hf))
        if hf in fields:
            entries.append((kind, file_type, _format_of_fields(fields[hf]), "stored (no re-quantization)"))
        elif hf == "lm_head.weight":
            entries.append((kind, file_type, head_target, _how(file_type, head_target)))
        elif hf.endswith("_proj.weight"):
            entries.append((kind, file_type, linear_target, _how(file_type, linear_target)))
        else:  # embedding, norms, biases: the compute dtype
            entries.append((kind, file_type, dtype, _how(file_type, dtype)))
    if loaded.config.tie_word_embeddings:  # lm_head reads the embedding's values
        head = fields.get("lm_head.weight")
        file_type = getattr(loaded, "head_type", "") or types.get("model.embed_tokens.weight", "")
        if head is not None:
            entries.append(("output (tied to token_embd)", file_type, _format_of_fields(head),
                            "stored (no re-quantization)"))
        else:
            entries.append(("output (tied to token_embd)", file_type, head_target, _how(file_type, head_target)))
    rows: dict[tuple, dict] = {}
    for kind, file_type, target, how in entries:
        row = rows.setdefault((file_type, target, how), {"kinds": [], "count": 0})
        row["count"] += 1
        if kind not in row["kinds"]:
            row["kinds"].append(kind)
    return [{"tensors": ", ".join(sorted(r["kinds"], key=_kind_order)), "count": r["count"], "file": ft, "loaded_as": target, "how": how}
            for (ft, target, how), r in rows.items()]


def format_tensors(rows: list[dict]) -> list[str]:
    """The report as aligned text lines for `lowbit info`."""
    width = max(len(r["tensors"]) for r in rows)
    lines = ["tensors     (GGUF type -> lowbit format: how)"]
    for r in rows:
        lines.append(f"  {r['tensors']:<{width}}  {r['count']:>4} x {r['file']:<5} -> {r['loaded_as']}: {r['how']}")
    return lines
