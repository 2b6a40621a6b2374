"""GPTQ checkpoints (auto-gptq, GPTQModel, optimum): qweight/qzeros/scales/g_idx -> lowbit w4 (or w8).

The layout, as GPTQModel's BaseQuantLinear.pack_block writes it and dequantize_weight reads it (int32 words,
value i of a word in bits [4i, 4i+4)):
  qweight int32 [k/8, n]  input channels packed down the rows: row r, value i is channel 8r+i
  qzeros  int32 [G, n/8]  output channels packed along the row
  scales  f16   [G, n]
  g_idx   int32 [k]       the group of each input channel (act-order / desc_act: not i // group_size)
  w[o, c] = (q[c, o] - zero[g_idx[c], o]) * scale[g_idx[c], o]
Zero points: "gptq_v2" (GPTQModel's internal format) stores the zero itself. checkpoint_format "gptq" (v1) stores
zero - 1, in one of two ways that differ only where a zero is 0 (asymmetric groups that are all >= 0):
  - GPTQModel (quantization_config.meta.quantizer names it; also what transformers and optimum now write and read)
    subtracts 0x11111111 from each whole int32 word (convert_gptq_v2_to_v1_format), so a zero of 0 is stored as
    15 with a borrow from the next field; the reader adds the word back (convert_gptq_v1_to_v2_format), exact.
  - auto-gptq and other producers: the reader adds 1 to each 4-bit field (auto-gptq's dequantization does
    `zeros + 1`). A zero of 16 (stored 15) is outside w4's [0, 15]: it is rewritten exactly as zero 15 with
    q - 1 when no q of its group is 0, and is an error otherwise.
Both readings agree on every word without a stored field of 15. Without the name (a GPTQModel file whose meta was
stripped), a linear's qzeros still tell the two apart where a word holds a 15 with a field other than 15 above it:
per field that would be a zero of 16, which no GPTQ quantizer writes (zero = round(-min / scale) <= 2^bits - 1),
and auto-gptq's pack of a zero of 0 (-1 as uint32, OR-ed in) sets every higher field to 15. Such a word is GPTQModel's
borrow, so that linear is read with the word offset, exactly. A linear whose 15s all have only 15s above them (a
zero of 0 in the top field, or followed only by zeros of 1) stays ambiguous and is read per field.
"""
from __future__ import annotations

import numpy as np

from .common import (CheckpointFormatError, exact_f32, linear_shape, lowbit_group, perm_from_g_idx, unpack_int32,
                     w4_fields)


def read_options(qc: dict, where: str) -> dict:
    """The fields of a GPTQ quantization_config that decide the layout; anything lowbit cannot run raises."""
    for key in ("bits", "group_size"):
        if key not in qc:
            raise CheckpointFormatError(f"{where}: quantization_config.{key} is missing (GPTQ checkpoints record it)")
    bits, group = qc["bits"], qc["group_size"]
    if bits not in (4, 8):
        raise CheckpointFormatError(f"{where}: quantization_config.bits = {bits!r}: lowbit runs 4-bit GPTQ "
                                    "(and 8-bit per-channel symmetric), it has no exact format for other widths")
    if not isinstance(group, int) or (group <= 0 and group != -1):
        raise CheckpointFormatError(f"{where}: quantization_config.group_size = {group!r}: expected a positive size "
                                    "or -1 (one group per row)")
    if qc.get("is_marlin_format"):
        raise CheckpointFormatError(f"{where}: quantization_config.is_marlin_format is true: Marlin-repacked GPTQ "
                                    "weights are a kernel layout, not the GPTQ layout; load the original checkpoint")
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise CheckpointFormatError(f"{where}: quantization_config.checkpoint_format = {fmt!r}: lowbit reads "
                                    "'gptq' (v1, zero points stored minus 1) and 'gptq_v2'")
    pack_dtype = qc.get("pack_dtype", "int32")
    if str(pack_dtype).replace("torch.", "") != "int32":
        raise CheckpointFormatError(f"{where}: quantization_config.pack_dtype = {pack_dtype!r}: lowbit reads int32 words")
    if qc.get("dynamic"):
        raise CheckpointFormatError(f"{where}: quantization_config.dynamic holds per-module overrides, which lowbit "
                                    "does not read; it would apply the wrong bits/group to some modules")
    return {"bits": bits, "group": group, "sym": bool(qc.get("sym", True)), "v1": fmt == "gptq",
            "v1_word_offset": fmt == "gptq" and _written_by_gptqmodel(qc),
            "desc_act": bool(qc.get("desc_act", False)), "format": fmt}


def _written_by_gptqmodel(qc: dict) -> bool:
    """GPTQModel records itself in quantization_config.meta.quantizer (a list of "name:version", or one string)."""
    meta = qc.get("meta")
    names = meta.get("quantizer", ()) if isinstance(meta, dict) else ()
    names = [names] if isinstance(names, str) else names
    return any(isinstance(x, str) and x.lower().startswith("gptqmodel") for x in names)


def _v1_zeros_word_offset(qzeros, bits: int):
    """GPTQModel's v1 -> v2 zero points: add 1 to every field as one int32 addition (carries included, mod 2^32)."""
    offset = sum(1 << (bits * i) for i in range(32 // bits))
    return (np.ascontiguousarray(qzeros.numpy()).view(np.uint32) + np.uint32(offset)).view(np.int32)


def _has_borrow(qzeros, bits: int) -> bool:
    """A word with a stored all-ones field below a field that is not all ones: GPTQModel's word offset (see top)."""
    words = np.ascontiguousarray(qzeros.numpy()).view(np.uint32).ravel()
    full = (1 << bits) - 1
    fields = [(words >> np.uint32(bits * i)) & np.uint32(full) for i in range(32 // bits)]
    above_not_full = np.zeros(words.shape, dtype=bool)  # some field above field i is not all ones
    for f in reversed(fields):
        if ((f == full) & above_not_full).any():
            return True
        above_not_full |= f != full
    return False


def read_linear(raw, module: str, config, opts: dict, where: str):
    """One GPTQ linear -> QuantFields (input_perm in extra when g_idx is act-order)."""
    n, k = linear_shape(config, module)
    bits, per = opts["bits"], 32 // opts["bits"]
    file_group = k if opts["group"] == -1 else opts["group"]
    num_groups = -(-k // file_group)
    what = f"{where}: {module}"
    group = lowbit_group(file_group, k, what) if bits == 4 else 0  # an unrepresentable group fails before the tensors
    if k % per or n % per:
        raise CheckpointFormatError(f"{what}: shape [{n}, {k}] is not a multiple of {per} (GPTQ packs {per} values "
                                    "per int32)")
    import torch
    qweight = raw.pop(module + ".qweight", what, (torch.int32,), (k // per, n))
    qzeros = raw.pop(module + ".qzeros", what, (torch.int32,), (num_groups, n // per))
    scales = raw.pop(module + ".scales", what, (torch.float16, torch.bfloat16, torch.float32), (num_groups, n))
    g_idx = raw.pop(module + ".g_idx", what) if module + ".g_idx" in raw else None
    if g_idx is None and opts["desc_act"]:
        raise CheckpointFormatError(f"{what}: quantization_config.desc_act is true but tensor {module}.g_idx is "
                                    "missing (act-order needs each input channel's group)")
    q = unpack_int32(qweight.T.contiguous(), bits, k)           # [n, k]
    if opts["v1_word_offset"] or (opts["v1"] and _has_borrow(qzeros, bits)):
        zeros = unpack_int32(_v1_zeros_word_offset(qzeros, bits), bits, n).T.astype(np.int32)  # [n, G]
    else:
        zeros = unpack_int32(qzeros, bits, n).T.astype(np.int32)
        if opts["v1"]:
            zeros = zeros + 1
    perm = perm_from_g_idx(g_idx, file_group, k, what) if g_idx is not None else None
    if perm is not None:
        q = q[:, perm]  # groups now contiguous; the engine feeds x[:, perm]
    if bits == 8:
        f = _w8_fields(what, q, scales, zeros, opts)
    else:
        f = _w4(what, q, scales.T.contiguous(), zeros, file_group, group, opts)
    if perm is not None:
        if module == "lm_head":
            raise CheckpointFormatError(f"{what}: act-order g_idx on lm_head: the engine permutes decoder linear "
                                        "inputs only")
        f.extra["input_perm"] = perm.astype(np.int64)
    return f


def _w4(what, q, scales, zeros, file_group, group, opts):
    if opts["sym"]:
        if not (zeros == 8).all():
            raise CheckpointFormatError(f"{what}: quantization_config.sym is true but qzeros hold zero points other "
                                        f"than 8 (found {sorted(set(np.unique(zeros).tolist()) - {8})[:4]})")
        return w4_fields(what, q, scales, None, file_group, group)
    high = zeros == 16  # only from the per-field v1 reading of a stored 15 (not GPTQModel's word offset)
    if high.any():
        q, zeros = _lower_zero_16(what, q, zeros, high, file_group)
    return w4_fields(what, q, scales, zeros, file_group, group)


def _lower_zero_16(what, q, zeros, high, file_group):
    """(q - 16) = ((q - 1) - 15): exact when the group has no q = 0."""
    q, zeros = q.copy(), zeros.copy()
    for row, g in zip(*np.nonzero(high)):
        cols = slice(g * file_group, (g + 1) * file_group)
        if (q[row, cols] == 0).any():
            raise CheckpointFormatError(f"{what}: row {row} group {g} has zero point 16 (v1 qzeros field 15) and a "
                                        "q of 0: (0 - 16) * scale is outside lowbit's w4 grid")
        q[row, cols] -= 1
        zeros[row, g] = 15
    return q, zeros


def _w8_fields(what, q, scales, zeros, opts):
    """8-bit GPTQ maps to w8 (per-channel s8, f32 scale) only with one group per row and zero 128."""
    from ...quant_fields import QuantFields
    n, k = q.shape
    if opts["group"] != -1 and opts["group"] < k:
        raise CheckpointFormatError(f"{what}: quantization_config.bits = 8 with group_size {opts['group']}: lowbit's "
                                    "8-bit format is per-channel (group_size -1); per-group int8 has no exact form")
    if not (zeros == 128).all():
        raise CheckpointFormatError(f"{what}: 8-bit zero points other than 128 (asymmetric): lowbit's w8 is symmetric")
    f = QuantFields("w8", n, k)
    f.q = (q.astype(np.int16) - 128).astype(np.int8)
    f.scales = exact_f32(scales[0], what + " scales")
    return f
