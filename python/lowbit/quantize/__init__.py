"""Quantization algorithms (RTN, AWQ, GPTQ, SmoothQuant, QoQ, LiquidQuant, FMPQ) and the quantized directory.

    from lowbit.quantize import quantize, load_quantized_dir
    quantize(None, "w4a8kv4", "qoq", "out/", calib=["calib_dir"])
    loaded, fields, manifest = load_quantized_dir("out/")
Calibration runs a torch (CPU) Llama; the C++ engine never links torch. See docs/quantization.md.
"""
from .export import MANIFEST, load_quantized_dir
from .recipes import ALGORITHMS, RecipeError, RecipeSpec, parse_recipe, same_recipe, supported_pairs


def quantize(*args, **kwargs):
    from .api import quantize as _q
    return _q(*args, **kwargs)


__all__ = ["ALGORITHMS", "MANIFEST", "RecipeError", "RecipeSpec", "load_quantized_dir", "parse_recipe", "quantize",
           "same_recipe", "supported_pairs"]
