"""AutoAWQ checkpoints, GEMM packing ("version": "gemm") -> lowbit w4 (asymmetric).

The layout, as AutoAWQ's WQLinear_GEMM.from_linear packs it and awq/utils/packing_utils.py (unpack_awq +
reverse_awq_order) reads it back:
  qweight int32 [k, n/8]  input channels down the rows, output channels packed along the row: word c holds output
                          channels 8c..8c+7 with channel 8c + AWQ_ORDER[i] in bits [4i, 4i+4),
                          AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7] (an interleave the GEMM kernel's dequantizer wants)
  qzeros  int32 [k/g, n/8] the zero points, packed the same way
  scales  f16   [k/g, n]
  w[o, c] = (q[c, o] - zero[c // g, o]) * scale[c // g, o]  (zero in [0, 15]: AutoAWQ clamps it there)
"""
from __future__ import annotations

import numpy as np

from .common import CheckpointFormatError, linear_shape, lowbit_group, unpack_int32, w4_fields

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # field i of a word holds output channel 8c + AWQ_ORDER[i]


def read_options(qc: dict, where: str) -> dict:
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size"))
    if bits is None:
        raise CheckpointFormatError(f"{where}: quantization_config.bits is missing (AWQ checkpoints record it)")
    if group is None:
        raise CheckpointFormatError(f"{where}: quantization_config.group_size is missing (AWQ checkpoints record it)")
    if bits != 4:
        raise CheckpointFormatError(f"{where}: quantization_config.bits = {bits!r}: AWQ's GEMM packing is 4-bit")
    if not isinstance(group, int) or (group <= 0 and group != -1):
        raise CheckpointFormatError(f"{where}: quantization_config.group_size = {group!r}: expected a positive "
                                    "size or -1")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise CheckpointFormatError(f"{where}: quantization_config.version = {qc.get('version')!r}: lowbit reads "
                                    "AutoAWQ's GEMM packing only (GEMV, GEMV_fast, Marlin and ExLlama versions "
                                    "use other layouts)")
    if qc.get("zero_point", True) is not True:
        raise CheckpointFormatError(f"{where}: quantization_config.zero_point = {qc.get('zero_point')!r}: "
                                    "AutoAWQ's GEMM layout always stores zero points")
    return {"group": group, "skip": list(qc.get("modules_to_not_convert") or [])}


def read_linear(raw, module: str, config, opts: dict, where: str):
    import torch
    n, k = linear_shape(config, module)
    file_group = k if opts["group"] == -1 else opts["group"]
    what = f"{where}: {module}"
    if n % 8:
        raise CheckpointFormatError(f"{what}: {n} output channels are not a multiple of 8 (AWQ packs 8 per int32)")
    if k % file_group:
        raise CheckpointFormatError(f"{what}: {k} input channels are not a multiple of the group size {file_group}")
    groups = k // file_group
    qweight = raw.pop(module + ".qweight", what, (torch.int32,), (k, n // 8))
    qzeros = raw.pop(module + ".qzeros", what, (torch.int32,), (groups, n // 8))
    scales = raw.pop(module + ".scales", what, (torch.float16, torch.bfloat16, torch.float32), (groups, n))
    q = deinterleave(unpack_int32(qweight, 4, n)).T             # [n, k]
    zeros = deinterleave(unpack_int32(qzeros, 4, n)).T.astype(np.int32)
    return w4_fields(what, q, scales.T.contiguous(), zeros, file_group, lowbit_group(file_group, k, what))


def deinterleave(fields: np.ndarray) -> np.ndarray:
    """[rows, n] in packed-field order -> output-channel order: channel 8c + AWQ_ORDER[i] is field 8c + i."""
    n = fields.shape[-1]
    src = np.empty(n, dtype=np.int64)
    for i, o in enumerate(AWQ_ORDER):
        src[o::8] = np.arange(i, n, 8)
    return fields[..., src]
