"""OpenAI-shaped response bodies and stream chunks, built from what the engine produced."""
from __future__ import annotations

import time
from typing import Any


class Choice:
    """One choice's accumulated output (non-streaming responses and stream bookkeeping)."""

    def __init__(self) -> None:
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.finish_reason: str | None = None

    def add(self, u) -> None:
        self.text += u.text
        self.token_ids += u.token_ids
        self.logprobs += u.logprobs
        self.top_logprobs += u.top_logprobs
        if u.finish_reason is not None:
            self.finish_reason = u.finish_reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _name(tokenizer, t: int, as_id: bool) -> str:
    """A token in logprobs: its text, or "token_id:<id>" (vLLM's return_tokens_as_token_ids)."""
    return f"token_id:{t}" if as_id else tokenizer.decode([t])


def completion_logprobs(tokenizer, token_ids, logprobs, top_logprobs, want_top: bool,
                        offset: int = 0, as_ids: bool = False) -> dict[str, Any]:
    """The legacy completions format: parallel lists of tokens, their logprobs, top alternatives, text offsets
    (offsets always count the tokens' text)."""
    texts = [tokenizer.decode([t]) for t in token_ids]
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    tokens = [f"token_id:{t}" for t in token_ids] if as_ids else texts
    tops = None
    if want_top:
        tops = [{_name(tokenizer, t, as_ids): lp for t, lp in alts} for alts in top_logprobs]
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer, token_ids, logprobs, top_logprobs, as_ids: bool = False) -> dict[str, Any]:
    def entry(t: int, lp: float) -> dict[str, Any]:
        text = tokenizer.decode([t])  # bytes are the text's, also when the token is named by its id
        return {"token": _name(tokenizer, t, as_ids), "logprob": lp, "bytes": list(text.encode("utf-8"))}

    content = []
    for k, (t, lp) in enumerate(zip(token_ids, logprobs)):
        alts = top_logprobs[k] if k < len(top_logprobs) else []
        content.append({**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in alts]})
    return {"content": content}


def envelope(kind: str, request_id: str, model: str, created: int | None = None) -> dict[str, Any]:
    return {"id": request_id, "object": kind, "created": created or int(time.time()), "model": model}
