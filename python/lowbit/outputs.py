"""What a finished request hands back."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Timings:
    ttft_s: float            # request submitted -> first token
    total_s: float           # request submitted -> finished
    decode_tokens_per_s: float  # tokens after the first / time after the first token (0 for one token)


@dataclass
class RequestOutput:
    prompt: str | None            # None when the prompt was given as token ids
    text: str                     # generated text (stop string and EOS not included)
    token_ids: list[int]          # generated tokens (a final EOS / stop token included)
    finish_reason: str            # "stop" (EOS, stop token or stop string) | "length" | "abort"
    prompt_token_count: int
    logprobs: list[float] = field(default_factory=list)   # log-softmax of each chosen token (unmodified logits)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # when config.logprobs > 0
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it, if any
    timings: Timings | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
