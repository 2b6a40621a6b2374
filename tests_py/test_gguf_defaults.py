"""Recipe defaults follow the file: with no recipe, a GGUF file on the CPU runs its own precision (Q4_0 / Q4_1 ->
w4a16g32 with the stored weights, Q8_0 -> w8a16g32, float / K-quant / mixed files -> w16a16), says so once, and an
explicit recipe is kept; `lowbit info` lists per group of tensors the file's type, the lowbit format and how."""
import numpy as np
import pytest

import lowbit
from lowbit import cli
from lowbit.models.gguf_choice import file_recipe
from test_gguf_native import LINEAR_SUFFIXES
from test_llm import tiny_tensors
from test_models_loader import _default_gguf, _tiny_config, make_gguf

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType


def _file(tmp_path, types):
    """A tiny Llama whose linears cycle through `types` (GGUF type names; "F32" = unquantized)."""
    config = _tiny_config()
    tensors = tiny_tensors(config, seed=4)
    linears = sorted(n for n in tensors if n.endswith(LINEAR_SUFFIXES))
    qtypes = {n: T[types[i % len(types)]] for i, n in enumerate(linears) if types[i % len(types)] != "F32"}
    return make_gguf(tmp_path / f"tiny-{'-'.join(types)}.gguf", config, tensors, qtypes=qtypes)


@pytest.mark.parametrize("types,recipe,stored", [
    (["Q4_0"], "w4a16g32", "Q4_0 weights loaded as stored"),
    (["Q4_1"], "w4a16g32", "Q4_1 weights loaded as stored"),
    (["Q8_0"], "w8a16g32", "Q8_0 weights loaded as stored"),
    (["F16"], "w16a16", None),
    (["F32"], "w16a16", None),
    (["Q4_0", "Q8_0"], "w16a16", None),
])
def test_no_recipe_runs_the_files_precision(tmp_path, capfd, types, recipe, stored):
    path = _file(tmp_path, types)
    llm = lowbit.LLM(path, progress=True)
    err = capfd.readouterr().err
    assert llm.recipe == recipe
    quantized = [t for t in types if t not in ("F16", "F32")]
    assert err.count("no recipe given") == (1 if quantized else 0), err  # said once, and only for a quantized file
    if stored:
        assert f"no recipe given; {recipe} follows the file (its linears are {types[0]})" in err
        assert stored in err and stored in llm.load_note
    if len(quantized) > 1:
        assert "no recipe given; w16a16 follows the file (it mixes Q4_0/Q8_0 linears" in err
    # an explicit recipe is kept as given, and nothing is said about defaults
    explicit = lowbit.LLM(path, recipe="w16a16", progress=True)
    assert explicit.recipe == "w16a16" and "no recipe given" not in capfd.readouterr().err


def test_float_linears_beside_stored_ones_are_named(tmp_path, capfd):
    """A Q4_1 file with a float linear: no recipe keeps the Q4_1 ones as stored and says that the float one is
    quantized round-to-nearest (lossy), naming it; `lowbit info` shows the same."""
    config = _tiny_config()
    tensors = tiny_tensors(config, seed=4)
    qtypes = {n: T.Q4_1 for n in tensors if n.endswith(LINEAR_SUFFIXES) and n != "model.layers.1.mlp.down_proj.weight"}
    llm = lowbit.LLM(make_gguf(tmp_path / "tiny-mostly-q4_1.gguf", config, tensors, qtypes=qtypes), progress=True)
    err = capfd.readouterr().err
    assert llm.recipe == "w4a16g32" and "13 Q4_1 weights loaded as stored" in err
    assert "the file's float linears are quantized round-to-nearest to w4 g32 (recipe w4a16g32; recipe w16a16 keeps " \
           "every linear exact): ffn_down of blk.1 (1 tensor)" in err
    assert any(r["how"] == "quantized at load (round to nearest)" and r["tensors"] == "ffn_down"
               for r in llm.tensor_report)


def test_no_recipe_logits_are_the_stored_weights(tmp_path):
    """The default's engine computes with the file's weights: the same logits as w16a16 (the exact dequantized
    values) up to f32 summation order, for each stored type."""
    import torch
    ids = [5, 80, 33, 120, 7, 250, 64, 9]
    for t in ("Q4_0", "Q4_1", "Q8_0"):
        path = _file(tmp_path, [t])
        a, b = (torch.from_dlpack(lowbit.LLM(path, recipe=r, progress=False).engine.logits(ids)).double()
                for r in (None, "w16a16"))
        assert float((a - b).norm() / b.norm()) < 1e-5, t


def test_file_recipe_keeps_what_runs_as_stored_on_both_devices():
    assert file_recipe({"Q4_1": 210, "F32": 0})[0] == "w4a16g32"
    assert file_recipe({"Q8_0": 7})[0] == "w8a16g32"
    assert file_recipe({"Q4_K": 100, "Q6_K": 10})[0] == "w16a16"
    assert file_recipe({})[0] == "w16a16"


def test_default_model_runs_its_q4_1_weights():
    llm = lowbit.LLM(_default_gguf(), progress=False)
    assert llm.recipe == "w4a16g32"
    assert "210 Q4_1 weights loaded as stored" in llm.load_note
    assert "lm_head (Q8_0 in the file) as w8 g32, stored" in llm.load_note


def test_info_lists_each_group_of_tensors(tmp_path, capsys):
    path = _file(tmp_path, ["Q8_0"])
    assert cli.main(["info", "--model", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "recipe      w8a16g32 (compute f32, device cpu)" in out
    assert "tensors     (GGUF type -> lowbit format: how)" in out
    rows = {line.split(" x ")[0].rsplit(None, 1)[0].strip(): line for line in out.splitlines() if " x " in line}
    linear = rows["attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down"]
    assert linear.endswith("14 x Q8_0  -> w8 g32: stored (no re-quantization)"), linear
    # the float tensors, lm_head ("output") included: it keeps the file's width when the linears run as stored
    assert rows["token_embd, attn_norm, ffn_norm, output_norm, output"].endswith("7 x F32   -> f32: as is")
    # re-quantized and dequantized rows
    assert cli.main(["info", "--model", str(path), "--quiet", "--recipe", "w4a16g64"]) == 0
    out = capsys.readouterr().out
    assert "14 x Q8_0  -> w4 g64: dequantized exactly, re-quantized (round to nearest)" in out
    assert cli.main(["info", "--model", str(path), "--quiet", "--recipe", "w16a16"]) == 0
    assert "14 x Q8_0  -> f32: dequantized exactly" in capsys.readouterr().out


def test_info_of_the_default_model():
    from lowbit.info import format_info, model_info
    out = format_info(model_info(lowbit.LLM(progress=False)))
    assert "210 x Q4_1  -> w4 g32 + min: stored (no re-quantization)" in out
    assert "1 x Q8_0  -> w8 g32: stored (no re-quantization)" in out  # the tied output layer
    assert "1 x Q8_0  -> f32: dequantized exactly" in out             # the embedding table
    np.testing.assert_equal(out.count("tensors     "), 1)
