"""The short table a GPU run ends with: tests, sanitizers and the issue's benchmark targets, read from the files
tools/gpu_run.sh leaves in its output folder (missing files are reported as not run).
  python3 tools/gpu_summary.py OUT_DIR
"""
import glob
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pytest_line(path):
    """The pytest summary line ("N passed, M skipped ..."), or None."""
    try:
        with open(path) as f:
            lines = [ln.strip() for ln in f if re.search(r"\d+ (passed|failed|error)", ln)]
        return lines[-1].strip("= ") if lines else None
    except OSError:
        return None


def sanitizer_findings(text):
    """(findings, verdict) of one compute-sanitizer log: memcheck and synccheck end with "ERROR SUMMARY: N errors",
    racecheck with "RACECHECK SUMMARY: N hazards displayed"; a log with neither did not finish. Tests that failed or
    a -k expression that selected nothing make the run prove nothing, and say so."""
    m = re.search(r"ERROR SUMMARY: (\d+) error", text) or re.search(r"RACECHECK SUMMARY: (\d+) hazard", text)
    tests = [ln.strip("= ") for ln in text.splitlines()
             if "SUMMARY:" not in ln and re.search(r"\d+ (passed|failed|error|deselected)|no tests ran", ln)]
    summary = tests[-1] if tests else ""
    if m is None:
        return None, "not finished"
    findings = int(m.group(1))
    if not re.search(r"\d+ passed", summary):
        return findings, f"{findings} findings, no test passed"
    if re.search(r"\d+ (failed|error)", summary):
        return findings, f"{findings} findings, tests failed"
    passed = re.search(r"(\d+) passed", summary).group(1)
    return findings, f"{findings} findings ({passed} tests)"


def sanitizer_rows(out):
    names = sorted(f[:-4] for f in os.listdir(out) if re.match(r"(memcheck|racecheck|synccheck)_.*\.log$", f)) \
        if os.path.isdir(out) else []
    total, unfinished = 0, 0
    for name in names:
        findings, verdict = sanitizer_findings(open(os.path.join(out, name + ".log"), errors="replace").read())
        total += findings or 0
        unfinished += findings is None
        print(f"{'compute-sanitizer ' + name:58s} | {verdict:28s} |")
    if names:
        verdict = f"{total} findings in {len(names)} runs" + (f", {unfinished} not finished" if unfinished else "")
        print(f"{'compute-sanitizer, all runs':58s} | {verdict:28s} | 0 findings")


def gemm_targets(gemm):
    """(target, measured, hit) rows from bench_gpu_gemm.py's default mode."""
    rows = []
    by = {(r["shape"], r["m"]): r for r in gemm.get("gemm", [])}
    for m in (1, 16):
        got = [by.get((s, m), {}).get("speedup_vs_cublas") for s in ("gate_up", "down")]
        if all(g is not None for g in got):
            rows.append((f"W4A16 M={m} >= 2.5x cuBLAS fp16 (gate_up / down)", " / ".join(f"{g:.2f}x" for g in got),
                         min(got) >= 2.5))
    w8 = [r.get("w8a8_speedup_vs_cublas") for r in gemm.get("gemm", []) if r["m"] >= 256]
    w8 = [x for x in w8 if x is not None]
    if w8:
        rows.append(("W8A8 (+quantizer) M>=256 >= 1.4x cuBLAS fp16", f"{min(w8):.2f}x .. {max(w8):.2f}x", min(w8) >= 1.4))
    return rows


def w4a8_persistent_targets(bench):
    """Issue 15 at M = 256 and 1024 from bench_gpu_sm90_tiles.py's persistent run: the fastest 'sm90p...' column per
    shape against torch fp8 _scaled_mm (target 0.95x), the worst shape of each M."""
    rows = []
    for m in (256, 1024):
        got = []
        for r in bench.get("gemm", []):
            p = [v for k, v in r.items() if r["m"] == m and k.startswith("w4a8_sm90p") and k.endswith("_us")]
            f8 = r.get("torch_scaled_mm_fp8_us")
            if p and f8:
                got.append((f8 / min(p), r["shape"]))
        if got:
            worst = min(got)
            rows.append((f"W4A8 sm90p M={m} >= 0.95x torch fp8 (worst shape)", f"{worst[0]:.2f}x ({worst[1]})",
                         worst[0] >= 0.95))
    return rows


def attention_targets(attn):
    rows = []
    for r in attn.get("attention", []):
        if r.get("batch") == 64 and r.get("seq_len") == 8192:
            for kind, want in (("u8", 1.6), ("u4", 2.5)):
                got = r.get(f"speedup_{kind}_vs_sdpa")
                if got is not None:
                    rows.append((f"kv{8 if kind == 'u8' else 4} decode attention B=64 L=8K >= {want}x SDPA",
                                 f"{got:.2f}x", got >= want))
    return rows


def llama8b_targets(run):
    """Batch-1 w4a16kv8 decode against its bytes floor and against the torch.compile baseline (bench_gpu_llama8b.py)."""
    rows = []
    floor = {(f["engine"], f["recipe"]): f for f in run.get("floor", [])}
    ours = floor.get(("lowbit", "w4a16kv8"))
    if ours and ours.get("measured_decode_tok_s") is None:
        ours = None  # a run without batch 1 (e.g. --batches 16) has a floor but no measurement against it
    if ours:
        rows.append(("8B w4a16kv8 batch-1 decode >= 50% of its bytes floor",
                     f"{ours['measured_decode_tok_s']:.1f} tok/s = {ours['fraction_of_floor']:.0%}",
                     ours["fraction_of_floor"] >= 0.5))
    torch_b1 = floor.get(("torch_compile", "f16"))
    if ours and torch_b1 and torch_b1.get("measured_decode_tok_s"):
        ratio = ours["measured_decode_tok_s"] / torch_b1["measured_decode_tok_s"]
        rows.append(("8B w4a16kv8 batch-1 decode faster than torch.compile", f"{ratio:.2f}x", ratio > 1))
    return rows


def serving_targets(run):
    """bench_gpu_serving.py: server vs offline throughput, shared-prefix TTFT (targets), latency at each rate (reported)."""
    rows = []
    ratio = run.get("throughput_ratio")
    if ratio is not None:
        rows.append(("8B serve saturation >= 90% of offline LLM.generate", f"{ratio:.0%} ({run['errors']} errors)",
                     ratio >= 0.9 and run["errors"] == 0))
    prefix = run.get("prefix", {}).get("ttft_median_ratio")
    if prefix is not None:
        rows.append(("8B shared-prefix TTFT median >= 5x lower with caching", f"{prefix:.1f}x", prefix >= 5))
    for r in run.get("rates", []):
        rows.append((f"8B serve TTFT / TPOT P99 at {r['request_rate']} req/s",
                     f"{r['ttft']['p99_ms'] or 0:.0f} / {r['tpot']['p99_ms'] or 0:.1f} ms", None))
    return rows


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_out"
    print("\n== summary")
    print(f"{'item':58s} | {'result':28s} | target")
    print("-" * 100)
    for name, log in (("GPU tests", "pytest.log"), ("forward-pass and engine tests", "pytest_engine.log"),
                      ("serve tests", "pytest_serve.log"), ("W4A16 split producer tests", "pytest_prod.log"),
                      ("W4A16 sm90 regression (w4a16prod)", "pytest_prod_reg.log"),
                      ("W4A8 persistent tile loop tests", "pytest_persist.log"),
                      ("W4A8 sm90 regression (w4a8persist)", "pytest_persist_reg.log")):
        line = pytest_line(os.path.join(out, log))
        if line is not None:
            print(f"{name:58s} | {line[:28]:28s} |")
    # The files step's groups (pytest_files_N.log); a group cut by its time cap has no summary line.
    def group_of(log):
        return int(re.search(r"_(\d+)\.log$", log).group(1))
    for log in sorted(glob.glob(os.path.join(out, "pytest_files_*.log")), key=group_of):
        name, line = f"test files, group {group_of(log)}", pytest_line(log) or "not finished (time cap)"
        print(f"{name:58s} | {line[:28]:28s} |")
    sanitizer_rows(out)
    rows = []
    gemm = load(os.path.join(out, "bench_gemm.json"))
    if gemm:
        rows += gemm_targets(gemm)
    persist = load(os.path.join(out, "bench_w4a8_persistent.json"))
    if persist:
        rows += w4a8_persistent_targets(persist)
    attn = load(os.path.join(out, "bench_attention.json"))
    if attn:
        rows += attention_targets(attn)
    run = load(os.path.join(out, "llama8b.json"))
    if run:
        rows += llama8b_targets(run)
    run = load(os.path.join(out, "bench_gpu_serving.json"))
    if run:
        rows += serving_targets(run)
    for name, got, hit in rows:
        print(f"{name:58s} | {got:28s} | {'reported' if hit is None else 'hit' if hit else 'miss'}")
    if not rows:
        print("(no benchmark results in this run)")


if __name__ == "__main__":
    main()
