"""The quantized checkpoint directory: write it, and read it back for the engine.

Layout (format_version 1, documented in docs/quantization.md):
  config.json          HF-style model config (tie_word_embeddings false when the transforms untied lm_head)
  model.safetensors    float32 tensors the engine reads as is (embeddings, norms, lm_head, float linears) and,
                       per quantized linear `<name>` (its HF tensor name, e.g. model.layers.0.mlp.up_proj.weight):
                       `<name>.q` (u4 formats: uint8 [n, ceil(k/2)], low nibble = even k; w8: int8 [n, k];
                       e4m3: uint8 bit patterns [n, k]), `<name>.scales`, `<name>.zeros`, `<name>.channel_scales`
                       (the QuantizedWeight fields of include/lowbit/quant/format.h, in its dtypes), and
                       `<name>.input_perm` (int64 [k]) when the engine must feed x[:, perm] to that linear.
  tokenizer.json, tokenizer_config.json, chat_template.jinja
  lowbit_quant.json    the manifest: recipe, algorithm, parameters, per-weight format/shape/group/stats, KV plan.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..models.loaded import LoadedModel, QuantizedCheckpoint  # noqa: F401  (re-exported)
from .formats import GROUPED, QuantFields, pack_u4, unpack_u4

MANIFEST = "lowbit_quant.json"
FORMAT_VERSION = 1
_FIELD_DTYPES = {  # format -> field -> numpy dtype stored
    "w8": {"q": np.int8, "scales": np.float32},
    "e4m3": {"q": np.uint8, "scales": np.float32},
    "w4": {"q": np.uint8, "scales": np.float16, "zeros": np.float16},
    "qoq": {"q": np.uint8, "scales": np.uint8, "zeros": np.uint8, "channel_scales": np.float32},
    "liquid": {"q": np.uint8, "scales": np.uint8, "zeros": np.uint8, "channel_scales": np.float32},
}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def write_quantized_dir(out: str | Path, loaded, float_tensors: dict[str, np.ndarray],
                        fields: dict[str, QuantFields], input_perms: dict[str, np.ndarray], manifest: dict) -> Path:
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for name, t in float_tensors.items():
        if name not in fields:
            tensors[name] = np.ascontiguousarray(t, dtype=np.float32)
    weights_meta = {}
    for name, f in fields.items():
        dt = _FIELD_DTYPES[f.format]
        q = pack_u4(f.q) if f.format in GROUPED else f.q
        tensors[name + ".q"] = np.ascontiguousarray(q, dtype=dt["q"])
        for field_name in ("scales", "zeros", "channel_scales"):
            v = getattr(f, field_name)
            if v is not None:
                tensors[f"{name}.{field_name}"] = np.ascontiguousarray(v, dtype=dt[field_name])
        meta = {"format": f.format, "n": f.n, "k": f.k, "group": f.group, "symmetric": f.symmetric}
        if name in input_perms:
            tensors[name + ".input_perm"] = np.ascontiguousarray(input_perms[name], dtype=np.int64)
            meta["input_perm"] = name + ".input_perm"
        meta.update(_jsonable(f.extra))
        weights_meta[name] = meta
    save_file(tensors, str(out / "model.safetensors"))
    cfg = loaded.config
    cfg_dict = cfg.to_dict()
    # An lm_head of its own (untied by a transform, or quantized as a field) is no longer tied.
    cfg_dict["tie_word_embeddings"] = (cfg.tie_word_embeddings and "lm_head.weight" not in float_tensors
                                       and "lm_head.weight" not in fields)
    from ..models.config import ModelConfig
    hf = ModelConfig.from_dict(cfg_dict).to_hf_config()
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    loaded.tokenizer.save(out)
    if loaded.chat_template:
        (out / "chat_template.jinja").write_text(loaded.chat_template, encoding="utf-8")
    full = dict(manifest, format_version=FORMAT_VERSION, model_config=cfg_dict, weights=weights_meta)
    (out / MANIFEST).write_text(json.dumps(_jsonable(full), indent=1) + "\n", encoding="utf-8")
    return out


def load_quantized_dir(path: str | Path):
    """-> (LoadedModel with the float tensors only, {name: QuantFields (q unpacked)}, manifest dict).

    `input_perm` arrays are attached as fields[name].extra["input_perm"] (np.int64 [k])."""
    from safetensors.numpy import load_file

    from ..models.config import ModelConfig
    from ..models.loaded import LoadedModel
    from ..tokenizer import Tokenizer

    path = Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise FileNotFoundError(f"load_quantized_dir: {path} has no {MANIFEST} (not a lowbit quantized directory)")
    manifest = json.loads(mf.read_text(encoding="utf-8"))
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"load_quantized_dir: {mf}: format_version {manifest.get('format_version')!r}, "
                         f"this lowbit reads {FORMAT_VERSION}")
    config = ModelConfig.from_dict(manifest["model_config"])
    raw = load_file(str(path / "model.safetensors"))
    fields: dict[str, QuantFields] = {}
    for name, meta in manifest["weights"].items():
        f = QuantFields(meta["format"], meta["n"], meta["k"], meta["group"], meta["symmetric"])
        q = raw.pop(name + ".q")
        f.q = unpack_u4(q, f.k) if f.format in GROUPED else q
        for field_name in ("scales", "zeros", "channel_scales"):
            f.__setattr__(field_name, raw.pop(f"{name}.{field_name}", None))
        if "input_perm" in meta:
            f.extra["input_perm"] = raw.pop(meta["input_perm"])
        for key in ("fmpq_block_bits",):
            if key in meta:
                f.extra[key] = np.asarray(meta[key], dtype=np.uint8)
        fields[name] = f
    floats = {k: v.astype(np.float32) for k, v in raw.items() if not k.startswith("kv.")}
    tokenizer = Tokenizer.from_dir(path, eos_token_ids=config.eos_token_ids)
    loaded = LoadedModel(config=config, tensors=floats, tokenizer=tokenizer, chat_template=tokenizer.chat_template,
                         source=str(path))
    return loaded, fields, manifest


def load_quantized_checkpoint(path: str | Path) -> QuantizedCheckpoint:
    loaded, fields, manifest = load_quantized_dir(path)
    return QuantizedCheckpoint(config=loaded.config, tensors=loaded.tensors, tokenizer=loaded.tokenizer,
                               chat_template=loaded.chat_template, source=loaded.source, fields=fields,
                               manifest=manifest)
