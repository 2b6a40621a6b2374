"""quantize(): float checkpoint -> lowbit quantized directory, and fake_quant_model() to evaluate one in torch."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import torch

from . import pipeline
from .calibration import calibration_tokens
from .export import load_quantized_dir, write_quantized_dir
from .formats import dequantize, quantize_rtn
from .kv_quant import KVQuantizer
from .recipes import RecipeError, check_pair, parse_recipe
from .torch_model import FakeQuant, TorchLlama, perplexity


def algorithm_class(name: str):
    from .awq import AWQ
    from .fmpq import FMPQ
    from .gptq import make_gptq_algorithm
    from .liquid import LiquidQuant
    from .qoq import QoQ
    from .smoothquant import SmoothQuant
    return {"rtn": pipeline.RTNBase, "awq": AWQ, "gptq": make_gptq_algorithm(), "smoothquant": SmoothQuant,
            "qoq": QoQ, "liquid": LiquidQuant, "fmpq": FMPQ}[name]


KV_MODES = ("token", "channel", "static")


def check_model(loaded, algo: str) -> None:
    """Errors for a model the algorithm cannot handle, before any long computation."""
    cfg = loaded.config
    if cfg.arch not in ("llama", "mistral"):
        raise ValueError(f"lowbit quantize: architecture {cfg.arch!r} is not supported (llama, mistral)")
    if cfg.attention_bias:
        raise ValueError("lowbit quantize: models with attention biases are not supported by the equivalence "
                         "transforms")
    if algo == "qoq":
        from .hadamard import hadamard
        try:
            hadamard(cfg.hidden_size)
        except ValueError as e:
            raise ValueError(f"lowbit quantize: qoq cannot rotate hidden size {cfg.hidden_size}: {e}") from e


def _clone_model(model: TorchLlama) -> TorchLlama:
    m = TorchLlama(model.config, {k: v.clone() for k, v in model.weights.items()})
    m.fake = copy.deepcopy(model.fake)
    return m


def _search_smoothquant_alpha(base: TorchLlama, tokens: torch.Tensor, algo_cls, spec, options, progress, kv_mode):
    """SmoothQuant's per-model α: calibration NLL of the fake-quantized model on held-out calibration sequences."""
    from .smoothquant import ALPHA_GRID
    n = tokens.shape[0]
    fit, held = (tokens[: max(1, n // 2)], tokens[max(1, n // 2):]) if n > 1 else (tokens, tokens)
    fit = fit[:4]
    scores = {}
    for a in ALPHA_GRID:
        m = _clone_model(base)
        runner = algo_cls(spec, **dict(options, alpha=a))
        runner.clip = False  # the clip search does not depend on α much and dominates the cost
        pipeline.run(m, fit, runner, pipeline.Progress(False, 0), kv_mode)
        nll, cnt = m.nll(held)
        scores[a] = nll / cnt
        progress(None, f"alpha {a}: calibration NLL {scores[a]:.4f}")
    return min(scores, key=scores.get), scores


def quantize(model=None, recipe: str = "w4a16", algo: str = "rtn", out: str | Path | None = None,
             calib: list[str | Path] | None = None, num_sequences: int = 16, seq_len: int = 256,
             kv_mode: str | None = None, progress: bool = True, loaded=None, **options):
    """Quantize a float checkpoint. Returns (out path or None, fake-quantized TorchLlama, manifest).

    model: path (.gguf or HF dir) or None for the default model; `loaded` may pass a LoadedModel instead.
    calib: calibration .txt files or folders (required unless the recipe needs no calibration: rtn is still
    calibrated for KV/stat reporting, so pass it). options: act_order (gptq), alpha (smoothquant/liquid; searched
    when absent), outlier_ratio / int8_fraction / awq_scales (fmpq), rotate/smooth_attention/reorder (qoq),
    smooth_attention (any algorithm).
    kv_mode: the KV fake quantization seen during calibration; None follows the recipe ("channel" for
    per-channel K recipes such as kc4v4, else "token"). SmoothAttention folds into q/k weights for any K format.
    """
    spec = parse_recipe(recipe)
    check_pair(algo, spec)
    if out is not None and options.get("pow2_scales"):
        raise ValueError("lowbit quantize: fmpq option pow2_scales is a torch-model study (the engine's activation "
                         "format is the recipe's), so it is not written (pass out=None)")
    if out is not None and algo == "qoq":
        from .qoq import writable
        if not writable(options):
            raise ValueError("lowbit quantize: qoq options rotate=<sites> (online rotation) and "
                             "protective_range=False are ablations of the torch model; the engine cannot run them, "
                             "so they are not written (pass out=None)")
    # One thread: on a small shared CPU, OpenMP spin-waiting under contention costs more than it gains.
    torch.set_num_threads(int(os.environ.get("LOWBIT_QUANT_THREADS", "1")))
    if kv_mode is None:
        kv_mode = "channel" if spec.k_per_channel else "token"
    if kv_mode not in KV_MODES:
        raise RecipeError(f"lowbit quantize: kv_mode {kv_mode!r} is not one of {KV_MODES}")
    if spec.k_per_channel and kv_mode != "channel":
        raise RecipeError(f"lowbit quantize: recipe {spec.text!r} quantizes K per channel; kv_mode {kv_mode!r} "
                          "contradicts it (omit kv_mode or pass 'channel')")
    if not calib:
        raise ValueError("lowbit quantize: calibration text is required (--calib FILE_OR_DIR)")
    if loaded is None:
        from ..models import load_model_source
        loaded = load_model_source(model, progress=progress)
    if getattr(loaded, "fields", None):
        raise ValueError(f"lowbit quantize: {loaded.source} is already quantized ({loaded.manifest['algorithm']}, "
                         f"recipe {loaded.recipe}); quantizing needs a float checkpoint (run it as it is with "
                         "lowbit.LLM, or start from the float model)")
    check_model(loaded, algo)
    tokens = calibration_tokens(loaded.tokenizer, list(calib), num_sequences, seq_len)
    prog = pipeline.Progress(progress, loaded.config.num_layers)

    base = TorchLlama(loaded.config, loaded.tensors)
    algo_cls = algorithm_class(algo)
    alpha_scores = None
    if algo in ("smoothquant", "liquid") and "alpha" not in options:
        options["alpha"], alpha_scores = _search_smoothquant_alpha(base, tokens, algo_cls, spec, options, prog,
                                                                   kv_mode)
    runner = algo_cls(spec, **options)
    if options.get("smooth_attention") and algo != "qoq":
        runner = _with_smooth_attention(runner)
    fields, stats = pipeline.run(base, tokens, runner, prog, kv_mode)
    manifest = {
        "recipe": spec.text, "algorithm": algo,
        "weight_format": spec.weight_format, "group": spec.group, "activation": spec.act or "float",
        "kv": {"k_bits": spec.k_bits, "v_bits": spec.v_bits, "mode": kv_mode},
        "parameters": dict(_plain(options), **_plain(runner.params)),
        "calibration": {"files": [str(Path(c).name) for c in calib], "num_sequences": num_sequences,
                        "seq_len": seq_len},
        "layers": stats["layers"],
    }
    if alpha_scores:
        manifest["parameters"]["alpha_search_nll"] = alpha_scores
    if algo == "fmpq":
        manifest["fmpq_int8_block_fraction"] = {n: f.extra["int8_block_fraction"] for n, f in fields.items()}
    if spec.weight_format is not None and spec.act is None:
        # Under weight-only recipes the engine quantizes lm_head with the recipe's format too; storing it makes the
        # directory say so. Activation-quantized recipes keep lm_head in f16 (float activations need it).
        head = quantize_rtn(base.lm_head_weight(), spec.weight_format, spec.group or 128, runner.symmetric)
        fields["lm_head.weight"] = head
        base.weights["lm_head.weight"] = torch.from_numpy(dequantize(head))
        manifest["lm_head"] = "rtn"
    path = None
    if out is not None:
        prog(None, f"write {out}")
        float_tensors = {k: v.numpy() for k, v in base.weights.items() if k not in fields}
        if kv_mode == "static":
            for (layer, which), (lo, hi) in stats["kv_static_ranges"].items():
                float_tensors[f"kv.{layer}.{which}_min"] = lo.reshape(-1).numpy()
                float_tensors[f"kv.{layer}.{which}_max"] = hi.reshape(-1).numpy()
        path = write_quantized_dir(out, loaded, float_tensors, fields, base.fake.input_perm, manifest)
    return path, base, manifest


def _plain(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, torch.Tensor):
            v = v.tolist()
        out[str(k)] = _plain(v) if isinstance(v, dict) else v
    return out


def _with_smooth_attention(runner):
    """Adds QoQ's SmoothAttention (QServe §3.2) to any algorithm's per-layer transforms (for KV4 studies)."""
    from . import transforms as T
    inner = runner.transform_layer

    def transform_layer(model, i, cap):
        T.smooth_attention(model, i, T.smooth_attention_scales(cap["keys"], 0.5))
        inner(model, i, cap)
        return True

    runner.transform_layer = transform_layer
    runner.params["smooth_attention"] = True
    return runner


def fake_quant_model(path: str | Path, kv_mode: str | None = None) -> tuple[TorchLlama, dict]:
    """A TorchLlama that computes what a quantized directory means (dequantized weights, fake act/KV quant)."""
    loaded, fields, manifest = load_quantized_dir(path)
    tensors = dict(loaded.tensors)
    for name, f in fields.items():
        tensors[name] = dequantize(f)
    fake = FakeQuant(act_quant=None if manifest["activation"] == "float" else manifest["activation"])
    for name, f in fields.items():
        if "input_perm" in f.extra:
            fake.input_perm[name] = f.extra["input_perm"]
        if "fmpq_block_bits" in f.extra:
            fake.fmpq_block_bits[name] = f.extra["fmpq_block_bits"]
    kv = manifest["kv"]
    mode = kv_mode or kv["mode"]
    if kv["k_bits"] < 16 or kv["v_bits"] < 16:
        ranges = {}
        if mode == "static":
            for i in range(loaded.config.num_layers):
                for w in ("k", "v"):
                    shape = (1, loaded.config.num_kv_heads, 1, loaded.config.head_dim)
                    ranges[(i, w)] = (torch.from_numpy(loaded.tensors.pop(f"kv.{i}.{w}_min")).view(shape),
                                      torch.from_numpy(loaded.tensors.pop(f"kv.{i}.{w}_max")).view(shape))
        fake.kv = KVQuantizer(kv["k_bits"], kv["v_bits"], k_mode=mode, v_mode="static" if mode == "static" else "token",
                              static_ranges=ranges)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("kv.")}
    return TorchLlama(loaded.config, tensors, fake), manifest


def eval_perplexity(model: TorchLlama, tokenizer, text_path: str | Path, max_tokens: int = 4096,
                    window: int = 1024) -> float:
    ids = tokenizer.encode(Path(text_path).read_text(encoding="utf-8"), add_special_tokens=False)[:max_tokens]
    return perplexity(model, ids, window)
