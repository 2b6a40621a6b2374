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
    # Quantized linears the file stores in a format lowbit can run as is (GGUF Q4_0 / Q4_1 -> w4 g32, Q8_0 -> w8
    # g32), by HF name; `tensors` holds their exact dequantized values too. model_loading.choose_stored decides
    # which are used.
    native_fields: dict = field(default_factory=dict)
    head_type: str = ""  # the GGUF type of the output layer (token_embd when tied), e.g. "Q8_0"; "" elsewhere
    head_fields: Any = None  # that layer's QuantFields when it can run as stored (Q8_0 -> w8 g32), else None
    linear_types: dict = field(default_factory=dict)  # GGUF type name -> number of linear weights stored in it
    tensor_types: dict = field(default_factory=dict)  # GGUF: HF name -> the file's type name of every tensor
    # The quantized linears uploaded as they are (QuantFields by HF name; their names are not in `tensors`).
    fields: dict = field(default_factory=dict)

    def num_parameters(self) -> int:
        tied = self.config.tie_word_embeddings  # a stored lm_head then repeats the embedding's parameters
        return sum(int(t.size) for t in self.tensors.values()) + sum(
            f.n * f.k for n, f in self.fields.items() if not (tied and n == "lm_head.weight"))


@dataclass
class QuantizedCheckpoint(LoadedModel):
    """A quantized checkpoint as the model loaders return it (a lowbit directory, or an HF AWQ / GPTQ /
    compressed-tensors one): the float tensors (`tensors`) plus the quantized linears (`fields`, QuantFields by HF
    name) and the manifest; `recipe` is the one the weights were quantized for."""
    manifest: dict = field(default_factory=dict)

    @property
    def recipe(self) -> str:
        return self.manifest["recipe"]
