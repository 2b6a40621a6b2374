"""GGUF quant types that lowbit runs as they are stored, without re-quantization.

  Q4_0: blocks of 32 along k, f16 scale d, 4-bit q:   w = (q - 8) * d   -> w4 g32, zero 8
  Q4_1: blocks of 32 along k, f16 scale d and min m:  w = q * d + m     -> w4 g32 with per-group mins

lowbit's w4 scales are positive, ggml's Q4_0 scale is signed (d = the largest-magnitude value / -8): a block
with d < 0 is stored as q' = 15 - q, zero 7, scale -d, since (q - 8) d = (q' - 7)(-d) exactly; an all-zero block
(d = 0) as q' = 8, zero 8. Q4_1's d = (max - min) / 15 is never negative (a file that has one is refused); its
d = 0 blocks become q = 0 with scale 1, so q*s + m = m.
Both store a block as its f16 parameters followed by 16 bytes whose low nibbles are elements 0-15 and high
nibbles elements 16-31 (ggml's block_q4_0 / block_q4_1). The fields built here are lowbit's QuantizedWeight
(include/lowbit/quant/format.h), and lowbit's dequantization of them equals gguf-py's reference bit for bit.
The CPU kernels run them; the GPU kernels have no g32 / min layout, so there the loader re-quantizes (and says so).
"""
from __future__ import annotations

import re

import numpy as np

from ..quant_fields import QuantFields

GROUP = 32
NATIVE_TYPES = ("Q4_0", "Q4_1")
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


def native_fields(t, path) -> QuantFields | None:
    """The QuantFields of GGUF tensor `t` when its type is one lowbit runs as stored (Q4_0, Q4_1), else None.
    Rows are in the file's order (the caller undoes llama.cpp's q/k row permutation on q and the parameters)."""
    import gguf

    qtype = gguf.GGMLQuantizationType(t.tensor_type).name
    if qtype not in NATIVE_TYPES:
        return None
    k, n = (int(d) for d in t.shape)  # GGUF lists dims fastest-first
    if k % GROUP:
        raise ValueError(f"{path}: tensor {t.name!r} of type {qtype} has {k} columns, not a multiple of {GROUP}")
    blocks = np.asarray(t.data, dtype=np.uint8).reshape(n, k // GROUP, _BLOCK_BYTES[qtype])
    params = 4 if qtype == "Q4_1" else 2
    d = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).reshape(n, k // GROUP)
    packed = blocks[:, :, params:]                                    # [n, G, 16]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=2)          # elements 0-15, then 16-31 of each block
    if not np.isfinite(d).all():
        raise ValueError(f"{path}: tensor {t.name!r} ({qtype}) holds non-finite block scales")
    fields = QuantFields(format="w4", n=n, k=k, group=GROUP, symmetric=False)
    if qtype == "Q4_0":
        negative, zero_block = d < 0, d == 0
        q = np.where(negative[:, :, None], 15 - q, q)
        q = np.where(zero_block[:, :, None], np.uint8(8), q)
        fields.zeros = np.where(negative, 7, 8).astype(np.float16)
        fields.scales = np.where(zero_block, np.float16(1), np.abs(d)).astype(np.float16)
    else:
        if (d < 0).any():
            raise ValueError(f"{path}: tensor {t.name!r} (Q4_1) has negative block scales, which ggml never "
                             f"writes; lowbit cannot keep it exactly")
        zero_block = d == 0
        q = np.where(zero_block[:, :, None], np.uint8(0), q)
        fields.scales = np.where(zero_block, np.float16(1), d).astype(np.float16)
        fields.mins = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16).reshape(n, k // GROUP).copy()
    fields.q = np.ascontiguousarray(q.reshape(n, k).astype(np.uint8))
    fields.extra["gguf_type"] = qtype
    return fields


def head_format(gguf_type: str) -> str:
    """lm_head's lowbit format when the file runs as stored: its float width, or w8 (per channel) for a quantized
    output layer (llama.cpp keeps it at 8 bits or more; 4 bits there cost SmolLM2 ~2% of its log-likelihood)."""
    return {"F32": "f32", "F16": "f16", "BF16": "bf16"}.get(gguf_type, "w8")


def permute_rows(fields: QuantFields, unpermute) -> QuantFields:
    """Applies a row permutation (llama.cpp's q/k rope order undone) to q and every per-row parameter."""
    fields.q = unpermute(fields.q)
    fields.scales = unpermute(fields.scales)
    for name in ("zeros", "mins"):
        if getattr(fields, name) is not None:
            setattr(fields, name, unpermute(getattr(fields, name)))
    return fields


def choose(native: dict[str, QuantFields], recipe: str | None, device: str, source: str):
    """Which recipe to build and which of the file's quantized linears to upload as stored.

    Returns (recipe, fields_to_upload, note). A recipe asking for 4-bit weights with float activations and no
    explicit group ("w4a16", "w4a16kv8", ...) on the CPU keeps the file's g32 grid: it becomes "w4a16g32..." and
    every Q4_0 / Q4_1 linear is uploaded as stored. An explicit other group, another format, the GPU, or a file
    mixing Q4_0 and Q4_1 linears re-quantize from the exact dequantized values, and the note says so."""
    if not native or recipe is None:
        return recipe, {}, None
    from ..quantize.recipes import parse_recipe

    spec = parse_recipe(recipe)
    if spec.weight_format != "w4" or spec.activation != "float16":
        return recipe, {}, None
    types = sorted({f.extra["gguf_type"] for f in native.values()})
    what = "/".join(types)
    explicit = re.match(r"\s*w4a16g(\d+)", recipe.lower())
    if explicit and int(explicit.group(1)) != GROUP:
        return recipe, {}, (f"lowbit: {source}: recipe {recipe!r} re-quantizes the file's {what} weights (groups of "
                            f"{GROUP}) to groups of {explicit.group(1)}; recipe 'w4a16' keeps them as stored")
    if str(device).startswith("cuda"):
        return recipe, {}, (f"lowbit: {source}: the file's {what} weights (groups of {GROUP}) have no GPU kernel "
                            f"yet; re-quantized to {spec.text}")
    if len(types) > 1:
        return recipe, {}, (f"lowbit: {source}: the file mixes {what} linears, which cannot share a fused layer "
                            f"as stored; re-quantized to {spec.text}")
    kept = spec.text if explicit else spec.text.replace("w4a16", f"w4a16g{GROUP}", 1)
    return kept, dict(native), (f"lowbit: {source}: {len(native)} {what} weights loaded as stored "
                                f"(w4 g{GROUP}{' + min' if types == ['Q4_1'] else ''}, no re-quantization); "
                                f"recipe {kept}")
