"""A config.json-only model directory for `--load-format random` tests: tiny, but every size a multiple of 64 /
128, so the GPU's kernels take it too."""
import json

TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024, "hidden_size": 128,
               "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 64, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 1024,
               "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}


def write_config(directory, **changes) -> str:
    """directory/config.json (TINY_CONFIG with `changes`); returns the directory as a string."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**TINY_CONFIG, **changes}))
    return str(directory)
