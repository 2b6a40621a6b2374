"""tools/bench_gpu_serving.py end to end on the CPU, with a tiny random-weight config and small counts, so that the
GPU run (Llama-3-8B shape, tools/gpu_run.sh serve) cannot fail for a reason the CPU could have shown: the offline
child, both server launches, every rate, the shared-prefix scenario and the JSON it writes. And the 8B config it
writes for that run is Llama-3-8B (parameter count), read without drawing a weight."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client", "httpx", "torch"):
    pytest.importorskip(_module, reason="the serve extras, httpx and torch: pip install 'lowbit[serve]' httpx torch")

from tiny_random_model import write_config  # noqa: E402

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench_gpu_serving.py"


def test_cpu_run_writes_a_sane_report(tmp_path):
    model = write_config(tmp_path / "tiny")
    out = tmp_path / "out" / "serving.json"
    cmd = [sys.executable, str(TOOL), "--model", model, "--recipe", "w4a8kv4", "--device", "cpu",
           "--input-len", "64", "--output-len", "12", "--num-requests", "12", "--rates", "8,32", "--rate-requests", "6",
           "--prefix-len", "256", "--prefix-suffix-len", "16", "--prefix-output-len", "4", "--prefix-requests", "10",
           "--max-seqs", "8", "--warmup", "2", "--out", str(out)]
    env = {**os.environ, "LOWBIT_COMMIT": "test"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "server saturation / offline output throughput" in proc.stdout
    r = json.loads(out.read_text())
    assert r["benchmark"] == "gpu_serving" and r["complete"] and r["commit"] == "test"
    assert r["device"].startswith("cpu")
    assert r["date"] and r["host"]["python"]
    p = r["parameters"]
    assert (p["recipe"], p["device"], p["input_len"], p["output_len"], p["rates"]) == ("w4a8kv4", "cpu", 64, 12, "8,32")
    off = r["offline"]
    assert off["num_requests"] == 12 and off["total_output_tokens"] == 12 * 12 and off["output_throughput"] > 0
    assert r["errors"] == 0
    runs = [r["saturation"], *r["rates"], r["prefix"]["caching_on"], r["prefix"]["caching_off"]]
    assert [x["num_requests"] for x in runs] == [12, 6, 6, 10, 10]
    assert [x["request_rate"] for x in r["rates"]] == [8.0, 32.0] and r["saturation"]["request_rate"] == "inf"
    for x in runs:
        assert x["errors"] == 0 and x["completed"] == x["num_requests"] and x["output_throughput"] > 0
        for metric in ("ttft", "tpot", "itl"):  # (gaps between chunks read from one buffer may be ~0)
            assert 0 <= x[metric]["p50_ms"] <= x[metric]["p90_ms"] <= x[metric]["p99_ms"], (metric, x[metric])
        assert x["ttft"]["p50_ms"] > 0 and x["tpot"]["p50_ms"] > 0
        assert "requests" not in x  # percentiles only
    assert r["saturation"]["total_output_tokens"] == 12 * 12
    assert r["prefix"]["caching_on"]["total_input_tokens"] == 10 * (256 + 16)
    assert r["throughput_ratio"] == pytest.approx(r["saturation"]["output_throughput"] / off["output_throughput"])
    ratio = r["prefix"]["caching_off"]["ttft"]["median_ms"] / r["prefix"]["caching_on"]["ttft"]["median_ms"]
    assert r["prefix"]["ttft_median_ratio"] == pytest.approx(ratio) and ratio > 0
    assert set(r["targets"]) == {"server_ge_90pct_offline", "prefix_ttft_ge_5x"}
    t = r["timings_s"]
    assert t["total"] >= t["offline"] + t["server_caching_on"] + t["server_caching_off"] > 0
    cpu = r["saturation_cpu"]  # where the saturation run's CPU went: the server's threads and the client
    assert cpu["client_procs"] == 1 and cpu["client_s"] > 0
    if sys.platform.startswith("linux"):
        names = {x["name"] for x in cpu["server_threads"]}
        assert sum(x["main"] for x in cpu["server_threads"]) <= 1 and "lowbit-step" in names
        assert all(x["cpu_s"] >= 0 for x in cpu["server_threads"])
        assert "saturation CPU seconds: server threads" in proc.stdout


def test_saturation_only_from_two_client_processes(tmp_path):
    """--prefix-requests 0: offline and saturation only (no second server); --client-procs 2 sends the saturation run
    from two processes, and the report is complete."""
    model = write_config(tmp_path / "tiny")
    out = tmp_path / "sat.json"
    cmd = [sys.executable, str(TOOL), "--model", model, "--recipe", "w16a16", "--device", "cpu", "--input-len", "32",
           "--output-len", "8", "--num-requests", "10", "--rates", "", "--prefix-requests", "0", "--client-procs", "2",
           "--max-seqs", "8", "--warmup", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "LOWBIT_COMMIT": "t"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["complete"] and r["errors"] == 0 and r["rates"] == []
    assert r["prefix"] == {"caching_on": None, "caching_off": None, "ttft_median_ratio": None}
    assert "server_caching_off" not in r["timings_s"]
    sat = r["saturation"]
    assert sat["completed"] == 10 and sat["total_output_tokens"] == 10 * 8
    assert r["saturation_cpu"]["client_procs"] == 2 and r["saturation_cpu"]["client_s"] > 0


def test_llama3_8b_config_is_llama3_8b(tmp_path):
    import lowbit
    from lowbit.models.random_weights import RandomModel
    subprocess.run([sys.executable, str(TOOL), "--model", str(tmp_path), "--write-llama3-8b-config"], check=True,
                   capture_output=True)
    loaded = lowbit.models.load_model_source(tmp_path, progress=False, load_format="random")  # draws nothing yet
    assert isinstance(loaded, RandomModel)
    assert loaded.num_parameters() == 8_030_261_248  # Llama-3-8B's published count
    c = loaded.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
            c.rope_theta, c.max_position_embeddings) == (128256, 4096, 14336, 32, 32, 8, 128, 500000.0, 8192)
    assert loaded.tokenizer.decode([128255]) == "<128255>"
