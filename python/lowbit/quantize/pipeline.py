"""The layer-by-layer calibration loop shared by every algorithm.

    prepare (global equivalence transforms, e.g. QoQ's rotation)
    h = embeddings of the calibration tokens
    for each layer:  capture float inputs -> per-layer transforms -> (re)capture -> quantize each linear
                     (weights replaced by their dequantized values) -> h = layer(h) with the quantized weights,
                     fake-quantized activations and KV cache (so later layers calibrate on what they will see)
An algorithm is an object with `prepare(model, tokens)`, `transform_layer(model, i, cap) -> bool` (True when it
changed weights) and `quantize_linear(model, name, x) -> QuantFields` (x: [T, k] calibration inputs).
"""
from __future__ import annotations

import sys
import time

import torch

from .formats import PROTECTIVE_MAX, QuantFields, dequantize, quantize_rtn
from .kv_quant import KVQuantizer, kv_ranges_from_capture
from .recipes import RecipeSpec
from .torch_model import FakeQuant, TorchLlama, linear_name

# capture key -> the linears reading that input
SITES = {"q_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
         "gate_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


class Progress:
    def __init__(self, enabled: bool, total_layers: int):
        self.enabled, self.total, self.t0 = enabled, total_layers, time.time()

    def __call__(self, layer: int | None, stage: str) -> None:
        if self.enabled:
            where = "model" if layer is None else f"layer {layer + 1}/{self.total}"
            print(f"lowbit quantize [{time.time() - self.t0:6.1f}s] {where}: {stage}", file=sys.stderr, flush=True)


class RTNBase:
    """Round-to-nearest of the recipe's format; algorithms override what they improve."""
    name = "rtn"
    clip = False

    def __init__(self, spec: RecipeSpec, **options):
        self.spec = spec
        self.options = options
        self.params: dict = {}

    symmetric = False  # w4 weights keep their zero point (AWQ/GPTQ convention)
    s8_max = PROTECTIVE_MAX  # level-1 range of the qoq/liquid formats

    def fake_quant(self, w: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(dequantize(quantize_rtn(w, self.spec.weight_format, self.spec.group or 128,
                                                        self.symmetric, self.s8_max)))

    def prepare(self, model: TorchLlama, tokens: torch.Tensor, progress: Progress) -> None:
        pass

    def act_quant(self) -> str | None:
        """The activation fake quantization later layers calibrate under (FakeQuant.act_quant)."""
        return self.spec.act

    def transform_layer(self, model: TorchLlama, i: int, cap: dict) -> bool:
        return False

    def quantize_linear(self, model: TorchLlama, name: str, x: torch.Tensor) -> QuantFields:
        w = model.weights[name]
        extra = {}
        if self.clip:
            from .clipping import clip_search
            w, extra["clip_ratio"] = clip_search(w, subsample(x, 256), self.fake_quant, self.spec.group)
        f = quantize_rtn(w, self.spec.weight_format, self.spec.group or 128, self.symmetric, self.s8_max)
        f.extra.update(extra)
        return f


def subsample(x: torch.Tensor, n: int) -> torch.Tensor:
    if x.shape[0] <= n:
        return x
    idx = torch.linspace(0, x.shape[0] - 1, n).long()
    return x[idx]


def capture(model: TorchLlama, i: int, h: torch.Tensor) -> dict:
    saved = model.fake
    model.fake = FakeQuant(input_perm=saved.input_perm, fmpq_block_bits=saved.fmpq_block_bits,
                           input_rotation=saved.input_rotation)
    cap: dict = {}
    with torch.no_grad():
        model.layer(i, h, cap)
    model.fake = saved
    for key in SITES:
        cap[key] = cap[key].reshape(-1, cap[key].shape[-1])
    return cap


def run(model: TorchLlama, tokens: torch.Tensor, algo: RTNBase, progress: Progress,
        kv_mode: str = "token") -> tuple[dict[str, QuantFields], dict]:
    """Quantizes `model` in place (weights become their dequantized values). Returns (fields, layer stats)."""
    spec = algo.spec
    fields: dict[str, QuantFields] = {}
    stats: dict = {"layers": []}
    kv_ranges: dict = {}
    progress(None, f"prepare ({algo.name})")
    with torch.no_grad():
        algo.prepare(model, tokens, progress)
        h = model.embed(tokens)
        for i in range(model.config.num_layers):
            progress(i, "capture")
            cap = capture(model, i, h)
            if algo.transform_layer(model, i, cap):
                progress(i, "transforms applied, recapture")
                cap = capture(model, i, h)
            layer_stats = {"layer": i}
            if spec.weight_format is not None:
                for site, users in SITES.items():
                    x = cap[site]
                    for short in users:
                        name = linear_name(i, short)
                        perm = model.fake.input_perm.get(name)
                        xs = x[:, torch.as_tensor(perm)] if perm is not None else x
                        rot = model.fake.input_rotation.get(name)
                        if rot is not None:  # an online rotation: the weight holds W·R and sees x·R
                            xs = xs @ rot
                        progress(i, f"quantize {short}")
                        f = algo.quantize_linear(model, name, xs)
                        model.weights[name] = torch.from_numpy(dequantize(f))
                        fields[name] = f
                        if f.extra:
                            layer_stats[short] = dict(f.extra)
            stats["layers"].append(layer_stats)
            for (which, rng) in kv_ranges_from_capture(cap["keys"], cap["values"]).items():
                kv_ranges[(i, which)] = rng
            if spec.k_bits < 16 or spec.v_bits < 16:
                model.fake.kv = KVQuantizer(spec.k_bits, spec.v_bits, k_mode=kv_mode,
                                            v_mode="static" if kv_mode == "static" else "token",
                                            static_ranges=kv_ranges)
            model.fake.act_quant = algo.act_quant()
            h = model.layer(i, h)
    stats["kv_static_ranges"] = kv_ranges
    return fields, stats
