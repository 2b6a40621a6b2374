"""LoadedModel (float numpy tensors, HF names) -> the C++ Model: config translation and weight upload."""
from __future__ import annotations

import sys
import time

from .models import LoadedModel, ModelConfig


def core_config(cfg: ModelConfig):
    """The engine's ModelConfig from the loaders' Python one."""
    from . import _core
    c = _core.ModelConfig()
    c.arch = cfg.arch
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings"):
        setattr(c, name, int(getattr(cfg, name)))
    c.rope_theta = float(cfg.rope_theta)
    c.rms_norm_eps = float(cfg.rms_norm_eps)
    c.tie_word_embeddings = bool(cfg.tie_word_embeddings)
    c.attention_bias = bool(cfg.attention_bias)
    c.rope_neox = cfg.rope_pairing == "neox"
    scaling = cfg.rope_scaling
    c.rope_scaling_type = scaling["type"] if scaling else ""
    if scaling:
        c.rope_factor = float(scaling["factor"])
        if scaling["type"] == "llama3":
            c.rope_low_freq_factor = float(scaling["low_freq_factor"])
            c.rope_high_freq_factor = float(scaling["high_freq_factor"])
            c.rope_original_max_position = int(scaling["original_max_position_embeddings"])
    return c


def build_model(loaded: LoadedModel, recipe: str, device: str, dtype: str, progress: bool = True):
    """Upload every tensor (quantized per the recipe in C++) and finalize; progress goes to stderr."""
    from . import _core
    model = _core.Model(core_config(loaded.config), recipe, device, dtype)
    names = list(loaded.tensors)
    if loaded.config.tie_word_embeddings:
        names = [n for n in names if n != "lm_head.weight"]
    start = time.perf_counter()
    for i, name in enumerate(names, 1):
        model.set_weight(name, loaded.tensors[name])
        if progress and (i % 25 == 0 or i == len(names)):
            print(f"\rlowbit: packing weights ({recipe}, {device}) {i}/{len(names)}", end="", file=sys.stderr,
                  flush=True)
    model.finalize()
    if progress:
        print(f" done in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
    return model
