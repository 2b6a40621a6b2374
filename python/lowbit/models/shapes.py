"""The tensors a Llama-family model must have, and the check every loader runs against them."""
from __future__ import annotations

from typing import Any

from .config import ModelConfig


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama-family model of this config has, with its HF shape."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
            p + "self_attn.q_proj.weight": (c.q_size, c.hidden_size),
            p + "self_attn.k_proj.weight": (c.kv_size, c.hidden_size),
            p + "self_attn.v_proj.weight": (c.kv_size, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, c.q_size),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        })
        if c.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (c.q_size,), p + "self_attn.k_proj.bias": (c.kv_size,),
                           p + "self_attn.v_proj.bias": (c.kv_size,)})
    return shapes


def check_tensors(tensors: dict[str, Any], config: ModelConfig, source: str) -> None:
    """Every expected tensor present with the right shape, nothing unexpected."""
    want = expected_shapes(config)
    missing = sorted(set(want) - set(tensors))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"{source}: missing tensors {', '.join(missing[:5])}{more}")
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise ValueError(f"{source}: unexpected tensors {', '.join(extra[:5])} for config {config.arch} "
                         f"(tie_word_embeddings={config.tie_word_embeddings}, attention_bias={config.attention_bias})")
    for name, shape in want.items():
        got = tuple(tensors[name].shape)
        if got != shape:
            raise ValueError(f"{source}: tensor {name!r} has shape {list(got)}, expected {list(shape)} from the config")
