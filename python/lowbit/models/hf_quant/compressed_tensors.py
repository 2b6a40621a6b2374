"""compressed-tensors checkpoints (llm-compressor's output, read by vLLM): pack-quantized int4/int8 (int8 per channel,
per tensor or in groups: llm-compressor's W8A16 preset), naive-/int-quantized int8, float-quantized fp8 e4m3 ->
lowbit w4 / w8 (grouped w8 as GGUF Q8_0 runs) / e4m3; with dynamic per-token 8-bit input activations (the W8A8 and
FP8_DYNAMIC presets) -> recipes w8a8 / wfp8a8.

Layout per quantized module `<m>`, as compressed_tensors.compressors.pack_quantized writes it:
  <m>.weight_packed     int32 [n, ceil(k*bits/32)]: each value stored as q + 2^(bits-1) (signed -> unsigned),
                        value i of a word in bits [i*bits, (i+1)*bits)
  <m>.weight_scale      [n, G] (group), [n, 1] (channel) or [1] (tensor), the model's float dtype
  <m>.weight_zero_point asymmetric only: the signed zero points packed the same way but along dim 0 ([ceil(n/8), G])
  <m>.weight_shape      int [2] = [n, k]
  <m>.weight_g_idx      older "actorder": "group" checkpoints only: each input channel's group
  w = (q - zero_point) * scale in signed integers; in lowbit's unsigned w4 that is (q+8) - (zero+8).
float-quantized: <m>.weight float8_e4m3fn [n, k], <m>.weight_scale [n, 1] or [1]; w = e4m3(q) * scale.
naive-/int-quantized int8: <m>.weight int8 [n, k], <m>.weight_scale, w = q * scale.
"""
from __future__ import annotations

import re

import numpy as np

from ...quant_fields import QuantFields
from .common import (CheckpointFormatError, exact_f32, linear_shape, lowbit_group, perm_from_g_idx, regroup,
                     unpack_int32, w4_fields)

PACKED = "pack-quantized"
FLOAT = "float-quantized"
INT8 = ("naive-quantized", "int-quantized")
_FORMATS = (PACKED, FLOAT) + INT8


def _matches(module: str, target: str) -> bool:
    """compressed-tensors target matching: "re:<regex>" against the module name, a class name ("Linear": every
    module lowbit reads is one), or the module name itself (or a dotted suffix of it)."""
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target == "Linear" or module == target or module.endswith("." + target)


def read_options(qc: dict, where: str) -> dict:
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise CheckpointFormatError(f"{where}: quantization_config.quantization_status = {status!r}: only "
                                    "'compressed' checkpoints hold packed integers (a 'frozen' one stores fake-quantized "
                                    "floats, which lowbit would have to re-quantize)")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointFormatError(f"{where}: quantization_config.config_groups is missing or empty")
    if qc.get("sparsity_config"):
        raise CheckpointFormatError(f"{where}: quantization_config.sparsity_config is set: lowbit has no sparse formats")
    if qc.get("transform_config"):
        raise CheckpointFormatError(f"{where}: quantization_config.transform_config is set (online rotations), "
                                    "which lowbit does not apply")
    if qc.get("kv_cache_scheme"):
        raise CheckpointFormatError(f"{where}: quantization_config.kv_cache_scheme is set: lowbit quantizes its KV "
                                    "cache dynamically (choose it with the recipe, e.g. w4a16kv8), not from "
                                    "calibrated scales")
    schemes = []
    for name, scheme in groups.items():
        field = f"quantization_config.config_groups.{name}"
        if scheme.get("output_activations"):
            raise CheckpointFormatError(f"{where}: {field}.output_activations is set: lowbit has no output "
                                        "quantization")
        activation = _activation(scheme.get("input_activations"), f"{where}: {field}.input_activations")
        w = scheme.get("weights")
        if not isinstance(w, dict):
            raise CheckpointFormatError(f"{where}: {field}.weights is missing")
        for key in ("num_bits", "type", "strategy"):
            if w.get(key) is None:
                raise CheckpointFormatError(f"{where}: {field}.weights.{key} is missing")
        fmt = scheme.get("format") or qc.get("format")
        if fmt not in _FORMATS:
            raise CheckpointFormatError(f"{where}: {field}.format / quantization_config.format = {fmt!r}: lowbit "
                                        f"reads {', '.join(_FORMATS)}")
        targets = scheme.get("targets")
        if not targets:
            raise CheckpointFormatError(f"{where}: {field}.targets is missing")
        schemes.append({"name": field, "targets": list(targets), "format": fmt, "activation": activation, **w})
    return {"schemes": schemes, "ignore": list(qc.get("ignore") or [])}


def _activation(a, what: str) -> str:
    """The engine's activation mode for a scheme's input_activations: none -> float16; dynamic per-token symmetric
    8-bit -> int8_per_token / fp8_per_token, which lowbit computes at run time as vLLM's kernels do
    (s = max|x| / 127 for int8, max|x| / 448 for e4m3, per token). Anything else has no lowbit equivalent."""
    if not a:
        return "float16"
    dynamic = a.get("dynamic") in (True, "true")
    if (a.get("num_bits"), a.get("strategy"), dynamic, a.get("symmetric", True)) != (8, "token", True, True) or \
            a.get("type") not in ("int", "float"):
        raise CheckpointFormatError(f"{what} = {a!r}: lowbit quantizes activations dynamically per token, "
                                    "symmetric, 8-bit (int or fp8); static or other activation schemes have no "
                                    "lowbit equivalent")
    return "int8_per_token" if a["type"] == "int" else "fp8_per_token"


def scheme_for(module: str, opts: dict, where: str) -> dict | None:
    if any(_matches(module, t) for t in opts["ignore"]):
        return None
    for s in opts["schemes"]:
        if any(_matches(module, t) for t in s["targets"]):
            return s
    return None


def read_linear(raw, module: str, config, scheme: dict, where: str) -> QuantFields:
    n, k = linear_shape(config, module)
    what = f"{where}: {module} ({scheme['name']})"
    bits, kind, strategy = scheme["num_bits"], scheme["type"], scheme["strategy"]
    if strategy not in ("group", "channel", "tensor"):
        raise CheckpointFormatError(f"{what}: weights.strategy = {strategy!r}: lowbit has exact forms for group, "
                                    "channel and tensor strategies only")
    f = _read_weight(raw, module, n, k, scheme, what, bits, kind, strategy)
    f.extra["activation"] = scheme["activation"]
    return f


def _read_weight(raw, module, n, k, scheme, what, bits, kind, strategy) -> QuantFields:
    if kind == "float":
        if scheme["format"] != FLOAT or bits != 8:
            raise CheckpointFormatError(f"{what}: float weights of {bits} bits in format {scheme['format']!r}: "
                                        "lowbit reads float-quantized fp8 (e4m3)")
        return _e4m3(raw, module, n, k, strategy, what)
    if kind != "int":
        raise CheckpointFormatError(f"{what}: weights.type = {kind!r}, expected 'int' or 'float'")
    if bits == 4:
        if scheme["format"] != PACKED:
            raise CheckpointFormatError(f"{what}: int4 weights in format {scheme['format']!r}, expected {PACKED!r}")
        return _w4(raw, module, n, k, scheme, what)
    if bits == 8:
        return _w8(raw, module, n, k, scheme, what)
    raise CheckpointFormatError(f"{what}: weights.num_bits = {bits}: lowbit has exact int formats for 4 and 8 bits")


def _check_shape(raw, module, n, k, what):
    import torch
    name = module + ".weight_shape"
    if name in raw:
        shape = raw.pop(name, what).to(torch.int64).tolist()
        if shape != [n, k]:
            raise CheckpointFormatError(f"{what}: {name} = {shape}, expected [{n}, {k}] from config.json")


def _scale(raw, module, n, groups, strategy, what):
    """weight_scale as [n, groups] (tensor strategy: one value repeated, which is exact)."""
    import torch
    name = module + ".weight_scale"
    s = raw.pop(name, what, (torch.float16, torch.bfloat16, torch.float32))
    want = {"group": (n, groups), "channel": (n, 1), "tensor": (1,)}[strategy]
    if tuple(s.shape) != want and not (strategy == "tensor" and s.numel() == 1):
        raise CheckpointFormatError(f"{what}: tensor {name!r} has shape {list(s.shape)}, "
                                    f"expected {list(want)} for strategy {strategy!r}")
    return s.reshape(-1, 1).expand(n, 1) if strategy == "tensor" else s


def _w4(raw, module, n, k, scheme, what):
    import torch
    strategy = scheme["strategy"]
    file_group = scheme.get("group_size") if strategy == "group" else k
    if strategy == "group" and (not isinstance(file_group, int) or file_group <= 0):
        raise CheckpointFormatError(f"{what}: weights.group_size = {file_group!r} for strategy 'group'")
    groups = -(-k // file_group)
    group = lowbit_group(file_group, k, what)  # an unrepresentable group fails before the tensors
    _check_shape(raw, module, n, k, what)
    packed = raw.pop(module + ".weight_packed", what, (torch.int32,), (n, -(-k // 8)))
    q = unpack_int32(packed, 4, k)                                       # [n, k], stored as q + 8
    scales = _scale(raw, module, n, groups, strategy, what)
    if scheme.get("symmetric", True):
        zeros = None
        if module + ".weight_zero_point" in raw:  # some writers keep an all-zero tensor
            zp = raw.pop(module + ".weight_zero_point", what)
            if zp.dtype == torch.int32 and tuple(zp.shape) == (-(-n // 8), groups):
                zp = torch.from_numpy(unpack_int32(zp.T.contiguous(), 4, n).T.astype(np.int32) - 8)
            if bool((zp != 0).any()):
                raise CheckpointFormatError(f"{what}: weights.symmetric is true but weight_zero_point is not zero")
    else:
        if strategy == "tensor":
            raise CheckpointFormatError(f"{what}: asymmetric tensor-strategy zero points are not packed by "
                                        "compressed-tensors' pack-quantized format; lowbit does not read them")
        zp = raw.pop(module + ".weight_zero_point", what, (torch.int32,), (-(-n // 8), groups))
        zeros = unpack_int32(zp.T.contiguous(), 4, n).T.astype(np.int32)  # [n, G], stored as zero + 8
    perm = None
    if module + ".weight_g_idx" in raw:
        perm = perm_from_g_idx(raw.pop(module + ".weight_g_idx", what), file_group, k, what)
        if perm is not None:
            q = q[:, perm]
    f = w4_fields(what, q, scales, zeros, file_group, group)
    if perm is not None:
        f.extra["input_perm"] = perm.astype(np.int64)
    return f


def _w8(raw, module, n, k, scheme, what):
    import torch
    strategy = scheme["strategy"]
    file_group = group = 0
    if strategy == "group":  # llm-compressor's W8A16 preset: int8 in groups of 128 -> grouped w8 (as GGUF Q8_0)
        file_group = scheme.get("group_size")
        if not isinstance(file_group, int) or file_group <= 0:
            raise CheckpointFormatError(f"{what}: weights.group_size = {file_group!r} for strategy 'group'")
        if scheme["activation"] != "float16":
            raise CheckpointFormatError(f"{what}: int8 weights in groups of {file_group} with {scheme['activation']} "
                                        "activations: lowbit's W8A8 takes per-channel weight scales only")
        group = lowbit_group(file_group, k, what) if file_group < k else 0  # one group per row = per channel
    if not scheme.get("symmetric", True):
        raise CheckpointFormatError(f"{what}: weights.symmetric is false for int8: lowbit's w8 has no zero point")
    _check_shape(raw, module, n, k, what)
    if scheme["format"] == PACKED:
        packed = raw.pop(module + ".weight_packed", what, (torch.int32,), (n, -(-k // 4)))
        q = (unpack_int32(packed, 8, k).astype(np.int16) - 128).astype(np.int8)
    else:
        q = raw.pop(module + ".weight", what, (torch.int8,), (n, k)).numpy()
    if module + ".weight_zero_point" in raw and bool((raw.pop(module + ".weight_zero_point", what) != 0).any()):
        raise CheckpointFormatError(f"{what}: weight_zero_point is not zero for a symmetric int8 scheme")
    f = QuantFields("w8", n, k, group=group)
    f.q = np.ascontiguousarray(q)
    if group:  # each lowbit group lies inside one file group: its scale, repeated (exact)
        scales = exact_f32(_scale(raw, module, n, -(-k // file_group), strategy, what), what + " scales")
        f.scales = np.ascontiguousarray(regroup(scales, file_group, group, k))
    else:
        scales = _scale(raw, module, n, 1, "channel" if strategy == "group" else strategy, what)
        f.scales = np.ascontiguousarray(exact_f32(scales, what + " scales")[:, 0])
    return f


def _e4m3(raw, module, n, k, strategy, what):
    import torch
    w = raw.pop(module + ".weight", what, (torch.float8_e4m3fn,), (n, k))
    if module + ".weight_zero_point" in raw and bool((raw.pop(module + ".weight_zero_point", what).float() != 0).any()):
        raise CheckpointFormatError(f"{what}: fp8 weight_zero_point is not zero (lowbit's e4m3 is symmetric)")
    f = QuantFields("e4m3", n, k)
    f.q = np.ascontiguousarray(w.view(torch.uint8).numpy())
    f.scales = np.ascontiguousarray(exact_f32(_scale(raw, module, n, 1, strategy, what), what + " scales")[:, 0])
    return f
