"""Real compressed-tensors checkpoints, made by llm-compressor itself (oneshot with QuantizationModifier's presets on a
tiny Llama, on the CPU; no calibration data: every preset here is data-free), load in lowbit with the file's
integers: the engine's logits match a float64 model whose linears are the checkpoint decompressed by
compressed-tensors' own compressors. W4A16 (int4 g128) and W8A16 (int8 in groups of 128, lowbit's grouped w8) run
weight-only, compared as test_hf_quantized_checkpoints.py compares its hand-built files; W8A8 and FP8_DYNAMIC quantize
the activations per token at run time, compared with the same activation rule as
test_compressed_tensors_dynamic_activations. Skipped where llmcompressor is not installed (it needs `datasets`)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("compressed_tensors")
pytest.importorskip("llmcompressor")

import lowbit  # noqa: E402
from lowbit.models import load_model_source  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_quant_checkpoints as ck  # noqa: E402
from test_hf_quantized_checkpoints import IDS, TOL, check_dynamic_activations, reference_logits, rel  # noqa: E402

# preset -> (lowbit recipe, activation rule of the reference)
PRESETS = {"W4A16": ("w4a16g128", None), "W8A16": ("w8a16g128", None), "W8A8": ("w8a8", "int8"),
           "FP8_DYNAMIC": ("wfp8a8", "fp8")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM
    root = tmp_path_factory.mktemp("llmcompressor")
    model = ck.base_model(seed=5)
    float_dir = ck.write_float_dir(root / "float", model)
    out = {}
    for preset in PRESETS:
        hf = AutoModelForCausalLM.from_pretrained(str(float_dir), dtype=torch.float16)
        oneshot(model=hf, recipe=QuantizationModifier(targets="Linear", scheme=preset, ignore=["lm_head"]))
        out[preset] = root / preset
        hf.save_pretrained(str(out[preset]), save_compressed=True)
        model.tokenizer.save(out[preset])
    shutil.rmtree(float_dir)
    return out, model


def decompressed(path: Path):
    """Every tensor the checkpoint means, in f32: each quantized module through compressed-tensors' own compressor
    for its format (scales widened to f32 first, so the library's arithmetic is exact), the rest as stored."""
    from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file
    cfg = QuantizationConfig.model_validate(json.loads((path / "config.json").read_text())["quantization_config"])
    scheme = cfg.config_groups["group_0"]
    compressor = PackedQuantizationCompressor if cfg.format == "pack-quantized" else NaiveQuantizationCompressor
    raw = load_file(str(path / "model.safetensors"))
    modules = {k[: -len(".weight_scale")] for k in raw if k.endswith(".weight_scale")}
    dense = {k: v.float().numpy() for k, v in raw.items() if not any(k.startswith(m + ".") for m in modules)}
    for m in modules:
        sd = {k[len(m) + 1:]: v for k, v in raw.items() if k.startswith(m + ".")}
        sd["weight_scale"] = sd["weight_scale"].float()
        dense[m + ".weight"] = compressor.decompress(sd, scheme)["weight"].float().numpy()
    return dense


@pytest.mark.parametrize("preset", ["W4A16", "W8A16"])
def test_weight_only_presets_match_the_librarys_decompression(checkpoints, preset):
    paths, model = checkpoints
    recipe, _ = PRESETS[preset]
    assert load_model_source(paths[preset], progress=False).recipe == recipe
    got = lowbit.LLM(str(paths[preset]), dtype="f32", progress=False).logits(IDS)
    err = rel(got, reference_logits(model, decompressed(paths[preset]), recipe))
    print(preset, "relative logit error vs the float64 model of compressed-tensors' decompression:", err)
    assert err < TOL


@pytest.mark.parametrize("preset", ["W8A8", "FP8_DYNAMIC"])
def test_dynamic_activation_presets_match_the_librarys_decompression(checkpoints, preset):
    """As test_compressed_tensors_dynamic_activations: most sequences agree to f32 precision, none by more than half
    of what activation quantization itself changes."""
    paths, model = checkpoints
    recipe, act = PRESETS[preset]
    assert load_model_source(paths[preset], progress=False).recipe == recipe
    check_dynamic_activations(paths[preset], model.config, decompressed(paths[preset]), act, label=preset)
