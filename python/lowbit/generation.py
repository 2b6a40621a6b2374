"""GenerationConfig: how one request samples and when it stops, validated before it reaches the engine."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationConfig:
    """Sampling and stopping options of one request.

    temperature defaults to 0 (greedy) so that the same prompt always gives the same text; pass
    `GenerationConfig.from_model_defaults(llm)` or temperature=... for the checkpoint's sampling defaults.
    """
    max_tokens: int = 128
    min_tokens: int = 0
    temperature: float = 0.0
    top_k: int = 0              # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    stop: list[str] = field(default_factory=list)            # stop strings, matched on the detokenized text
    stop_token_ids: list[int] = field(default_factory=list)  # besides the model's EOS ids
    ignore_eos: bool = False
    logprobs: int = 0           # number of top alternatives per token (the chosen token's logprob is always kept)
    add_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        self.validate()

    def validate(self) -> None:
        def fail(name: str, expected: str) -> None:
            raise ValueError(f"GenerationConfig: {name} must be {expected}, got {getattr(self, name)!r}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError(f"GenerationConfig: {name} must be a number, got {value!r}")
        if not is_int(self.max_tokens) or self.max_tokens <= 0:
            fail("max_tokens", "a positive integer")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            fail("min_tokens", f"an integer in [0, max_tokens={self.max_tokens}]")
        if not self.temperature >= 0:
            fail("temperature", ">= 0 (0 = greedy)")
        if not math.isfinite(self.temperature):
            fail("temperature", "finite (0 = greedy)")
        if not is_int(self.top_k) or self.top_k < 0:
            fail("top_k", "an integer >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            fail("top_p", "in (0, 1]")
        if not 0 <= self.min_p <= 1:
            fail("min_p", "in [0, 1]")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            fail("repetition_penalty", "finite and > 0 (1 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                fail(name, "in [-2, 2]")
        if not is_int(self.seed) or self.seed < 0:
            fail("seed", "an integer >= 0")
        if not is_int(self.logprobs) or not 0 <= self.logprobs <= 20:
            fail("logprobs", "an integer in [0, 20]")
        if any(not isinstance(s, str) or not s for s in self.stop):
            fail("stop", "a list of non-empty strings")
        if any(t < 0 for t in self.stop_token_ids):
            fail("stop_token_ids", "a list of token ids >= 0")

    def replace(self, **overrides: Any) -> "GenerationConfig":
        """A copy with some fields changed (validated); unknown names are a TypeError naming them."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"GenerationConfig has no field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_model_defaults(cls, defaults: dict[str, Any], **overrides: Any) -> "GenerationConfig":
        """The checkpoint's sampling defaults (temperature, top_p, top_k, ...) where it ships them."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in (defaults or {}).items() if k in known}
        values.update(overrides)
        return cls(**values)


def resolve_config(config: GenerationConfig | None, overrides: dict[str, Any]) -> GenerationConfig:
    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig or None, got {type(config).__name__}")
    base = config or GenerationConfig()
    return base.replace(**overrides) if overrides else base
