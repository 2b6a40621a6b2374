"""tools/bench_gpu_long_context.py's harness on the CPU: a 2-layer random Llama, two KV formats, each in its own child
process (the second with a kernel option after its recipe). The JSON must hold a case per batch with every request's
tokens timed, and the formats' bytes per token and capacities in the right order (the GPU figures come from the same
code)."""
import json
import pathlib
import subprocess
import sys

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "bench_gpu_long_context.py"


def test_long_context_tool_runs_each_format_in_its_own_process(tmp_path):
    out = tmp_path / "lc.json"
    p = subprocess.run([sys.executable, str(TOOL), str(out), "--tiny", "--context", "100", "--new", "5",
                        "--batches", "1,3", "--recipes", "w4a16,w4a16kv4+prefill_dequant_copy=off", "--recipe-timeout", "240"],
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["meta"]["context"] == 100 and d["meta"]["new_tokens"] == 5
    f16, kv4 = d["results"]
    # "recipe+key=value": the recipe with a kernel option (an A/B in one run)
    assert (f16["recipe"], kv4["recipe"]) == ("w4a16", "w4a16kv4+prefill_dequant_copy=off")
    for r in (f16, kv4):
        assert r["error"] is None, r["error"]
        assert [c["batch"] for c in r["cases"]] == [1, 3]
        for c in r["cases"]:
            assert c["decode_steps"] == 4 and c["decode_tok_s"] > 0 and c["prefill_tok_s"] > 0
        # The pool holds at least the largest timed batch at full context, in whole blocks.
        assert r["capacity_batch"] >= 3 and r["num_blocks"] * r["block_size"] >= 3 * 105
    # u4 codes plus per-token scale and zero: well under half of f16's bytes per token.
    assert kv4["kv_bytes_per_token"] < 0.5 * f16["kv_bytes_per_token"]
    assert "| w4a16kv4+prefill_dequant_copy=off |" in p.stdout
