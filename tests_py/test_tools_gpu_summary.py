"""tools/gpu_summary.py (the table a GPU run ends with) on a hand-made output folder: targets are judged
from the benchmark figures, sanitizer logs by their summary lines, missing files are skipped."""
import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gpu_summary.py"


def run(folder):
    return subprocess.run([sys.executable, str(TOOL), str(folder)], capture_output=True, text=True, check=True).stdout


def row(text, start):
    lines = [ln for ln in text.splitlines() if ln.startswith(start)]
    assert len(lines) == 1, text
    return [c.strip() for c in lines[0].split("|")]


def test_targets_hit_and_miss(tmp_path):
    gemm = [{"shape": s, "m": m, "speedup_vs_cublas": x, "w8a8_speedup_vs_cublas": y}
            for s, m, x, y in [("gate_up", 1, 2.9, 1.7), ("down", 1, 2.6, 1.2), ("gate_up", 16, 2.1, 1.8),
                               ("down", 16, 2.7, 1.2), ("gate_up", 256, 0.4, 1.45), ("down", 1024, 0.4, 1.3)]]
    (tmp_path / "bench_gemm.json").write_text(json.dumps({"gemm": gemm}))
    attn = [{"batch": 64, "seq_len": 8192, "speedup_u8_vs_sdpa": 1.59, "speedup_u4_vs_sdpa": 2.7},
            {"batch": 1, "seq_len": 8192, "speedup_u8_vs_sdpa": 9.0, "speedup_u4_vs_sdpa": 9.0}]
    (tmp_path / "bench_attention.json").write_text(json.dumps({"attention": attn}))
    floor = [{"engine": "lowbit", "recipe": "w4a16kv8", "measured_decode_tok_s": 330.0, "fraction_of_floor": 0.55},
             {"engine": "torch_compile", "recipe": "f16", "measured_decode_tok_s": 150.0, "fraction_of_floor": 0.9}]
    (tmp_path / "llama8b.json").write_text(json.dumps({"floor": floor}))
    (tmp_path / "pytest.log").write_text("....\n12 passed, 3 skipped in 4.0s\n")
    (tmp_path / "memcheck_a.log").write_text("...\n5 passed, 40 deselected in 9.1s\n========= ERROR SUMMARY: 0 errors\n")
    (tmp_path / "racecheck_b.log").write_text("3 passed in 2.0s\n"
                                              "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n")
    (tmp_path / "synccheck_c.log").write_text("1 failed, 2 passed in 2.0s\n========= ERROR SUMMARY: 0 errors\n")
    (tmp_path / "synccheck_d.log").write_text("no tests ran, 40 deselected in 1.0s\n========= ERROR SUMMARY: 0 errors\n")
    (tmp_path / "memcheck_e.log").write_text("collected 40 items\n")  # killed by its timeout
    out = run(tmp_path)
    assert row(out, "W4A16 M=1 ")[1:] == ["2.90x / 2.60x", "hit"]
    assert row(out, "W4A16 M=16 ")[1:] == ["2.10x / 2.70x", "miss"]  # the worse of the two decides
    assert row(out, "W8A8")[1:] == ["1.30x .. 1.45x", "miss"]  # only M >= 256 counts
    assert row(out, "kv8 decode")[1:] == ["1.59x", "miss"]
    assert row(out, "kv4 decode")[1:] == ["2.70x", "hit"]
    assert row(out, "8B w4a16kv8 batch-1 decode >=")[1:] == ["330.0 tok/s = 55%", "hit"]
    assert row(out, "8B w4a16kv8 batch-1 decode faster")[1:] == ["2.20x", "hit"]
    assert row(out, "GPU tests")[1].startswith("12 passed, 3 skipped")
    assert row(out, "compute-sanitizer memcheck_a")[1] == "0 findings (5 tests)"
    assert row(out, "compute-sanitizer racecheck_b")[1] == "2 findings (3 tests)"
    assert row(out, "compute-sanitizer synccheck_c")[1] == "0 findings, tests failed"
    assert row(out, "compute-sanitizer synccheck_d")[1] == "0 findings, no test passed"
    assert row(out, "compute-sanitizer memcheck_e")[1] == "not finished"
    assert row(out, "compute-sanitizer, all runs")[1] == "2 findings in 5 runs, 1 not finished"


def test_empty_folder_says_nothing_ran(tmp_path):
    assert "(no benchmark results in this run)" in run(tmp_path)


def test_serving_rows(tmp_path):
    rate = {"ttft": {"p99_ms": 812.4}, "tpot": {"p99_ms": 31.26}}
    report = {"throughput_ratio": 0.934, "errors": 0, "prefix": {"ttft_median_ratio": 4.2},
              "rates": [{**rate, "request_rate": 2.0}, {**rate, "request_rate": 32.0}]}
    (tmp_path / "bench_gpu_serving.json").write_text(json.dumps(report))
    (tmp_path / "pytest_serve.log").write_text("40 passed, 2 skipped in 99.0s\n")
    out = run(tmp_path)
    assert row(out, "8B serve saturation")[1:] == ["93% (0 errors)", "hit"]
    assert row(out, "8B shared-prefix TTFT")[1:] == ["4.2x", "miss"]
    assert row(out, "8B serve TTFT / TPOT P99 at 2.0 req/s")[1:] == ["812 / 31.3 ms", "reported"]
    assert row(out, "8B serve TTFT / TPOT P99 at 32.0 req/s")[1:] == ["812 / 31.3 ms", "reported"]
    assert row(out, "serve tests")[1].startswith("40 passed, 2 skipped")


def test_files_step_groups_in_order(tmp_path):
    (tmp_path / "pytest_files_10.log").write_text("....\n7 passed in 3.0s\n")
    (tmp_path / "pytest_files_2.log").write_text("....F\n1 failed, 4 passed in 2.0s\n")
    (tmp_path / "pytest_files_1.log").write_text("........")  # cut by its time cap: no summary line
    out = run(tmp_path)
    assert row(out, "test files, group 1 ")[1] == "not finished (time cap)"
    assert row(out, "test files, group 2 ")[1] == "1 failed, 4 passed in 2.0s"
    assert row(out, "test files, group 10 ")[1] == "7 passed in 3.0s"
    groups = [ln.split("|")[0].strip() for ln in out.splitlines() if ln.startswith("test files, group")]
    assert groups == ["test files, group 1", "test files, group 2", "test files, group 10"]


def test_w4a8_persistent_rows(tmp_path):
    gemm = [{"shape": "qkv", "m": 1024, "torch_scaled_mm_fp8_us": 41.0, "w4a8_sm90_us": 50.5, "w4a8_sm90p:256_us": 45.0,
             "w4a8_sm90p:128_us": 43.0},
            {"shape": "gate_up", "m": 1024, "torch_scaled_mm_fp8_us": 190.0, "w4a8_sm90p:256_us": 180.0},
            {"shape": "o", "m": 256, "torch_scaled_mm_fp8_us": 20.0, "w4a8_sm90p_us": 20.5,
             "w4a8_sm90p:128_error": "x"}]
    (tmp_path / "bench_w4a8_persistent.json").write_text(json.dumps({"gemm": gemm}))
    (tmp_path / "pytest_persist.log").write_text("60 passed in 40.0s\n")
    out = run(tmp_path)
    assert row(out, "W4A8 sm90p M=1024")[1:] == ["0.95x (qkv)", "hit"]  # 41 / 43, the faster sm90p column
    assert row(out, "W4A8 sm90p M=256")[1:] == ["0.98x (o)", "hit"]
    assert row(out, "W4A8 persistent tile loop tests")[1].startswith("60 passed")
