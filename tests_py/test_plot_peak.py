"""tools/plot_peak.py: which results it draws (later files win, failed parts left out, batches sorted, the peak
marked) and that it writes a PNG from a peak JSON."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import plot_peak  # noqa: E402


def case(batch, decode, e2e, peak=False):
    return {"batch": batch, "decode_tok_s": decode, "e2e_tok_s": e2e, "peak_search": peak}


def write(path, commit, parts):
    path.write_text(json.dumps({"meta": {"device": "Test GPU", "commit": commit}, "parts": parts}))
    return str(path)


def test_series_later_files_win_failed_parts_are_left_out(tmp_path):
    a = write(tmp_path / "a.json", "aaa", [
        {"engine": "lowbit", "recipe": "w8a8kv8", "part": "lowbit:w8a8kv8", "error": None,
         "cases": [case(512, 15000.0, 7300.0, True), case(16, 2600.0, 2300.0)]},
        {"engine": "torch", "part": "torch", "error": None, "cases": [case(16, 2000.0, 1800.0)]}])
    b = write(tmp_path / "b.json", "bbb", [
        {"engine": "lowbit", "recipe": "w8a8kv8", "part": "lowbit:w8a8kv8", "error": None,
         "cases": [case(16, 2700.0, 2400.0), case(1024, 17000.0, 6500.0, True)]},
        {"engine": "lowbit", "recipe": "w4a8kv4", "part": "lowbit:w4a8kv4", "error": "KeyError: 'qoq'", "cases": []}])
    s = plot_peak.series([a, b])
    assert set(s) == {"lowbit w8a8kv8", "torch.compile f16"}
    assert s["lowbit w8a8kv8"] == {"batch": [16, 1024], "decode": [2700.0, 17000.0], "e2e": [2400.0, 6500.0],
                                   "peak": 1024, "commit": "bbb"}
    assert s["torch.compile f16"]["peak"] is None and s["torch.compile f16"]["commit"] == "aaa"


def test_main_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    a = write(tmp_path / "a.json", "aaa", [
        {"engine": "lowbit", "recipe": "w4a8kv4", "part": "lowbit:w4a8kv4", "error": None,
         "cases": [case(16, 3200.0, 2800.0), case(128, 10000.0, 6400.0), case(1024, 16800.0, 6200.0, True)]}])
    out = tmp_path / "peak.png"
    assert plot_peak.main([str(out), a]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_main_without_results_fails(tmp_path):
    a = write(tmp_path / "a.json", "aaa", [{"part": "torch", "engine": "torch", "error": "OOM", "cases": []}])
    assert plot_peak.main([str(tmp_path / "x.png"), a]) == 1
