"""Load a llama.cpp GGUF file into float32 numpy tensors with HF names and layouts.

The file is opened by lowbit.gguf_reader (shared with the tokenizer). Dequantization is gguf-py's
(`gguf.quants.dequantize`). llama.cpp stores Llama q/k rows permuted for its interleaved rope; we undo that so
every tensor matches what transformers loads from the same file.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..gguf_reader import gguf_metadata, open_gguf, read_gguf_metadata  # noqa: F401 (read_gguf_metadata: kept here)
from ..tokenizer import Tokenizer
from . import gguf_native
from .config import ConfigError, ModelConfig
from .loaded import LoadedModel
from .shapes import check_tensors

# GGUF tensor name -> HF name ({i} is the layer).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
# Consumed into the config (llama3 rope scaling), not a weight.
_ROPE_FREQS = "rope_freqs.weight"
# The linear layers' weights: the tensors a stored quant type can reach the kernels as is (gguf_native).
_LINEARS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
            "ffn_up.weight", "ffn_down.weight")

# llama.cpp general.sampling.* keys -> generation config names.
_SAMPLING_KEYS = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                  "penalty_repeat": "repetition_penalty"}


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's q/k permutation (convert_hf_to_gguf `permute`).

    llama.cpp maps HF's rotate_half layout (pairs i, i+d/2) to interleaved pairs (2i, 2i+1) with
    rows.reshape(n_head, 2, d/2).swapaxes(1, 2); the inverse reads rows as (n_head, d/2, 2) and swaps
    back. Works for weights [rows, in] and biases [rows].
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot unpermute {rows} rows into {n_head} heads of even size")
    half = rows // n_head // 2
    return np.ascontiguousarray(w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    """Per-frequency rope divisors of Llama 3.1 scaling (what llama.cpp bakes into rope_freqs)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def _rope_scaling(meta: dict, arch_key: str, rope_freqs: np.ndarray | None, theta: float, head_dim: int, path: Path):
    kind = meta.get(f"{arch_key}.rope.scaling.type")
    if kind in (None, "none") and meta.get(f"{arch_key}.rope.scale_linear"):
        return {"type": "linear", "factor": float(meta[f"{arch_key}.rope.scale_linear"])}
    if kind == "linear":
        return {"type": "linear", "factor": float(meta[f"{arch_key}.rope.scaling.factor"])}
    if kind not in (None, "none"):
        raise ConfigError(f"{path}: rope scaling {kind!r} is not supported; supported: linear, llama3")
    if rope_freqs is None:
        return None
    # llama.cpp stores llama3 scaling only as the resulting factors; recover the parameters that
    # every Llama 3.x release uses and check they reproduce the stored factors exactly.
    factor = float(rope_freqs.max())
    for low, high, orig in ((1.0, 4.0, 8192),):
        expect = _llama3_factors(theta, head_dim, factor, low, high, orig)
        if expect.shape == rope_freqs.shape and np.allclose(expect, rope_freqs, rtol=1e-5, atol=0):
            return {"type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": orig}
    raise ConfigError(f"{path}: rope_freqs.weight does not match Llama-3 rope scaling with factor {factor}; "
                      "custom rope frequency tables are not supported")


def _config_from_meta(meta: dict, tensor_names: set[str], rope_freqs, path: Path) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ConfigError(f"{path}: GGUF architecture {arch!r} is not supported; supported: llama "
                          f"(incl. SmolLM2 and Mistral, which llama.cpp writes as llama), qwen2")

    def get(key: str, default: Any = None, required: bool = True):
        full = f"{arch}.{key}"
        if full not in meta:
            if required and default is None:
                raise ConfigError(f"{path}: GGUF metadata is missing {full!r}")
            return default
        return meta[full]

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = get("attention.key_length", required=False) or get("rope.dimension_count", required=False)
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"{path}: no head dim in metadata and embedding_length {hidden} "
                              f"is not divisible by head_count {heads}")
        head_dim = hidden // heads
    vocab = get("vocab_size", required=False) or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise ConfigError(f"{path}: cannot tell the vocabulary size ({arch}.vocab_size and tokenizer tokens missing)")
    # llama.cpp writes Mistral as llama; transformers tells them apart by name, and so do we.
    name = str(meta.get("general.name", "")).lower()
    lowbit_arch = "mistral" if arch == "llama" and "mistral" in name else arch
    theta = _f32_value(get("rope.freq_base", 10000.0))
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                             "tokenizer.ggml.eom_token_id") if meta.get(k) is not None]
    return ModelConfig(
        arch=lowbit_arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(head_dim),
        rope_theta=theta,
        rope_scaling=_rope_scaling(meta, arch, rope_freqs, theta, int(head_dim), path),
        rms_norm_eps=_f32_value(get("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        max_position_embeddings=int(get("context_length", 4096)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=list(dict.fromkeys(eos)),
    )


def _f32_value(x: float) -> float:
    """GGUF stores floats as float32 (1e-5 reads back as 9.9999997e-06); keep the shortest decimal the file means."""
    return float(str(np.float32(x)))


def _hf_name(gguf_name: str, num_layers: int, path: Path) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES and int(m.group(1)) < num_layers:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise ValueError(f"{path}: unexpected tensor {gguf_name!r} (not part of a Llama/Qwen2 model)")


def _type_name(t) -> str:
    import gguf
    return gguf.GGMLQuantizationType(t.tensor_type).name


def _dequantize(t, path: Path) -> np.ndarray:
    import gguf
    from gguf.constants import GGML_QUANT_SIZES

    qtype = gguf.GGMLQuantizationType(t.tensor_type)
    if qtype not in GGML_QUANT_SIZES:
        raise NotImplementedError(f"{path}: tensor {t.name!r} has unknown type {qtype.name}")
    try:
        out = gguf.quants.dequantize(t.data, qtype)
    except NotImplementedError as e:
        raise NotImplementedError(f"{path}: tensor {t.name!r} has type {qtype.name}, which gguf-py cannot "
                                  f"dequantize ({e})") from e
    # GGUF lists dims fastest-first; numpy (and HF) want them slowest-first.
    shape = tuple(int(d) for d in reversed(t.shape))
    return np.ascontiguousarray(out, dtype=np.float32).reshape(shape)


def load_gguf(path: str | Path, progress: bool = True) -> LoadedModel:
    """Read a GGUF checkpoint: config, float32 HF-layout tensors, tokenizer, chat template."""
    path = Path(path)
    reader = open_gguf(path)
    meta = gguf_metadata(reader)
    by_name = {t.name: t for t in reader.tensors}
    rope_freqs = _dequantize(by_name[_ROPE_FREQS], path).astype(np.float64) if _ROPE_FREQS in by_name else None
    config = _config_from_meta(meta, set(by_name), rope_freqs, path)
    tokenizer = Tokenizer.from_gguf_metadata(meta, source=str(path))
    if tokenizer.vocab_size > config.vocab_size:  # fewer is fine: padded embedding rows
        raise ValueError(f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the model vocab_size "
                         f"is {config.vocab_size}")

    # llama.cpp permutes q/k only for archs it ropes in interleaved (GPT-J) style, i.e. llama.
    permuted = meta["general.architecture"] == "llama"
    names = [n for n in by_name if n != _ROPE_FREQS]
    tensors: dict[str, np.ndarray] = {}
    native: dict = {}
    linear_types: dict[str, int] = {}
    tensor_types: dict[str, str] = {}  # HF name -> GGUF type, for the load note and `lowbit info`
    step = max(1, len(names) // 10)
    for k, gguf_name in enumerate(names):
        hf = _hf_name(gguf_name, config.num_layers, path)
        w = _dequantize(by_name[gguf_name], path)
        tensor_types[hf] = _type_name(by_name[gguf_name])
        fields = None
        if gguf_name.endswith(_LINEARS):
            kind = _type_name(by_name[gguf_name])
            linear_types[kind] = linear_types.get(kind, 0) + 1
            fields = gguf_native.native_fields(by_name[gguf_name], path)
        heads = None
        if permuted and ".attn_q." in gguf_name:
            heads = config.num_heads
        elif permuted and ".attn_k." in gguf_name:
            heads = config.num_kv_heads
        if heads is not None:
            w = unpermute_rope_rows(w, heads)
            if fields is not None:
                fields = gguf_native.permute_rows(fields, lambda a, h=heads: unpermute_rope_rows(a, h))
        tensors[hf] = w
        if fields is not None:
            native[hf] = fields
        if progress and ((k + 1) % step == 0 or k + 1 == len(names)):
            print(f"\rlowbit: loading {path.name}: {k + 1}/{len(names)} tensors", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)

    check_tensors(tensors, config, str(path))
    head_name = "output.weight" if "output.weight" in by_name else "token_embd.weight"
    head_fields = gguf_native.native_fields(by_name[head_name], path)  # a Q8_0 output layer can run as stored
    if head_fields is not None and head_fields.format != "w8":
        head_fields = None  # lm_head takes float or w8 weights (a Q4 output layer is re-quantized to w8)
    gen = {v: meta[f"general.sampling.{k}"] for k, v in _SAMPLING_KEYS.items() if f"general.sampling.{k}" in meta}
    return LoadedModel(config=config, tensors=tensors, tokenizer=tokenizer,
                       chat_template=tokenizer.chat_template, generation_defaults=gen, source=str(path),
                       native_fields=native, linear_types=linear_types, head_type=_type_name(by_name[head_name]),
                       head_fields=head_fields, tensor_types=tensor_types)
