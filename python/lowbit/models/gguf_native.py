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
