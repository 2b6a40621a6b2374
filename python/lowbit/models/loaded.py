"""LoadedModel: what every loader returns, whatever the file format."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer
from .config import ModelConfig


@dataclass
class LoadedModel:
    config: ModelConfig
    # float32 arrays, HF names and layouts (`model.layers.{i}.self_attn.q_proj.weight` is [out, in]).
    tensors: dict[str, np.ndarray]
    tokenizer: Tokenizer
    chat_template: str | None
    # Sampling defaults the checkpoint ships (temperature, top_p, ...); empty when it has none.
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def num_parameters(self) -> int:
        return sum(int(t.size) for t in self.tensors.values())
