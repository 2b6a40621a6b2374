"""Perplexity with the engine's full-sequence logits: non-overlapping windows, each scored from its own start."""
from __future__ import annotations

import numpy as np


def window_nll(logits: np.ndarray, ids: list[int]) -> tuple[float, int]:
    """Sum of -log p(ids[t+1] | ids[..t]) over the window (float64 log-softmax), and the count of predictions."""
    x = logits[:-1].astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(x).sum(axis=1))
    targets = np.asarray(ids[1:], dtype=np.int64)
    return float((log_norm - x[np.arange(len(targets)), targets]).sum()), len(targets)


def perplexity_of_ids(logits_fn, ids: list[int], window: int = 1024) -> float:
    if not isinstance(window, int) or window < 2:
        raise ValueError(f"perplexity: window must be an integer >= 2, got {window!r}")
    if len(ids) < 2:
        raise ValueError(f"perplexity: need at least 2 tokens, got {len(ids)}")
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            break
        nll, n = window_nll(logits_fn(chunk), chunk)
        total, count = total + nll, count + n
    return float(np.exp(total / count))


def perplexity(llm, text: str, window: int = 1024, max_tokens: int = 4096) -> float:
    """Text is encoded without special tokens and cut to max_tokens (the convention of the reference numbers)."""
    if not isinstance(max_tokens, int) or max_tokens < 2:
        raise ValueError(f"perplexity: max_tokens must be an integer >= 2, got {max_tokens!r}")
    if window > llm.config.max_position_embeddings:
        raise ValueError(f"perplexity: window {window} exceeds the model's context "
                         f"({llm.config.max_position_embeddings} tokens)")
    ids = llm.tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
    return perplexity_of_ids(llm.logits, ids, window)
