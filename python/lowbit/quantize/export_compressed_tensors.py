"""A lowbit quantized directory -> a compressed-tensors checkpoint (the layout llm-compressor writes and vLLM and
transformers read), with the same integers and scales: no re-quantization, and lowbit's own reader
(lowbit/models/hf_quant) loads it back to the same weights.

  w4    -> pack-quantized int4, strategy group (lowbit's group), weight_packed int32 [n, ceil(k/8)] holding q
           (lowbit's u4 value = compressed-tensors' signed value + 8), weight_scale f16 [n, G], and, when any
           weight is asymmetric, weight_zero_point (zero - 8, packed along dim 0); a symmetric weight among them
           gets zero point 0, the same grid
  w8    -> pack-quantized int8, strategy channel, symmetric, weight_scale f32 [n, 1]
  e4m3  -> float-quantized fp8, strategy channel, weight (float8_e4m3fn) + weight_scale f32 [n, 1]
Refused (by name): a w4 linear whose k is not a multiple of the group (compressed-tensors needs whole groups;
lowbit allows a short last one), activation-quantized recipes (the checkpoint would not say how lowbit rounds activations),
qoq/liquid weights (two-level formats compressed-tensors has no layout for) and input permutations (QoQ/FMPQ
reordering; compressed-tensors removed its g_idx "group" activation ordering). lowbit's GPTQ act-order keeps
static contiguous groups, so it exports as is. KV precision is not part of the checkpoint:
choose it when loading (recipe "w4a16g128kv8").
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

_COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
_SCHEMES = {"w4": ("int", 4, "pack-quantized"), "w8": ("int", 8, "pack-quantized"), "e4m3": ("float", 8, "float-quantized")}


class ExportError(ValueError):
    pass


def pack_int32(values: np.ndarray, bits: int) -> np.ndarray:
    """compressed-tensors' pack_to_int32 for 4 and 8 bits: unsigned values along the last axis, value i of a word
    in bits [i*bits, (i+1)*bits), the last word zero-padded -> int32 [..., ceil(m*bits/32)]."""
    per = 32 // bits
    m = values.shape[-1]
    padded = np.zeros((*values.shape[:-1], -(-m // per) * per), dtype=np.uint32)
    padded[..., :m] = values
    v = padded.reshape(*values.shape[:-1], -1, per)
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(per):
        words |= v[..., i] << np.uint32(i * bits)
    return words.view(np.int32)


def _check(fields: dict, manifest: dict, src: Path) -> str:
    from .recipes import parse_recipe
    spec = parse_recipe(manifest["recipe"])
    if spec.activation != "float16":
        raise ExportError(f"{src}: recipe {manifest['recipe']!r} quantizes activations; the compressed-tensors export "
                          "writes weight-only (a16) recipes: w4a16, w8a16, wfp8a16")
    formats = {f.format for f in fields.values()}
    if not formats or not formats <= set(_SCHEMES) or len(formats) > 1:
        raise ExportError(f"{src}: weight formats {sorted(formats)}: the compressed-tensors export writes one of "
                          f"{', '.join(_SCHEMES)}")
    ragged = sorted(n for n, f in fields.items() if f.format == "w4" and f.k % f.group)
    if ragged:
        f = fields[ragged[0]]
        raise ExportError(f"{src}: {ragged[0]} has k = {f.k} input channels, not a multiple of its group {f.group}; "
                          "compressed-tensors' group strategy needs whole groups: quantize with a group that divides "
                          "every linear's k (g32/g64)")
    permuted = sorted(n for n, f in fields.items() if "input_perm" in f.extra)
    if permuted:
        raise ExportError(f"{src}: {permuted[0]} (and {len(permuted) - 1} more) has an input permutation; "
                          "compressed-tensors no longer has a g_idx layout for it")
    return formats.pop()


def _tensors(fields: dict, fmt: str, asymmetric: bool) -> dict:
    import torch
    out = {}
    for name, f in fields.items():
        m = name[:-len(".weight")]
        if fmt == "e4m3":
            out[m + ".weight"] = torch.from_numpy(np.ascontiguousarray(f.q)).view(torch.float8_e4m3fn)
            out[m + ".weight_scale"] = torch.from_numpy(f.scales.astype(np.float32).reshape(-1, 1))
            continue
        out[m + ".weight_shape"] = torch.tensor([f.n, f.k], dtype=torch.int64)
        if fmt == "w8":
            out[m + ".weight_packed"] = torch.from_numpy(pack_int32((f.q.astype(np.int16) + 128).astype(np.uint8), 8))
            out[m + ".weight_scale"] = torch.from_numpy(f.scales.astype(np.float32).reshape(-1, 1))
            continue
        out[m + ".weight_packed"] = torch.from_numpy(pack_int32(f.q, 4))
        out[m + ".weight_scale"] = torch.from_numpy(np.ascontiguousarray(f.scales, dtype=np.float16))
        if asymmetric:
            zeros = np.full(f.scales.shape, 8, np.uint8) if f.zeros is None else f.zeros.astype(np.uint8)
            out[m + ".weight_zero_point"] = torch.from_numpy(np.ascontiguousarray(pack_int32(zeros.T, 4).T))
    return out


def quantization_config(fmt: str, group: int, asymmetric: bool, float_linears: list[str]) -> dict:
    kind, bits, layout = _SCHEMES[fmt]
    weights = {"num_bits": bits, "type": kind, "symmetric": not asymmetric,
               "strategy": "group" if fmt == "w4" else "channel", "group_size": group if fmt == "w4" else None,
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
               "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": layout, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": layout}},
            "ignore": float_linears, "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
            "global_compression_ratio": None}


def export_compressed_tensors(src: str | Path, out: str | Path) -> Path:
    """Write the lowbit quantized directory `src` as a compressed-tensors checkpoint in `out`."""
    from safetensors.torch import save_file
    import torch

    from .export import load_quantized_dir
    src, out = Path(src), Path(out)
    loaded, fields, manifest = load_quantized_dir(src)
    fmt = _check(fields, manifest, src)
    asymmetric = fmt == "w4" and any(not f.symmetric for f in fields.values())
    groups = {f.group for f in fields.values()}
    if len(groups) > 1:
        raise ExportError(f"{src}: weights use group sizes {sorted(groups)}; one compressed-tensors scheme has one")
    tensors = _tensors(fields, fmt, asymmetric)
    for name, t in loaded.tensors.items():
        tensors[name] = torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32))
    float_linears = sorted(n[:-len(".weight")] for n in loaded.tensors if n.endswith("proj.weight") or n == "lm_head.weight")
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    cfg["quantization_config"] = quantization_config(fmt, groups.pop(), asymmetric, float_linears)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    for name in _COPIED:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out
