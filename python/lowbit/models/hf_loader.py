"""Load an HF-style model directory (config.json + safetensors + tokenizer.json) as float32 numpy."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer
from .config import ModelConfig
from .loaded import LoadedModel
from .shapes import check_tensors, expected_shapes

# Buffers some exporters save that are not weights (recomputed from the config).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_GENERATION_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "do_sample", "max_new_tokens")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid {what} JSON ({e})") from e


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no weight_map")
        files = [directory / f for f in sorted(set(weight_map.values()))]
        missing = [str(f.name) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{directory}: shards listed in {index.name} are missing: {', '.join(missing)}")
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(directory.glob("*.safetensors"))
    if found:
        return found
    raise FileNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json "
                            "(only safetensors checkpoints are supported; convert .bin files first; "
                            "--load-format random runs config.json with random weights)")


def _read_safetensors(files: list[Path], wanted: dict[str, tuple[int, ...]], progress: bool) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    try:
        import torch  # noqa: F401  bf16 has no numpy dtype: read through torch, then convert
        framework = "pt"
    except ImportError:
        framework = "numpy"
    out: dict[str, np.ndarray] = {}
    for fi, f in enumerate(files):
        try:
            handle = safe_open(str(f), framework=framework)
        except Exception as e:  # safetensors raises its own error type for bad headers
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from e
        with handle:
            for name in handle.keys():
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and "lm_head.weight" not in wanted:
                    continue  # tied checkpoints sometimes save the copy too
                if name in out:
                    raise ValueError(f"{f}: tensor {name!r} appears in more than one shard")
                # Check the shape from the header before reading the data.
                shape = tuple(handle.get_slice(name).get_shape())
                if name in wanted and shape != wanted[name]:
                    raise ValueError(f"{f}: tensor {name!r} has shape {list(shape)}, "
                                     f"expected {list(wanted[name])} from config.json")
                t = handle.get_tensor(name)
                out[name] = t.float().numpy() if framework == "pt" else _to_f32(t, name, f)
        if progress:
            print(f"\rlowbit: loading {f.parent.name}: {fi + 1}/{len(files)} files", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return out


def _to_f32(t: np.ndarray, name: str, f: Path) -> np.ndarray:
    if t.dtype.kind != "f":
        raise ValueError(f"{f}: tensor {name!r} has dtype {t.dtype}; expected a float type")
    return t.astype(np.float32)


# Producers that predate transformers' quantization_config save it beside config.json (auto-gptq's
# quantize_config.json, AutoAWQ's quant_config.json), without quant_method.
_SIDE_CONFIGS = (("quantize_config.json", "gptq"), ("quant_config.json", "awq"))


def _quantization_config(directory: Path, hf_cfg: dict[str, Any]) -> dict[str, Any] | None:
    if hf_cfg.get("quantization_config") is not None:
        return hf_cfg["quantization_config"]
    for name, method in _SIDE_CONFIGS:
        if (directory / name).is_file():
            qc = _read_json(directory / name, "quantization config")
            return {"quant_method": method, **qc} if isinstance(qc, dict) else qc
    return None


def _tokenizer(directory: Path, config: ModelConfig) -> Tokenizer:
    tokenizer = Tokenizer.from_dir(directory, eos_token_ids=config.eos_token_ids)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{directory}: tokenizer has {tokenizer.vocab_size} tokens but config.json "
                         f"vocab_size is {config.vocab_size}")
    return tokenizer


def load_hf_dir(path: str | Path, progress: bool = True) -> LoadedModel:
    """Read config.json, safetensors weights, tokenizer and generation config from an HF directory. A config with a
    `quantization_config` gives a QuantizedCheckpoint (models/hf_quant)."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory not found: {directory}")
    cfg_file = directory / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{directory}: no config.json (not an HF model directory)")
    hf_cfg = _read_json(cfg_file, "config")
    gen_file = directory / "generation_config.json"
    gen_cfg = _read_json(gen_file, "generation config") if gen_file.is_file() else {}
    # generation_config's eos list (e.g. Llama 3's eot) beats config.json's single id.
    if gen_cfg.get("eos_token_id") is not None:
        hf_cfg = dict(hf_cfg, eos_token_id=gen_cfg["eos_token_id"])
    config = ModelConfig.from_hf_config(hf_cfg)
    gen = {k: gen_cfg[k] for k in _GENERATION_KEYS if k in gen_cfg}
    qc = _quantization_config(directory, hf_cfg)
    if qc is not None:  # AWQ / GPTQ / compressed-tensors: integers kept as they are
        from .hf_quant import load_hf_quantized
        return load_hf_quantized(directory, qc, config, _weight_files(directory), _tokenizer(directory, config), gen,
                                 progress)

    tensors = _read_safetensors(_weight_files(directory), expected_shapes(config), progress)
    check_tensors(tensors, config, str(directory))
    tokenizer = _tokenizer(directory, config)
    return LoadedModel(config=config, tensors=tensors, tokenizer=tokenizer, chat_template=tokenizer.chat_template,
                       generation_defaults=gen, source=str(directory))
