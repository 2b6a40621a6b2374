"""`lowbit quantize` / `python -m lowbit.quantize`: float checkpoint -> quantized directory (lowbit's, or
compressed-tensors with --export-format compressed-tensors)."""
from __future__ import annotations

import argparse
import sys

from .recipes import ALGORITHMS, supported_pairs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lowbit quantize", description="Quantize a float checkpoint into a lowbit "
                                "directory (safetensors + lowbit_quant.json). Pairs: " + supported_pairs())
    p.add_argument("--model", default=None, help=".gguf file or HF directory (default: SmolLM2-135M-Instruct)")
    p.add_argument("--recipe", required=True, help="e.g. w4a16, w8a8, w4a8kv4, w4a8g64kv4-liquid, w4a4kv4")
    p.add_argument("--algo", required=True, choices=sorted(ALGORITHMS), help="quantization algorithm")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--calib", nargs="+", required=True, help="calibration .txt files or folders")
    p.add_argument("--calib-seqs", type=int, default=16, help="number of calibration sequences (default 16)")
    p.add_argument("--calib-len", type=int, default=256, help="tokens per calibration sequence (default 256)")
    p.add_argument("--kv-mode", default=None, choices=("token", "channel", "static"),
                   help="KV fake quantization during calibration (default: from the recipe: channel for per-channel "
                        "K recipes such as kc4v4, else token = dynamic per token and head)")
    p.add_argument("--act-order", action="store_true", help="gptq: quantize columns by decreasing Hessian diag")
    p.add_argument("--alpha", type=float, default=None, help="smoothquant/liquid: fixed α (default: searched)")
    p.add_argument("--outlier-ratio", type=float, default=None, help="fmpq: outlier if max|x| > ratio * median")
    p.add_argument("--fmpq-int8-fraction", type=float, default=None,
                   help="fmpq: run this fraction of each linear's activation blocks in int8 (those with the largest "
                        "max|x| after the permutation) instead of the blocks holding outliers")
    p.add_argument("--fmpq-awq-scales", action="store_true",
                   help="fmpq: AWQ's per-channel scaling of the weights before the outlier permutation")
    p.add_argument("--smooth-attention", action="store_true", help="apply SmoothAttention (always on for qoq)")
    p.add_argument("--export-format", default="lowbit", choices=("lowbit", "compressed-tensors"),
                   help="lowbit: the lowbit directory (safetensors + lowbit_quant.json); compressed-tensors: a "
                        "pack-quantized / float-quantized checkpoint that vLLM and transformers read (weight-only "
                        "w4/w8/fp8 recipes), loadable by lowbit too")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = {}
    if args.act_order:
        options["act_order"] = True
    if args.alpha is not None:
        options["alpha"] = args.alpha
    if args.outlier_ratio is not None:
        options["outlier_ratio"] = args.outlier_ratio
    if args.fmpq_int8_fraction is not None:
        options["int8_fraction"] = args.fmpq_int8_fraction
    if args.fmpq_awq_scales:
        options["awq_scales"] = True
    if args.smooth_attention:
        options["smooth_attention"] = True
    import tempfile

    from .api import quantize
    from .export_compressed_tensors import export_compressed_tensors
    standard = args.export_format == "compressed-tensors"
    try:
        with tempfile.TemporaryDirectory(prefix="lowbit-quantize-") as tmp:
            # compressed-tensors: quantize into lowbit's directory first, then rewrite its fields in that layout
            path, _, manifest = quantize(args.model, args.recipe, args.algo, tmp if standard else args.out,
                                         calib=args.calib, num_sequences=args.calib_seqs, seq_len=args.calib_len,
                                         kv_mode=args.kv_mode, progress=not args.quiet, **options)
            if standard:
                path = export_compressed_tensors(path, args.out)
    except (ValueError, FileNotFoundError, NotImplementedError) as e:
        print(f"lowbit quantize: error: {e}", file=sys.stderr)
        return 2
    layout = " as compressed-tensors" if standard else ""
    print(f"wrote {path}{layout} (recipe {manifest['recipe']}, algorithm {manifest['algorithm']})")
    kv = manifest["kv"]
    if standard and (kv["k_bits"] < 16 or kv["v_bits"] < 16):
        print(f"note: compressed-tensors does not record lowbit's KV cache precision; load with "
              f"recipe={manifest['recipe']!r} to get it back")
    return 0
