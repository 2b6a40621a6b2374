#!/usr/bin/env python3
"""QoQ ablation on SmolLM2 (issue 18): why W4A8KV4 QoQ scores worse than RTN (a benchmark, not a test).

Every row is computed by the torch fake-quant model of python/lowbit/quantize (`lowbit.quantize(..., out=None)`,
weights replaced by their dequantized values, per-token int8 activations and per-token KV4 simulated) on the
first --tokens tokens of the evaluation text, non-overlapping windows of --window, with the same calibration as
tools/accuracy_table.py (16 x 256 tokens of the calibration folder). The engine cannot run the online-rotation or
plain-s8-range rows, so the reference rows (f32, RTN, QoQ, QoQ without rotation) are re-measured the same way in
the same run. Variants that only change what is simulated at evaluation (weights only, no KV quantization) reuse
the quantized weights of their base row.

    python tools/qoq_ablation.py --calib CALIB_DIR --eval EVAL_TXT --out RESULTS.json [--rows a,b] [--tokens 4096]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch  # noqa: E402

from lowbit.models import load_model_source  # noqa: E402
from lowbit.quantize import transforms as T  # noqa: E402
from lowbit.quantize.api import eval_perplexity, quantize  # noqa: E402
from lowbit.quantize.hadamard import scaled_hadamard  # noqa: E402
from lowbit.quantize.kv_quant import KVQuantizer  # noqa: E402
from lowbit.quantize.torch_model import FakeQuant, TorchLlama, linear_names  # noqa: E402

G128 = "w4a8g128kv4"
# key -> (label, recipe or None (float weights), algorithm, options, evaluation variants)
# variants: "full" = as calibrated (W4A8KV4), "w_only" = the same weights, float activations and KV,
# "w_kv4" = the same weights, float activations, KV4.
ROWS = {
    "f32": ("f32 (float weights, activations and KV)", None, None, {}, ["full"]),
    "rtn": ("RTN (w4 g128 asym, no transform)", G128, "rtn", {}, ["full", "w_only"]),
    "awq": ("AWQ (w4 g128, QServe's second baseline)", G128, "awq", {}, ["full"]),
    "qoq": ("QoQ, all components (residual rotation)", G128, "qoq", {}, ["full", "w_only", "w_kv4"]),
    "qoq-norot": ("QoQ without rotation", G128, "qoq", {"rotate": False}, ["full", "w_only", "w_kv4"]),
    "w16a8": ("W16A8: float weights, int8 per-token activations, no rotation", None, "a8", {}, ["full"]),
    "w16a8-fold": ("W16A8, RMSNorm weights folded into q/k/v and gate/up, no rotation", None, "a8",
                   {"rotate": "fold"}, ["full"]),
    "w16a8-rot": ("W16A8 with the residual rotation", None, "a8", {"rotate": True}, ["full"]),
    "w16a8-rot-qkv": ("W16A8, rotation online at the qkv input only", None, "a8", {"rotate": "qkv"}, ["full"]),
    "w16a8-rot-gate_up": ("W16A8, rotation online at the gate/up input only", None, "a8", {"rotate": "gate_up"},
                          ["full"]),
    # weights only, round-to-nearest in the qoq format (g128, no clipping, smoothing or calibration): the rotation's
    # effect on the 4-bit weights alone
    "w4-rtn": ("W4A16 qoq-format RTN weights (g128), no transform", None, "w4rtn", {}, ["full"]),
    "w4-rtn-fold": ("W4A16 qoq-format RTN weights, RMSNorm weights folded, no rotation", None, "w4rtn",
                    {"rotate": "fold"}, ["full"]),
    "w4-rtn-rot": ("W4A16 qoq-format RTN weights, residual rotation", None, "w4rtn", {"rotate": True}, ["full"]),
    "w4-rtn-rot-qkv": ("W4A16 qoq-format RTN weights, rotation online at qkv only", None, "w4rtn",
                       {"rotate": "qkv"}, ["full"]),
    "w4-rtn-rot-gate_up": ("W4A16 qoq-format RTN weights, rotation online at gate/up only", None, "w4rtn",
                           {"rotate": "gate_up"}, ["full"]),
    "w4-rtn-rot-both-nofold": ("W4A16 qoq-format RTN weights, rotation online at qkv and gate/up, RMSNorm weights "
                               "not folded", None, "w4rtn", {"rotate": ["qkv", "gate_up"], "fold_norms": False},
                               ["full"]),
    "qoq-rot-qkv": ("QoQ, rotation online at the qkv input only", G128, "qoq", {"rotate": "qkv"}, ["full"]),
    "qoq-rot-gate_up": ("QoQ, rotation online at the gate/up input only", G128, "qoq", {"rotate": "gate_up"},
                        ["full"]),
    "qoq-rot-both": ("QoQ, rotation online at qkv and gate/up (o/down weights not rotated)", G128, "qoq",
                     {"rotate": ["qkv", "gate_up"]}, ["full"]),
    "qoq-rot-both-nofold": ("QoQ, rotation online at qkv and gate/up, RMSNorm weights not folded", G128, "qoq",
                            {"rotate": ["qkv", "gate_up"], "fold_norms": False}, ["full", "w_only"]),
    "qoq-rot-qkv-nofold": ("QoQ, rotation online at qkv only, RMSNorm weights not folded", G128, "qoq",
                           {"rotate": "qkv", "fold_norms": False}, ["full"]),
    "w16a8-rot-both-nofold": ("W16A8, rotation online at qkv and gate/up, RMSNorm weights not folded", None, "a8",
                              {"rotate": ["qkv", "gate_up"], "fold_norms": False}, ["full"]),
    "qoq-g64": ("QoQ g64", "w4a8g64kv4", "qoq", {}, ["full", "w_only"]),
    "qoq-g64-norot": ("QoQ g64 without rotation", "w4a8g64kv4", "qoq", {"rotate": False}, ["full", "w_only"]),
    "qoq-g32": ("QoQ g32", "w4a8g32kv4", "qoq", {}, ["full", "w_only"]),
    "qoq-g32-norot": ("QoQ g32 without rotation", "w4a8g32kv4", "qoq", {"rotate": False}, ["full", "w_only"]),
    "qoq-noprot": ("QoQ with the plain s8 range [-127, 127] (no protective range)", G128, "qoq",
                   {"protective_range": False}, ["full"]),
    "qoq-norot-nosa": ("QoQ without rotation and without SmoothAttention", G128, "qoq",
                       {"rotate": False, "smooth_attention": False}, ["full"]),
    "rtn-g64": ("RTN g64", "w4a8g64kv4", "rtn", {}, ["full"]),
    "rtn-g32": ("RTN g32", "w4a8g32kv4", "rtn", {}, ["full"]),
}


def evaluate(model, loaded, args) -> float:
    return eval_perplexity(model, loaded.tokenizer, args.eval, max_tokens=args.tokens, window=args.window)


def run_row(key, loaded, args) -> dict:
    label, recipe, algo, options, variants = ROWS[key]
    t0 = time.time()
    out = {"label": label, "recipe": recipe, "algorithm": algo, "options": options, "ppl": {}}
    if recipe is None:  # float weights
        model = TorchLlama(loaded.config, loaded.tensors)
        rotate = options.get("rotate", False)
        if rotate:
            if options.get("fold_norms", True):
                T.fold_norms(model)
            h = torch.from_numpy(scaled_hadamard(loaded.config.hidden_size))
            if rotate is True:
                T.rotate_residual(model, h)
            elif rotate != "fold":
                T.rotate_block_inputs(model, (rotate,) if isinstance(rotate, str) else rotate, h)
        if algo == "a8":
            model.fake.act_quant = "int8"
        if algo == "w4rtn":
            from lowbit.quantize.formats import fake_quant
            for name in linear_names(loaded.config.num_layers):
                model.weights[name] = fake_quant(model.weights[name], "qoq", 128)
        out["ppl"]["full"] = evaluate(model, loaded, args)
        out["seconds"] = time.time() - t0
        return out
    _, model, manifest = quantize(None, recipe, algo, None, calib=[args.calib], num_sequences=args.calib_seqs,
                                  seq_len=args.calib_len, progress=False, loaded=loaded, **options)
    out["quantize_s"] = time.time() - t0
    params = manifest["parameters"]
    if "s8_overflow_fraction" in params:
        fr = params["s8_overflow_fraction"]
        out["s8_overflow_fraction_mean"] = sum(fr.values()) / len(fr)
        out["s8_overflow_fraction_max"] = max(fr.values())
    if "layers" in params:
        out["output_smoothing_alphas"] = [v.get(site, {}).get("alpha") for v in params["layers"].values()
                                          for site in ("o_proj", "down_proj")]
    fake = model.fake
    for variant in variants:
        if variant == "full":
            model.fake = fake
        else:
            model.fake = FakeQuant(input_perm=fake.input_perm, input_rotation=fake.input_rotation,
                                   kv=fake.kv if variant == "w_kv4" else None)
        out["ppl"][variant] = evaluate(model, loaded, args)
        print(f"  {key}/{variant}: {out['ppl'][variant]:.3f}", flush=True)
    model.fake = fake
    out["seconds"] = time.time() - t0
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calib", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--out", required=True, help="results JSON (rows already in it are skipped)")
    p.add_argument("--rows", default="", help="comma-separated row keys (default: all, in table order)")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--calib-seqs", type=int, default=16)
    p.add_argument("--calib-len", type=int, default=256)
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("LOWBIT_QUANT_THREADS", "1")))
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.is_file() else {}
    results.setdefault("rows", {})
    results["settings"] = {"eval": Path(args.eval).name, "tokens": args.tokens, "window": args.window,
                           "calib": sorted(p.name for p in Path(args.calib).glob("*.txt")),
                           "calib_seqs": args.calib_seqs, "calib_len": args.calib_len,
                           "computed_by": "torch fake-quant model (lowbit.quantize, out=None)",
                           "threads": torch.get_num_threads()}
    loaded = load_model_source(None, progress=False)
    keys = args.rows.split(",") if args.rows else list(ROWS)
    for key in keys:
        if key in results["rows"]:
            continue
        t0 = time.time()
        results["rows"][key] = run_row(key, loaded, args)
        print(f"{key}: {results['rows'][key]['ppl']} ({time.time() - t0:.0f}s)", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
