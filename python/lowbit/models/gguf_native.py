"""GGUF quant types that lowbit runs as they are stored, without re-quantization.

  Q4_0: blocks of 32 along k, f16 scale d, 4-bit q:   w = (q - 8) * d   -> w4 g32, zero 8
  Q4_1: blocks of 32 along k, f16 scale d and min m:  w = q * d + m     -> w4 g32 with per-group mins
  Q8_0: blocks of 32 along k, f16 scale d, int8 q:    w = q * d         -> w8 g32 (scale d as f32, exact)

lowbit's w4 scales are positive, ggml's Q4_0 scale is signed (d = the largest-magnitude value / -8): a block
with d < 0 is stored as q' = 15 - q, zero 7, scale -d, since (q - 8) d = (q' - 7)(-d) exactly; an all-zero block
(d = 0) as q' = 8, zero 8. Q4_1's d = (max - min) / 15 is never negative (a file that has one is refused); its
d = 0 blocks become q = 0 with scale 1, so q*s + m = m.
Both store a block as its f16 parameters followed by 16 bytes whose low nibbles are elements 0-15 and high
nibbles elements 16-31 (ggml's block_q4_0 / block_q4_1). The fields built here are lowbit's QuantizedWeight
(include/lowbit/quant/format.h), and lowbit's dequantization of them equals gguf-py's reference bit for bit.
Q8_0 stores a block as d followed by 32 int8 values in order (ggml's block_q8_0); its d = max|w| / 127 is never
negative in a ggml file (a file that has one is read as q' = -q, scale -d, refused only where q = -128); a d = 0
block becomes q = 0 with scale 1.
The CPU kernels run them; the GPU kernels have no g32 / min / grouped-w8 layout, so there the loader
re-quantizes (and says so).
"""
from __future__ import annotations

import numpy as np

from ..quant_fields import QuantFields

GROUP = 32
NATIVE_TYPES = ("Q4_0", "Q4_1", "Q8_0")
# the lowbit format each stored type becomes
NATIVE_FORMAT = {"Q4_0": "w4", "Q4_1": "w4", "Q8_0": "w8"}
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def native_fields(t, path) -> QuantFields | None:
    """The QuantFields of GGUF tensor `t` when its type is one lowbit runs as stored (Q4_0, Q4_1, Q8_0), else
    None. Rows are in the file's order (the caller undoes llama.cpp's q/k row permutation on q and the
    parameters)."""
    import gguf

    qtype = gguf.GGMLQuantizationType(t.tensor_type).name
    if qtype not in NATIVE_TYPES:
        return None
    k, n = (int(d) for d in t.shape)  # GGUF lists dims fastest-first
    if k % GROUP:
        raise ValueError(f"{path}: tensor {t.name!r} of type {qtype} has {k} columns, not a multiple of {GROUP}")
    blocks = np.asarray(t.data, dtype=np.uint8).reshape(n, k // GROUP, _BLOCK_BYTES[qtype])
    if qtype == "Q8_0":
        return _q8_0_fields(blocks, n, k, t.name, path)
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


def _q8_0_fields(blocks: np.ndarray, n: int, k: int, name: str, path) -> QuantFields:
    """Q8_0 blocks [n, G, 34] as grouped w8: q copied, the f16 scale widened to f32 (exact)."""
    d = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).reshape(n, k // GROUP).astype(np.float32)
    q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, k // GROUP, GROUP)
    if not np.isfinite(d).all():
        raise ValueError(f"{path}: tensor {name!r} (Q8_0) holds non-finite block scales")
    negative, zero_block = d < 0, d == 0
    if (negative[:, :, None] & (q == -128)).any():
        raise ValueError(f"{path}: tensor {name!r} (Q8_0) has a block with a negative scale and q = -128, which "
                         f"ggml never writes; lowbit's positive w8 scales cannot hold it exactly")
    q = np.where(negative[:, :, None], -q, q)       # (-q)(-d) = q d exactly
    q = np.where(zero_block[:, :, None], np.int8(0), q)
    fields = QuantFields(format="w8", n=n, k=k, group=GROUP, symmetric=False)
    fields.q = np.ascontiguousarray(q.reshape(n, k).astype(np.int8))
    fields.scales = np.where(zero_block, np.float32(1), np.abs(d)).astype(np.float32)
    fields.extra["gguf_type"] = "Q8_0"
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
