"""A model's facts for `LLM.info()` and `lowbit info`: recipe, memory per weight group and per KV token, kernels."""
from __future__ import annotations

from typing import Any


def model_info(llm) -> dict[str, Any]:
    from . import _core
    core = llm.model.info()
    cfg = llm.config
    return {
        "source": llm.source,
        "arch": cfg.arch,
        "layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "context": cfg.max_position_embeddings,
        "parameters": llm.num_parameters,
        "recipe": core["recipe"], "dtype": core["dtype"], "device": core["device"],
        "parameter_bytes": dict(core["parameter_bytes"]),
        "kv_bytes_per_token": core["kv_bytes_per_token"],
        "kernels": list(core["kernels"]),
        "engine": dict(llm.engine.stats()),
        "cuda_build": bool(_core.has_cuda_build()),
        "cuda_available": bool(_core.cuda_available()),
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def format_info(info: dict[str, Any]) -> str:
    lines = [f"model       {info['source']}",
             f"arch        {info['arch']}: {info['layers']} layers, hidden {info['hidden_size']}, "
             f"{info['heads']}/{info['kv_heads']} heads x {info['head_dim']}, vocab {info['vocab_size']}, "
             f"context {info['context']}, {info['parameters'] / 1e6:.1f}M parameters",
             f"recipe      {info['recipe']} (compute {info['dtype']}, device {info['device']})",
             "weights"]
    total = 0
    for group, n in sorted(info["parameter_bytes"].items()):
        lines.append(f"  {group:<18}{_mib(n)}")
        total += n
    lines.append(f"  {'total':<18}{_mib(total)}")
    kv = info["kv_bytes_per_token"]
    eng = info["engine"]
    lines.append(f"kv cache    {kv} bytes per token; {eng['num_blocks']} blocks x {eng['block_size']} tokens "
                 f"= {_mib(kv * eng['num_blocks'] * eng['block_size'])}")
    lines.append("kernels     " + (", ".join(info["kernels"]) or "-"))
    lines.append(f"cuda        build {'yes' if info['cuda_build'] else 'no'}, "
                 f"device {'available' if info['cuda_available'] else 'not available'}")
    return "\n".join(lines)
