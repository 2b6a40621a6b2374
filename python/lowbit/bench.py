"""Prefill and decode throughput of one request (used by `lowbit bench` and tools/bench_cpu.py)."""
from __future__ import annotations

import statistics
import time

import numpy as np


def bench_prompt(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    """Random token ids (the cost does not depend on the values); ids below 256 avoided (special/byte tokens)."""
    return np.random.default_rng(seed).integers(256, vocab_size, n).tolist()


def run_bench(llm, prompt_tokens: int = 512, new_tokens: int = 128, repeats: int = 1) -> dict[str, float]:
    """prefill tok/s = prompt tokens / time to first token; decode tok/s = (new - 1) / time after the first token;
    each the median over `repeats` runs after a warm-up."""
    from .generation import GenerationConfig
    ids = bench_prompt(llm.config.vocab_size, prompt_tokens)
    cfg = GenerationConfig(max_tokens=new_tokens, ignore_eos=True)
    llm.generate([ids[:16]], cfg.replace(max_tokens=4))  # warm-up: thread pool, first allocations
    prefill, decode = [], []
    for r in range(repeats):
        start = time.perf_counter()
        out = llm.generate([ids], cfg)[0]
        end = time.perf_counter()
        t = out.timings
        prefill.append(prompt_tokens / t.ttft_s)
        decode.append(t.decode_tokens_per_s)
        if out.num_tokens != new_tokens:
            raise RuntimeError(f"bench: expected {new_tokens} new tokens, got {out.num_tokens} ({out.finish_reason})")
    return {"prefill_tok_s": statistics.median(prefill), "decode_tok_s": statistics.median(decode),
            "wall_s": end - start}
