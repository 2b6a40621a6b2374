"""The quantized directory round-trips exactly, loads back into a model that computes the same logits, and the
CLI / API reject bad requests with clear errors before any long computation."""
import json

import numpy as np
import pytest
import torch

from lowbit.quantize import MANIFEST, load_quantized_dir  # noqa: E402
from lowbit.quantize import api, cli, parse_recipe, pipeline  # noqa: E402
from lowbit.quantize.testing import random_tokens, tiny_llama  # noqa: E402


@pytest.fixture
def calib(tmp_path):
    rng = np.random.default_rng(0)
    words = ["license", "software", "free", "copy", "the", "of", "and", "you", "program", "source"]
    path = tmp_path / "calib.txt"
    path.write_text(" ".join(rng.choice(words, 400)), encoding="utf-8")
    return path


@pytest.mark.parametrize("recipe,algo,opts", [("w4a8kv4", "qoq", {}), ("w4a4", "fmpq", {"outlier_ratio": 3.0}),
                                              ("w8a16", "gptq", {"act_order": True}), ("wfp8a16", "rtn", {}),
                                              ("w4a8g64-liquid", "liquid", {"alpha": 0.5}),
                                              ("w16a16kv4", "rtn", {"smooth_attention": True})])
def test_directory_roundtrip(tmp_path, calib, recipe, algo, opts):
    lm = tiny_llama(seed=2)
    out = tmp_path / "q"
    path, model, manifest = api.quantize(None, recipe, algo, out, calib=[calib], num_sequences=4, seq_len=40,
                                         progress=False, loaded=lm, **opts)
    assert (out / MANIFEST).is_file() and (out / "tokenizer.json").is_file()
    loaded, fields, mf = load_quantized_dir(out)
    # the manifest holds the canonical spelling (the C++ parser's): "w4a8g64-liquid" is written "w4a8-liquid"
    assert mf["recipe"] == parse_recipe(recipe).text and mf["algorithm"] == algo and mf["format_version"] == 1
    assert mf["recipe"] == {"w4a8g64-liquid": "w4a8-liquid"}.get(recipe, recipe)
    # + lm_head (the engine's RTN) under weight-only recipes; activation-quantized recipes keep it in float
    head = 1 if "a16" in recipe else 0
    expect_q = 0 if recipe.startswith("w16") else 7 * lm.config.num_layers + head
    assert len(fields) == expect_q
    for name, f in fields.items():
        # the loaded fields reproduce exactly the weights the in-memory model computed with
        from lowbit.quantize.formats import dequantize
        np.testing.assert_array_equal(dequantize(f), model.weights[name].numpy())
        assert f.q.shape == (f.n, f.k)
    if algo == "fmpq":
        assert mf["fmpq_int8_block_fraction"] and any("input_perm" in f.extra for f in fields.values())
    rebuilt, _ = api.fake_quant_model(out)
    tok = random_tokens(2, 24, seed=5)
    torch.testing.assert_close(rebuilt.logits(tok), model.logits(tok), rtol=1e-5, atol=1e-5)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] == ("lm_head.weight" not in loaded.tensors and "lm_head.weight" not in fields)


def test_u4_fields_stored_packed(tmp_path, calib):
    from safetensors.numpy import load_file
    lm = tiny_llama(seed=2)
    api.quantize(None, "w4a16g32", "rtn", tmp_path / "q", calib=[calib], num_sequences=2, seq_len=32,
                 progress=False, loaded=lm)
    raw = load_file(str(tmp_path / "q" / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    assert raw[name + ".q"].dtype == np.uint8 and raw[name + ".q"].shape == (64, 88)  # k = 176 -> 88 bytes
    assert raw[name + ".scales"].dtype == np.float16 and raw[name + ".scales"].shape == (64, 6)
    assert name not in raw  # the float weight is not stored twice


def _no_long_work(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("calibration started before the request was validated")
    monkeypatch.setattr(pipeline, "run", boom)


def test_errors_before_long_computation(tmp_path, calib, monkeypatch):
    _no_long_work(monkeypatch)
    lm = tiny_llama()
    with pytest.raises(ValueError, match=r"calibration text too short: \d+ tokens in 1 file\(s\), need 40000"):
        api.quantize(None, "w4a16", "awq", tmp_path, calib=[calib], num_sequences=100, seq_len=400, loaded=lm)
    with pytest.raises(ValueError, match="does not handle recipe 'w4a16'.*pairs that exist"):
        api.quantize(None, "w4a16", "smoothquant", tmp_path, calib=[calib], loaded=lm)
    odd = tiny_llama(hidden=36, heads=2, kv_heads=1, outlier_channels=(1,))
    with pytest.raises(ValueError, match="qoq cannot rotate hidden size 36"):
        api.quantize(None, "w4a8kv4", "qoq", tmp_path, calib=[calib], loaded=odd)
    with pytest.raises(ValueError, match="calibration: file\\(s\\) not found"):
        api.quantize(None, "w4a16", "rtn", tmp_path, calib=[tmp_path / "nope.txt"], loaded=lm)
    with pytest.raises(ValueError, match="kv_mode 'page'"):
        api.quantize(None, "w4a16kv4", "rtn", tmp_path, calib=[calib], kv_mode="page", loaded=lm)


def test_cli_reports_errors(tmp_path, calib, capsys, monkeypatch):
    _no_long_work(monkeypatch)
    rc = cli.main(["--recipe", "w8a8", "--algo", "gptq", "--out", str(tmp_path / "o"), "--calib", str(calib)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "algorithm 'gptq' does not handle recipe 'w8a8'" in err and "smoothquant: w8a8" in err
    rc = cli.main(["--recipe", "w9a8", "--algo", "rtn", "--out", str(tmp_path / "o"), "--calib", str(calib)])
    err = capsys.readouterr().err  # the C++ parser's message, naming the recipe and the position
    assert rc == 2 and "lowbit quantize: error: parse_recipe: bad recipe 'w9a8': weight bits must be" in err
    assert "at position 2" in err


def test_cli_passes_fmpq_options(tmp_path, monkeypatch):
    seen = {}

    def fake_quantize(*args, **kwargs):  # records the options instead of quantizing
        seen.update(kwargs)
        return tmp_path, None, {"recipe": "w4a4", "algorithm": "fmpq", "kv": {"k_bits": 16, "v_bits": 16}}
    monkeypatch.setattr(api, "quantize", fake_quantize)
    rc = cli.main(["--recipe", "w4a4", "--algo", "fmpq", "--out", str(tmp_path / "o"), "--calib", "x.txt",
                   "--fmpq-int8-fraction", "0.25", "--fmpq-awq-scales", "--quiet"])
    assert rc == 0 and seen["int8_fraction"] == 0.25 and seen["awq_scales"] is True


def test_load_rejects_non_quantized_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no lowbit_quant.json"):
        load_quantized_dir(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format_version": 99}))
    with pytest.raises(ValueError, match="format_version 99, this lowbit reads 1"):
        load_quantized_dir(tmp_path)
