#!/usr/bin/env python3
"""Regenerate docs/accuracy.md: SmolLM2-135M-Instruct perplexity per recipe and algorithm (a benchmark, not a test).

Perplexity: the first 4096 tokens of the evaluation text, non-overlapping windows of 1024. Each row is computed by
the engine (`lowbit.LLM(dir).perplexity`, one thread) when it can run the recipe, else by the torch fake-quant model
of python/lowbit/quantize (same dequantized weights, activation and KV fake quantization) and marked so.
Results are cached per row in a JSON file so an interrupted run resumes; --prefer-engine recomputes cached
fake-quant rows that the engine can now run. Needs the built extension (LOWBIT_DEV_BUILD or an installed lowbit).

    python tools/accuracy_table.py --calib CALIB_DIR --eval EVAL_TXT [--rows w4a16-awq,w4a8kv4-qoq] [--out docs/accuracy.md]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402

from lowbit.models import load_model_source  # noqa: E402
from lowbit.quantize.api import eval_perplexity, quantize  # noqa: E402
from lowbit.quantize.torch_model import TorchLlama  # noqa: E402

# (key, section, label, recipe, algorithm, options)
ROWS = [
    ("f32", "Reference", "f32 (GGUF weights dequantized)", None, None, {}),
    ("w8a8-rtn", "W8A8", "w8a8 RTN", "w8a8", "rtn", {}),
    ("w8a8-sq", "W8A8", "w8a8 SmoothQuant (α searched)", "w8a8", "smoothquant", {}),
    ("w4a16-rtn", "W4A16 g128", "w4a16 g128 RTN", "w4a16g128", "rtn", {}),
    ("w4a16-awq", "W4A16 g128", "w4a16 g128 AWQ", "w4a16g128", "awq", {}),
    ("w4a16-gptq", "W4A16 g128", "w4a16 g128 GPTQ", "w4a16g128", "gptq", {}),
    ("w4a8kv4-rtn", "W4A8KV4 g128", "w4a8kv4 g128 RTN", "w4a8g128kv4", "rtn", {}),
    ("w4a8kv4-awq", "W4A8KV4 g128", "w4a8kv4 g128 AWQ", "w4a8g128kv4", "awq", {}),
    ("w4a8kv4-qoq", "W4A8KV4 g128", "w4a8kv4 g128 QoQ", "w4a8g128kv4", "qoq", {}),
    # QoQ ablations: one component off at a time (see Observations)
    ("w4a8kv4-qoq-norot", "W4A8KV4 g128", "w4a8kv4 g128 QoQ without rotation", "w4a8g128kv4", "qoq",
     {"rotate": False}),
    ("w4a8kv4-qoq-nosa", "W4A8KV4 g128", "w4a8kv4 g128 QoQ without SmoothAttention", "w4a8g128kv4", "qoq",
     {"smooth_attention": False}),
    ("w4a8kv4-qoq-noreorder", "W4A8KV4 g128", "w4a8kv4 g128 QoQ without reordering", "w4a8g128kv4", "qoq",
     {"reorder": False}),
    ("w4a8-liquid", "W4A8 LiquidQuant", "w4a8 g64 LiquidQuant", "w4a8g64-liquid", "liquid", {}),
    ("w4a4-fmpq", "W4A4 mixed (FMPQ)", "w4a4-mixed FMPQ (w4 g128 sym)", "w4a4", "fmpq", {}),
]
for bits in (8, 4, 2):
    for mode in ("token", "channel"):
        for sa in (False, True):
            key = f"kv{bits}-{mode}{'-sa' if sa else ''}"
            label = f"kv{bits} {'per-token K' if mode == 'token' else 'per-channel K'}" + \
                (" + SmoothAttention" if sa else "")
            ROWS.append((key, "KV cache only (weights f32)", label, f"w16a16kv{bits}", "rtn",
                         dict(kv_mode=mode, smooth_attention=sa)))

# The engine's per-channel K (KIVI-style, recipe word kc{bits}[g{G}]): K per channel over groups of G tokens (one
# KV block), the newest < G tokens in f16 (the residual window), V per token. Group-size and SmoothAttention ablation.
ENGINE_KV = "KV cache in the engine: per-channel K + f16 residual window (weights f32)"
for word, sa in (("kc4v4", False), ("kc4g32v4", False), ("kc4g128v4", False), ("kc4v4", True), ("kc4v2", False),
                 ("kc2v2", False), ("kc2g32v2", False), ("kc2g128v2", False), ("kc2g32v2", True), ("kc2g32v4", False)):
    group = word.split("g")[1].split("v")[0] if "g" in word else "64"
    ROWS.append((f"{word}{'-sa' if sa else ''}", ENGINE_KV,
                 f"{word} (K {word[2]}-bit per channel, G {group}; V {word.split('v')[-1]}-bit per token)" +
                 (" + SmoothAttention" if sa else ""), f"w16a16{word}", "rtn",
                 dict(kv_mode="channel", smooth_attention=sa)))

# The GGUF file as it is (issue 18): the engine on the default SmolLM2 Q4_1 file at a recipe (None: no recipe, the
# file's own precision), no `lowbit quantize` step. "as_loaded" rows record the recipe the engine built.
GGUF_SECTION = "The GGUF file's own precision (the engine on the Q4_1 file; no quantize step)"
ROWS += [
    ("gguf-default", GGUF_SECTION, "no recipe: Q4_1 linears as stored (w4 g32 + min), lm_head w8 g32 stored from the "
     "Q8_0 embedding", None, None, {"as_loaded": True}),
    ("gguf-w4a16", GGUF_SECTION, "w4a16 (becomes w4a16g32: the same stored weights as no recipe)", "w4a16", None,
     {"as_loaded": True}),
    ("gguf-w4a16g128", GGUF_SECTION, "w4a16g128: Q4_1 re-quantized from the exact values to g128, lm_head w4 g128",
     "w4a16g128", None, {"as_loaded": True}),
]

QSERVE_TABLE2 = ("QServe Table 2, Llama-3-8B WikiText2: FP16 6.14, W8A8 SmoothQuant 6.28, W4A16 AWQ 6.54, "
                 "W4A8KV4 g128 RTN 7.25 / AWQ 6.94 / QoQ 6.70.")


def engine_perplexity(model, text_path, recipe=None):
    """The engine's perplexity of a quantized directory (or of the default model at `recipe`); None when the engine
    refuses the recipe (NotImplementedError), so the row falls back to fake quantization."""
    import lowbit
    try:
        llm = lowbit.LLM(None if model is None else str(model), recipe=recipe, num_threads=1, progress=False)
    except NotImplementedError as e:
        print(f"  engine: {e}", file=sys.stderr)
        return None
    return float(llm.perplexity(Path(text_path).read_text(encoding="utf-8"), max_tokens=4096, window=1024))


def engine_can_run(row) -> bool:
    """Rows whose recipe and KV mode the engine implements: per-token KV (16/8/4/2 bits) under a per-token recipe,
    per-channel K under a kc recipe (its grouped per-channel K with the f16 window, not the fake-quant model's
    whole-sequence ranges)."""
    _, _, _, recipe, _, options = row
    if recipe is None:
        return True
    from lowbit.quantize.recipes import parse_recipe
    spec = parse_recipe(recipe)
    mode = options.get("kv_mode", "token")
    return (mode == "token" and not spec.k_per_channel) or (mode == "channel" and spec.k_per_channel)


def run_row(row, loaded, args):
    key, _, _, recipe, algo, options = row
    t0 = time.time()
    if options.get("as_loaded"):  # the GGUF file itself at `recipe` (None: the file's precision)
        import lowbit
        llm = lowbit.LLM(None, recipe=recipe, num_threads=1, progress=False)
        ppl = float(llm.perplexity(Path(args.eval).read_text(encoding="utf-8"), max_tokens=4096, window=1024))
        return {"ppl": ppl, "by": "engine", "quantize_s": 0.0, "recipe_built": llm.recipe}
    if recipe is None or (recipe.startswith("w16a16") and not options.get("smooth_attention")):
        # float weights and no calibrated transform: the engine at that recipe, or only the KV fake quantization
        if engine_can_run(row):
            ppl = engine_perplexity(None, args.eval, recipe or "w16a16")
            if ppl is not None:
                return {"ppl": ppl, "by": "engine", "quantize_s": 0.0}
        from lowbit.quantize.kv_quant import KVQuantizer
        from lowbit.quantize.recipes import parse_recipe
        from lowbit.quantize.torch_model import FakeQuant
        fake = FakeQuant()
        if recipe is not None:
            spec = parse_recipe(recipe)
            fake.kv = KVQuantizer(spec.k_bits, spec.v_bits, k_mode=options.get("kv_mode", "token"))
        model = TorchLlama(loaded.config, loaded.tensors, fake)
        ppl = eval_perplexity(model, loaded.tokenizer, args.eval, max_tokens=4096, window=1024)
        return {"ppl": ppl, "by": "torch fake-quant, not the engine", "quantize_s": 0.0}
    options = dict(options)
    kv_mode = options.pop("kv_mode", "token")
    if not options.get("smooth_attention", True) and algo != "qoq":  # QoQ applies it unless told not to
        options.pop("smooth_attention")
    out = Path(args.work) / key
    seqs = min(args.calib_seqs, 4) if recipe.startswith("w16a16") else args.calib_seqs  # SmoothAttention only
    _, model, manifest = quantize(None, recipe, algo, out, calib=[args.calib], num_sequences=seqs,
                                  seq_len=args.calib_len, kv_mode=kv_mode, progress=False, loaded=loaded, **options)
    result = dict(quantize_s=time.time() - t0, **row_extras(algo, manifest))
    ppl = engine_perplexity(out, args.eval) if engine_can_run(row) else None
    if ppl is not None:
        return dict(ppl=ppl, by="engine", **result)
    ppl = eval_perplexity(model, loaded.tokenizer, args.eval, max_tokens=4096, window=1024)
    return dict(ppl=ppl, by="torch fake-quant, not the engine", **result)


def row_extras(algo, manifest) -> dict:
    extra = {}
    if algo == "fmpq":
        fr = manifest.get("fmpq_int8_block_fraction", {})
        extra["int8_block_fraction_mean"] = sum(fr.values()) / max(1, len(fr))
        per_layer = {}  # layer -> {q/k/v, o, gate/up, down: fraction}: shared inputs share one block map
        for name, f in fr.items():
            parts = name.split(".")
            site = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o", "gate_proj": "gate_up",
                    "up_proj": "gate_up", "down_proj": "down"}[parts[-2]]
            per_layer.setdefault(parts[2], {})[site] = f
        extra["int8_block_fraction_per_layer"] = per_layer
    if algo in ("smoothquant", "liquid"):
        extra["alpha"] = manifest["parameters"].get("alpha")
    return extra


def render(results, rows) -> str:
    ref = results.get("f32", {}).get("ppl")
    lines = ["# Accuracy: SmolLM2-135M-Instruct perplexity per recipe", "",
             "Generated by `tools/accuracy_table.py` (a benchmark, not a test). Perplexity on the first 4096 tokens "
             "of the evaluation text (GPL-3 license text), non-overlapping windows of 1024 tokens; HF transformers "
             "f32 reference for this text: 21.49 (tests_py/test_hf_parity.py). Calibration: 16 sequences x 256 tokens of the calibration texts "
             "(GPL-2, LGPL-2.1, GFDL-1.3). Note that SmolLM2's GGUF layers are already Q4_1 (group 32): the "
             "\"float\" model is a dequantized 4-bit model, which flatters weight-only 4-bit rows.", "",
             "\"engine\" rows: `lowbit.LLM(DIR).perplexity` on the directory written by `lowbit quantize` (one "
             "thread). As in the engine, lm_head is quantized round-to-nearest in the recipe's format under "
             "weight-only recipes and kept in f16 (with float activations) under a8/a4 recipes. "
             "\"torch fake-quant\" rows: the engine cannot run that KV mode (per-channel K with ranges over the whole "
             "sequence, the fake-quant model's \"channel\" mode); the torch model of `lowbit.quantize` computes them "
             "(same weights and fake quantization). The engine's own per-channel K (`kc` recipes: groups of G tokens, "
             "f16 residual window) has its own section.", "",
             "| recipe / algorithm | perplexity | Δ vs f32 | computed by | quantize time (s) | notes |",
             "|---|---:|---:|---|---:|---|"]
    section = None
    for key, sec, label, *_ in rows:
        if sec != section:
            lines.append(f"| **{sec}** | | | | | |")
            section = sec
        r = results.get(key)
        if r is None:
            lines.append(f"| {label} | not run | | | | |")
            continue
        delta = "" if ref is None or key == "f32" else f"{r['ppl'] - ref:+.2f}"
        notes = []
        if "alpha" in r:
            notes.append(f"α = {r['alpha']}")
        if "recipe_built" in r:
            notes.append(f"recipe built: {r['recipe_built']}")
        if "int8_block_fraction_mean" in r:
            notes.append(f"int8 blocks: {100 * r['int8_block_fraction_mean']:.1f}% (mean over linears)")
        lines.append(f"| {label} | {r['ppl']:.2f} | {delta} | {r['by']} | {r['quantize_s']:.0f} | "
                     f"{'; '.join(notes)} |")
    lines += ["", "For comparison, " + QSERVE_TABLE2, ""]
    lines += fmpq_block_table(results.get("w4a4-fmpq", {}).get("int8_block_fraction_per_layer"))
    return "\n".join(lines)


def fmpq_block_table(per_layer) -> list[str]:
    """Fraction of int8 activation blocks per layer and input (w4a4 FMPQ row)."""
    if not per_layer:
        return []
    lines = ["### FMPQ: fraction of int8 activation blocks per layer", "",
             "Blocks of 128 input channels holding an outlier channel (max|X_c| > 8 x median) run int8, the rest "
             "int4. q/k/v and gate/up share their input and so their block map.", "",
             "| layer | q/k/v | o_proj | gate/up | down_proj |", "|---:|---:|---:|---:|---:|"]
    for layer in sorted(per_layer, key=int):
        r = per_layer[layer]
        lines.append(f"| {layer} | " + " | ".join(f"{100 * r[site]:.0f}%" for site in ("qkv", "o", "gate_up", "down"))
                     + " |")
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calib", required=True, help="calibration text folder")
    p.add_argument("--eval", required=True, help="evaluation text file")
    p.add_argument("--rows", default="", help="comma-separated row keys (default: all)")
    p.add_argument("--cache", default=str(ROOT / "build" / "accuracy_results.json"),
                   help="result cache (comma-separated: the first is written, all are read)")
    p.add_argument("--out", default=str(ROOT / "docs" / "accuracy.md"))
    p.add_argument("--work", default=str(ROOT / "build" / "accuracy_dirs"))
    p.add_argument("--prefer-engine", action="store_true",
                   help="recompute cached rows computed by fake quantization that the engine can run")
    p.add_argument("--calib-seqs", type=int, default=16)
    p.add_argument("--calib-len", type=int, default=256)
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--reverse", action="store_true", help="run the rows in reverse order (for a parallel run)")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("LOWBIT_QUANT_THREADS", "1")))
    caches = [Path(c) for c in args.cache.split(",")]
    cache = caches[0]  # written; the others (from parallel runs) are only read
    results = {}
    for c in reversed(caches):
        if c.is_file():
            results.update(json.loads(c.read_text()))
    wanted = [r for r in ROWS if not args.rows or r[0] in args.rows.split(",")]
    if not args.render_only:
        loaded = load_model_source(None, progress=False)
        claims = Path(args.work) / "claims"
        claims.mkdir(parents=True, exist_ok=True)
        for row in (reversed(wanted) if args.reverse else wanted):
            cached = results.get(row[0])
            if cached is not None and not (args.prefer_engine and cached["by"] != "engine" and engine_can_run(row)):
                continue
            try:  # parallel runs (each with its own first --cache) split the rows by claiming them
                (claims / (row[0] + (".engine" if cached else ""))).open("x").close()
            except FileExistsError:
                continue
            t0 = time.time()
            results[row[0]] = run_row(row, loaded, args)
            print(f"{row[0]}: ppl {results[row[0]]['ppl']:.3f} ({time.time() - t0:.0f}s)", flush=True)
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(results, indent=1))
            write_doc(Path(args.out), render(results, ROWS))
    write_doc(Path(args.out), render(results, ROWS))
    return 0


OBSERVATIONS = "## Observations"


def write_doc(path: Path, table: str) -> None:
    """Writes the table, keeping a hand-written "## Observations" section of the existing file."""
    kept = ""
    if path.is_file():
        old = path.read_text(encoding="utf-8")
        if OBSERVATIONS in old:
            kept = old[old.index(OBSERVATIONS):]
    path.write_text(table + ("\n" + kept if kept else ""), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
