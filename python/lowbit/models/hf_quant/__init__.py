"""HF checkpoints with a `quantization_config` (AutoAWQ GEMM, GPTQ, compressed-tensors) -> a QuantizedCheckpoint
whose linears are lowbit QuantizedWeight fields taken from the file's integers and scales as they are (no
dequantize -> re-quantize round trip). docs/formats.md lists what maps to what and what is refused.

The engine then runs them exactly as it runs a `lowbit quantize` directory (model_loading.build_model). Linears
the file keeps in float (lm_head, usually, and any ignored module) are quantized by the engine at load, round to
nearest in the recipe's format, as for every weight-only recipe; that is logged once."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..loaded import QuantizedCheckpoint
from ..shapes import expected_shapes
from . import awq, compressed_tensors, gptq
from .common import CheckpointFormatError, RawTensors, check_shared_inputs, linear_modules

__all__ = ["CheckpointFormatError", "load_hf_quantized"]

_READERS = {"awq": awq, "gptq": gptq, "compressed-tensors": compressed_tensors}
_RECIPES = {("w4", "float16"): "w4a16", ("w8", "float16"): "w8a16", ("e4m3", "float16"): "wfp8a16",
            ("w8", "int8_per_token"): "w8a8", ("e4m3", "fp8_per_token"): "wfp8a8"}  # w4 gets g{group}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_hf_quantized(directory: Path, qc, config, files: list[Path], tokenizer, generation_defaults: dict,
                      progress: bool = True) -> QuantizedCheckpoint:
    where = f"{directory / 'config.json'}"
    if not isinstance(qc, dict):
        raise CheckpointFormatError(f"{where}: quantization_config must be an object, got {type(qc).__name__}")
    method = qc.get("quant_method")
    if method is None:
        raise CheckpointFormatError(f"{where}: quantization_config.quant_method is missing")
    method = str(method).lower()
    if method not in _READERS:
        raise CheckpointFormatError(f"{where}: quantization_config.quant_method = {qc['quant_method']!r}: lowbit "
                                    f"reads {', '.join(_READERS)} checkpoints")
    reader = _READERS[method]
    opts = reader.read_options(qc, where)
    raw = RawTensors(files)
    fields = _read_linears(raw, reader, method, opts, config, str(directory))
    floats = _float_tensors(raw, config, fields, str(directory))
    check_shared_inputs(fields, config, str(directory))
    recipe, activation = _recipe(fields, str(directory))
    weight_only = activation == "float16"
    requantized = sorted(n for n in expected_shapes(config) if n not in fields and n.endswith("proj.weight"))
    head = "lm_head.weight" if not config.tie_word_embeddings else "model.embed_tokens.weight (tied lm_head)"
    if "lm_head.weight" not in fields and progress:
        how = ("quantizes it at load (round to nearest, as for every weight-only recipe)" if weight_only else
               "keeps it in f16 with float activations (as for every activation-quantized recipe)")
        print(f"lowbit: {directory.name}: {head} is float in the checkpoint; recipe {recipe} {how}", file=sys.stderr)
    if requantized and progress:
        print(f"lowbit: {directory.name}: {len(requantized)} decoder linear(s) are float in the checkpoint "
              f"(e.g. {requantized[0]}); recipe {recipe} quantizes them at load (round to nearest)", file=sys.stderr)
    manifest = {
        "recipe": recipe, "algorithm": f"{method} checkpoint", "checkpoint_format": method,
        "quantization_config": qc, "kv": {"mode": "token", "k_bits": 16, "v_bits": 16},
        "requantized_at_load": requantized + ([] if "lm_head.weight" in fields or not weight_only else ["lm_head.weight"]),
        "weights": {n: {"format": f.format, "n": f.n, "k": f.k, "group": f.group, "symmetric": f.symmetric,
                        "input_perm": "input_perm" in f.extra} for n, f in fields.items()},
    }
    return QuantizedCheckpoint(config=config, tensors=floats, tokenizer=tokenizer, chat_template=tokenizer.chat_template,
                               generation_defaults=generation_defaults, source=str(directory), fields=fields,
                               manifest=manifest)


def _read_linears(raw, reader, method, opts, config, source):
    """Every linear the checkpoint stores quantized, as QuantFields by weight name."""
    fields = {}
    for module in linear_modules(config):
        if method == "compressed-tensors":
            scheme = compressed_tensors.scheme_for(module, opts, source)
            stored = [s for s in ("weight_packed", "weight_scale") if f"{module}.{s}" in raw]
            if scheme is None:
                if stored:
                    raise CheckpointFormatError(f"{source}: {module} has {module}.{stored[0]} but no "
                                                "quantization_config.config_groups target matches it (or it is ignored)")
                continue
            if not stored:
                raise CheckpointFormatError(f"{source}: {module} is a target of {scheme['name']} but the checkpoint "
                                            f"has no {module}.weight_packed / weight_scale")
            fields[module + ".weight"] = reader.read_linear(raw, module, config, scheme, source)
        elif module + ".qweight" in raw:
            fields[module + ".weight"] = reader.read_linear(raw, module, config, opts, source)
    return fields


def _float_tensors(raw, config, fields, source) -> dict[str, np.ndarray]:
    """The rest of the checkpoint: embeddings, norms, biases and float linears, as f32, all present and shaped
    as the config says; anything left over is an error (a quantization tensor of a module lowbit did not read)."""
    import torch
    want = {n: s for n, s in expected_shapes(config).items() if n not in fields}
    out = {}
    for name in list(raw.tensors):
        if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        if name not in want:
            raise CheckpointFormatError(f"{source}: unexpected {raw.where(name)} (shape {list(raw.tensors[name].shape)}, "
                                        f"{raw.tensors[name].dtype}): not a tensor of this {config.arch} config nor one "
                                        "lowbit's reader consumed")
        t = raw.pop(name, source, (torch.float32, torch.float16, torch.bfloat16), want[name])
        out[name] = t.float().numpy()
    missing = sorted(set(want) - set(out))
    if missing:
        raise CheckpointFormatError(f"{source}: missing tensors {', '.join(missing[:5])}"
                                    f"{' (and more)' if len(missing) > 5 else ''}")
    return out


def _recipe(fields, source) -> tuple[str, str]:
    """(the recipe the fields run as, the engine's activation mode)."""
    kinds = {(f.format, f.group, f.extra.get("activation", "float16")) for f in fields.values()}
    if not kinds:
        raise CheckpointFormatError(f"{source}: quantization_config is set but no linear is stored quantized")
    if len(kinds) > 1:
        raise CheckpointFormatError(f"{source}: the checkpoint mixes weight formats / activation schemes "
                                    f"{sorted(kinds)}; lowbit runs one of each (and one group size) per model")
    fmt, group, activation = kinds.pop()
    if (fmt, activation) not in _RECIPES:
        raise CheckpointFormatError(f"{source}: {fmt} weights with {activation} activations: lowbit's recipes pair "
                                    "w8 with int8 and e4m3 with fp8 per-token activations (w4 runs with float ones)")
    recipe = _RECIPES[fmt, activation]
    if activation != "float16" and "lm_head.weight" in fields:
        raise CheckpointFormatError(f"{source}: lm_head is quantized together with activations; lowbit keeps lm_head "
                                    f"in float (f16) with float activations under {recipe}")
    return (f"{recipe}g{group}" if fmt == "w4" or (fmt == "w8" and group) else recipe), activation
