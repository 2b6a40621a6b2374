"""A tiny random Llama (2 layers, hidden 64) with a byte-level tokenizer, for tests of the algorithms."""
from __future__ import annotations

import numpy as np


def byte_tokenizer():
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    from ..tokenizer import Tokenizer
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = HFTokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, eos_token_ids=[0])


def tiny_llama(seed: int = 0, hidden: int = 64, intermediate: int = 176, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, outlier_channels: tuple[int, ...] = (3, 41)):
    """Random weights with a few large-magnitude residual channels (like real LLM outliers), never zeros.
    intermediate=176 is not a multiple of 128 or 64, so group tails are exercised."""
    from ..models.config import ModelConfig
    from ..models.loaded import LoadedModel
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    cfg = ModelConfig(arch="llama", vocab_size=256, hidden_size=hidden, intermediate_size=intermediate,
                      num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=512,
                      bos_token_id=None, eos_token_ids=[0])

    def mat(n, k, scale=None):
        return (rng.standard_normal((n, k)) * (scale or 1 / np.sqrt(k))).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(256, hidden, 1.0), "model.norm.weight": 1 + 0.1 * rng.standard_normal(hidden)}
    t["model.embed_tokens.weight"][:, list(outlier_channels)] *= 8.0
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.2 * rng.standard_normal(hidden)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.2 * rng.standard_normal(hidden)
        t[p + "input_layernorm.weight"][list(outlier_channels)] *= 4.0
        t[p + "self_attn.q_proj.weight"] = mat(heads * head_dim, hidden)
        t[p + "self_attn.k_proj.weight"] = mat(kv_heads * head_dim, hidden)
        t[p + "self_attn.v_proj.weight"] = mat(kv_heads * head_dim, hidden)
        t[p + "self_attn.o_proj.weight"] = mat(hidden, heads * head_dim)
        t[p + "mlp.gate_proj.weight"] = mat(intermediate, hidden)
        t[p + "mlp.up_proj.weight"] = mat(intermediate, hidden)
        t[p + "mlp.down_proj.weight"] = mat(hidden, intermediate)
    t = {k: np.asarray(v, dtype=np.float32) for k, v in t.items()}
    return LoadedModel(config=cfg, tensors=t, tokenizer=byte_tokenizer(), chat_template=None, source="tiny")


def random_tokens(num_sequences: int, seq_len: int, seed: int = 1):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_sequences, seq_len), generator=g)
