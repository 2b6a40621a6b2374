#!/usr/bin/env python3
"""FMPQ int8-block budget sweep on SmolLM2 (issue 19; a benchmark, not a test).

Each row is measured like the engine rows of tools/accuracy_table.py: `lowbit quantize`'s directory (fmpq at
--recipe: w4a4, KV16 as the table's FMPQ row, or w4a4kv4; calibration 16 x 256 tokens of the calibration folder),
then `lowbit.LLM(DIR).perplexity` on the first 4096 tokens of the evaluation text in windows of 1024, one thread.
Rows differ only in how the int8 activation blocks are chosen: the outlier criterion (max|X_c| > ratio x median,
today's default) or a fixed fraction of each linear's blocks (`int8_fraction`, the blocks with the largest max|X|
after the permutation); the -awq rows add AWQ's scaling before the permutation (`awq_scales`). f32 is
re-measured in the same run for the deltas.

    python tools/fmpq_sweep.py --calib CALIB_DIR --eval EVAL_TXT --out RESULTS.json [--rows f32,ratio8,f0.2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import lowbit  # noqa: F401  first: the installed package, with its extension (accuracy_table prepends python/)
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from accuracy_table import engine_perplexity, row_extras  # noqa: E402

from lowbit.models import load_model_source  # noqa: E402
from lowbit.quantize.api import quantize  # noqa: E402

# key -> (label, fmpq options); None: the float model (the engine at w16a16)
ROWS = {
    "f32": ("f32 (this run)", None),
    "ratio8": ("outlier criterion, ratio 8 (today's default)", {}),
    "f0.0": ("int8 fraction 0 (every block int4)", {"int8_fraction": 0.0}),
    "f0.1": ("int8 fraction 0.1", {"int8_fraction": 0.1}),
    "f0.2": ("int8 fraction 0.2 (COMET's typical share)", {"int8_fraction": 0.2}),
    "f0.4": ("int8 fraction 0.4", {"int8_fraction": 0.4}),
    "f0.6": ("int8 fraction 0.6", {"int8_fraction": 0.6}),
    "f1.0": ("int8 fraction 1.0 (every block int8: W4A8 with per-block scales)", {"int8_fraction": 1.0}),
    "f0.2-awq": ("int8 fraction 0.2, AWQ scaling before the permutation",
                 {"int8_fraction": 0.2, "awq_scales": True}),
    "f1.0-awq": ("int8 fraction 1.0, AWQ scaling", {"int8_fraction": 1.0, "awq_scales": True}),
}


def run_row(key, loaded, args) -> dict:
    label, options = ROWS[key]
    t0 = time.time()
    if options is None:
        ppl = engine_perplexity(None, args.eval, "w16a16")
        return {"label": label, "ppl": ppl, "eval_s": time.time() - t0}
    out = Path(args.work) / f"{args.recipe}-{key}"
    _, _, manifest = quantize(None, args.recipe, "fmpq", out, calib=[args.calib], num_sequences=args.calib_seqs,
                              seq_len=args.calib_len, progress=False, loaded=loaded, **options)
    t1 = time.time()
    extras = row_extras("fmpq", manifest)
    fr = list(manifest["fmpq_int8_block_fraction"].values())
    ppl = engine_perplexity(out, args.eval)
    return {"label": label, "options": options, "ppl": ppl, "quantize_s": t1 - t0, "eval_s": time.time() - t1,
            "int8_block_fraction_mean": extras["int8_block_fraction_mean"],
            "int8_block_fraction_min": min(fr), "int8_block_fraction_max": max(fr),
            "int8_block_fraction_per_layer": extras["int8_block_fraction_per_layer"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calib", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--out", required=True, help="results JSON (rows already in it are skipped)")
    p.add_argument("--rows", default="", help="comma-separated row keys (default: all)")
    p.add_argument("--recipe", default="w4a4", help="w4a4 (KV16, as the accuracy table's FMPQ row) or w4a4kv4")
    p.add_argument("--work", default=str(ROOT / "build" / "fmpq_sweep_dirs"))
    p.add_argument("--calib-seqs", type=int, default=16)
    p.add_argument("--calib-len", type=int, default=256)
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("LOWBIT_QUANT_THREADS", "1")))
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.is_file() else {}
    results.setdefault("rows", {})
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    results["settings"] = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit,
                           "model": "SmolLM2-135M-Instruct Q4_1 GGUF (default)", "recipe": args.recipe,
                           "algorithm": "fmpq", "eval": Path(args.eval).name, "tokens": 4096, "window": 1024,
                           "calib": sorted(c.name for c in Path(args.calib).glob("*.txt")),
                           "calib_seqs": args.calib_seqs, "calib_len": args.calib_len,
                           "computed_by": "engine (lowbit.LLM(DIR).perplexity, one thread)"}
    loaded = load_model_source(None, progress=False)
    for key in (args.rows.split(",") if args.rows else list(ROWS)):
        if key in results["rows"]:
            continue
        row = run_row(key, loaded, args)
        # re-read before writing: a parallel run may have added rows to the same file
        current = json.loads(path.read_text()) if path.is_file() else results
        current.setdefault("rows", {})[key] = row
        current["settings"] = results["settings"]
        results = current
        print(f"{key}: ppl {row['ppl']:.3f} ({row.get('quantize_s', 0):.0f}s + {row['eval_s']:.0f}s)", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
