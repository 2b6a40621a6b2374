#!/usr/bin/env python3
"""FMPQ block scales: COMET's free per-block f32 vs power-of-two multiples of one per-token scale (issue 19).

A benchmark, not a test. SmolLM2 perplexity by the torch fake-quant model of lowbit.quantize (the engine has no
pow2 activation path yet), first 4096 tokens of the evaluation text in windows of 1024, one thread; calibration
16 x 256 tokens of the calibration folder, recipe w4a4 (KV16, the accuracy table's FMPQ row). Per int8-block
budget (the outlier criterion, or a fixed fraction of each linear's blocks after the permutation) three rows:
  fmpq       today's format, calibrated and evaluated under it;
  pow2-swap  the same quantized weights, evaluated with pow2 activations (isolates the activation format);
  int8-swap  the same weights with per-token int8 activations (W4A8's; the finest grid one int32 accumulator
             per token allows, which bounds any format the W4A8 GEMM can run);
  pow2       calibrated under pow2 (later layers see pow2 inputs) and evaluated under it (--calibrated pow2).
f32 (no quantization) is measured in the same run for the deltas.

    python tools/fmpq_pow2_accuracy.py --calib CALIB_DIR --eval EVAL_TXT --out RESULTS.json [--budgets ratio8,f0.1]
        [--calibrated fmpq,pow2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import lowbit  # noqa: F401  first: the installed package, with its extension
import torch

from lowbit.models import load_model_source
from lowbit.quantize.api import eval_perplexity, quantize
from lowbit.quantize.torch_model import TorchLlama

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = {"ratio8": {}, "f0.0": {"int8_fraction": 0.0}, "f0.1": {"int8_fraction": 0.1},
           "f0.25": {"int8_fraction": 0.25}, "f1.0": {"int8_fraction": 1.0}}


def ppl(model, loaded, args) -> float:
    return eval_perplexity(model, loaded.tokenizer, args.eval, max_tokens=4096, window=1024)


def run_budget(key, loaded, args) -> dict:
    opts = BUDGETS[key]
    rows = {}
    for pow2 in [c == "pow2" for c in args.calibrated.split(",")]:
        t0 = time.time()
        _, model, manifest = quantize(None, "w4a4", "fmpq", None, calib=[args.calib], num_sequences=args.calib_seqs,
                                      seq_len=args.calib_len, progress=False, loaded=loaded,
                                      **dict(opts, pow2_scales=pow2))
        fr = list(manifest["fmpq_int8_block_fraction"].values())
        base = {"options": opts, "quantize_s": time.time() - t0, "int8_block_fraction_mean": sum(fr) / len(fr)}
        model.fake.act_quant = "fmpq_pow2" if pow2 else "fmpq"
        rows["pow2" if pow2 else "fmpq"] = dict(base, ppl=ppl(model, loaded, args))
        if not pow2:
            for swap, act in (("pow2-swap", "fmpq_pow2"), ("int8-swap", "int8")):
                model.fake.act_quant = act
                rows[swap] = dict(base, ppl=ppl(model, loaded, args))
        print(key, {k: round(v["ppl"], 3) for k, v in rows.items()}, flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calib", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--out", required=True, help="results JSON (budgets already in it are skipped)")
    p.add_argument("--budgets", default="f32,ratio8,f0.0,f0.1,f0.25")
    p.add_argument("--calibrated", default="fmpq,pow2", help="which calibrations to run (fmpq also gives the swaps)")
    p.add_argument("--calib-seqs", type=int, default=16)
    p.add_argument("--calib-len", type=int, default=256)
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("LOWBIT_QUANT_THREADS", "1")))
    path = Path(args.out)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    settings = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit,
                "model": "SmolLM2-135M-Instruct Q4_1 GGUF (default)", "recipe": "w4a4", "algorithm": "fmpq",
                "eval": Path(args.eval).name, "tokens": 4096, "window": 1024,
                "calib_seqs": args.calib_seqs, "calib_len": args.calib_len,
                "computed_by": "torch fake-quant (lowbit.quantize's model), one thread"}
    loaded = load_model_source(None, progress=False)
    for key in args.budgets.split(","):
        current = json.loads(path.read_text()) if path.is_file() else {}
        if key in current.get("budgets", {}):
            continue  # (write to a new file to add rows to a budget, then merge)
        if key == "f32":
            row = {"ppl": ppl(TorchLlama(loaded.config, loaded.tensors), loaded, args)}
            print("f32", row, flush=True)
        else:
            row = run_budget(key, loaded, args)
        # re-read before writing: a parallel run may have added budgets to the same file
        current = json.loads(path.read_text()) if path.is_file() else {}
        current.setdefault("budgets", {})[key] = row
        current["settings"] = settings
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(current, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
