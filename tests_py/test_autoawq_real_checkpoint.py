"""A real AutoAWQ checkpoint, made by the autoawq library itself (activation-aware scale search, clipping and
WQLinear_GEMM packing on the CPU), loads in lowbit with the file's integers: the engine's logits match a float64
transformers Llama whose linears are the checkpoint unpacked by AutoAWQ's own code (awq.utils.packing_utils.
dequantize_gemm) and whose norms and embeddings are the file's (AWQ folds its scales into them). The hand-built
AutoAWQ tensors of test_hf_quantized_checkpoints.py check the layout; this checks the producer. Skipped where
autoawq is not installed (its import also needs `datasets`)."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")
awq = pytest.importorskip("awq")

import lowbit  # noqa: E402
from lowbit.models import load_model_source  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_quant_checkpoints as ck  # noqa: E402
from test_hf_quantized_checkpoints import IDS, TOL, reference_logits, rel  # noqa: E402


@pytest.fixture(scope="module")
def awq_checkpoint(tmp_path_factory):
    from awq import AutoAWQForCausalLM
    root = tmp_path_factory.mktemp("autoawq")
    model = ck.base_model(seed=3)  # untied lm_head, outlier channels for the scale search to find
    float_dir = ck.write_float_dir(root / "float", model)
    awq_model = AutoAWQForCausalLM.from_pretrained(str(float_dir))
    g = torch.Generator().manual_seed(4)
    calib = [torch.randint(0, 256, (64,), generator=g).tolist() for _ in range(16)]  # token ids: no data set
    awq_model.quantize(None, quant_config={"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"},
                       calib_data=calib, max_calib_samples=16, max_calib_seq_len=64)
    out = root / "awq"
    awq_model.save_quantized(str(out))
    model.tokenizer.save(out)  # AutoAWQ saves no tokenizer without one
    shutil.rmtree(float_dir)
    return out, model


def checkpoint_dense(path: Path):
    """Every tensor the checkpoint means: linears unpacked by AutoAWQ's own dequantize_gemm ([k, n] -> [n, k]),
    everything else as stored."""
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file
    t = load_file(str(path / "model.safetensors"))
    dense = {}
    for name, v in t.items():
        if name.endswith(".qweight"):
            base = name[: -len(".qweight")]
            # f64 scales: the values the file means, (q - z) * s, without the f16 rounding of AutoAWQ's own kernels
            w = dequantize_gemm(v, t[base + ".qzeros"], t[base + ".scales"].double(), 4, 128)
            dense[base + ".weight"] = w.T.contiguous().numpy()
        elif not name.endswith((".qzeros", ".scales")):
            dense[name] = v.float().numpy()
    return dense


def test_autoawq_checkpoint_matches_autoawqs_own_unpacking(awq_checkpoint):
    path, model = awq_checkpoint
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "awq" and qc["version"] == "gemm" and qc["group_size"] == 128, qc
    assert load_model_source(path, progress=False).recipe == "w4a16g128"
    dense = checkpoint_dense(path)
    # The checkpoint is the model quantized: each linear within 4-bit g128 error of the original (AWQ scales
    # fold into the norms, so compare the products the layer computes for q_proj: norm * W).
    norm0 = dense["model.layers.0.input_layernorm.weight"]
    w_q = dense["model.layers.0.self_attn.q_proj.weight"] * norm0[None, :]
    orig = model.tensors["model.layers.0.self_attn.q_proj.weight"] * model.tensors["model.layers.0.input_layernorm.weight"][None, :]
    assert np.abs(w_q - orig).max() < 0.2 * np.abs(orig).max()
    moved = max(float(np.abs(dense[k] / model.tensors[k] - 1).max()) for k in dense if k.endswith("layernorm.weight"))
    print("AutoAWQ checkpoint: largest relative change of a norm weight (the folded AWQ scales):", moved)
    assert moved > 1e-2  # the scale search ran and folded its scales: not a plain round-to-nearest file
    got = lowbit.LLM(str(path), dtype="f32", progress=False).logits(IDS)
    err = rel(got, reference_logits(model, dense, "w4a16g128"))
    print("AutoAWQ checkpoint: relative logit error vs the float64 model of AutoAWQ's own unpacking:", err)
    assert err < TOL
