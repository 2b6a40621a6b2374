"""Real GPTQ checkpoints, made by the gptqmodel library itself (GPTQ's Hessian-based quantization, act-order,
packing and its v2 -> v1 export on the CPU), load in lowbit with the file's integers: the engine's logits match a
float64 transformers Llama whose linears are the checkpoint as gptqmodel's own loader reads it back (its v1 -> v2
zero-point conversion, then BaseQuantLinear.dequantize_weight with the file's scales in float64), and every lowbit
field dequantizes to exactly that weight. Symmetric and asymmetric, desc_act on (act-order g_idx) and off, groups
of 32 and 128. Some rows of the float model are made all-positive, so the asymmetric quantizer gives them zero
point 0, which gptqmodel's v1 export stores by subtracting 0x11111111 from the whole int32 word (a borrow into the
next field): the test that lowbit reads that convention. The same through transformers' GPTQConfig (optimum's
GPTQQuantizer on gptqmodel), which saves gptq_v2 (zero points as they are) for both symmetries.
Skipped where gptqmodel (for the second test, optimum) is not installed."""
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
# gptqmodel sizes its loader thread pool as 2 workers under a CPU pool of (cores + 1) // 2, which fails on a
# machine with fewer than 3 cores unless the CPU pool is sized explicitly.
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
gptqmodel = pytest.importorskip("gptqmodel")

import lowbit  # noqa: E402
from lowbit.models import load_model_source  # noqa: E402
from lowbit.quantize.formats import dequantize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_quant_checkpoints as ck  # noqa: E402
from test_hf_quantized_checkpoints import IDS, TOL, reference_logits, rel  # noqa: E402

# (sym, desc_act, group): both group sizes, act-order on and off, each symmetry with each.
CASES = [(True, False, 128), (False, False, 32), (True, True, 32), (False, True, 128)]
POSITIVE_ROWS = (0, 2, 9)  # layer-0 q_proj / gate_proj rows with zero 0: qzeros word 0 fields 0, 2; word 1 field 1


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{'sym' if c[0] else 'asym'}-"
                                                           f"{'desc_act' if c[1] else 'no_desc_act'}-g{c[2]}")
def gptq_checkpoint(request, tmp_path_factory):
    from gptqmodel import GPTQModel, QuantizeConfig
    sym, desc_act, group = request.param
    root = tmp_path_factory.mktemp("gptqmodel")
    model = positive_rows(ck.base_model(seed=5))
    float_dir = ck.write_float_dir(root / "float", model)
    qc = QuantizeConfig(bits=4, group_size=group, sym=sym, desc_act=desc_act)
    gm = GPTQModel.load(str(float_dir), qc, dtype=torch.float16)
    g = torch.Generator().manual_seed(6)
    calib = [{"input_ids": torch.randint(0, 256, (1, 64), generator=g),
              "attention_mask": torch.ones(1, 64, dtype=torch.long)} for _ in range(16)]  # token ids: no data set
    gm.quantize(calib, batch_size=1)
    out = root / "gptq"
    gm.save(str(out))
    shutil.rmtree(float_dir)
    return out, model, request.param


def positive_rows(model):
    """Some rows all-positive: an asymmetric quantizer gives them zero point 0 (a borrow in GPTQModel's v1)."""
    for m in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight"):
        w = model.tensors[m]
        rows = list(POSITIVE_ROWS)
        w[rows] = np.abs(w[rows]) + 0.25 * np.abs(w[rows]).max(axis=1, keepdims=True)
    return model


def checkpoint_dense(path: Path):
    """Every tensor the checkpoint means: linears as gptqmodel's own loader reads them (GPTQModel.load on the CPU
    torch kernel, which converts v1 zero points to its v2 form) and unpacks them (dequantize_weight, [k, n] ->
    [n, k]), with the file's f16 scales in float64; everything else as stored."""
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear
    from safetensors.torch import load_file
    t = load_file(str(path / "model.safetensors"))
    loaded = GPTQModel.load(str(path), backend=BACKEND.GPTQ_TORCH, device="cpu")
    dense = {k: v.double().numpy() for k, v in t.items() if not k.endswith((".qweight", ".qzeros", ".scales",
                                                                            ".g_idx"))}
    count = 0
    for name, mod in loaded.model.named_modules():
        if isinstance(mod, BaseQuantLinear):
            # the loader may hold scales in another dtype (bf16 on the CPU); the file's are the values meant
            mod.scales.data = t[name + ".scales"].double()
            dense[name + ".weight"] = mod.dequantize_weight().T.contiguous().numpy()
            count += 1
    assert count == 14, count  # 2 layers x 7 linears; lm_head stays float
    return t, dense


def stored_zero_fields(qzeros: torch.Tensor) -> np.ndarray:
    words = qzeros.numpy().view(np.uint32)
    return (words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF


def test_gptqmodel_checkpoint_matches_gptqmodels_own_unpacking(gptq_checkpoint):
    path, model, (sym, desc_act, group) = gptq_checkpoint
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["bits"], qc["group_size"], qc["sym"], qc["desc_act"]) == \
        ("gptq", 4, group, sym, desc_act), qc
    assert qc.get("checkpoint_format", qc.get("format")) == "gptq", qc  # gptqmodel exports v1 (zero - 1)
    t, dense = checkpoint_dense(path)
    loaded = load_model_source(path, progress=False)
    assert loaded.recipe == f"w4a16g{group}"
    # The checkpoint is the model quantized: each linear near the original (GPTQ moves weights to cancel earlier
    # columns' error, so single weights move by more than half a step; a misread file is ~1.4 away, not ~0.2).
    for m in ck.modules(model):
        w, orig = dense[m + ".weight"], model.tensors[m + ".weight"]
        assert np.linalg.norm(w - orig) < 0.5 * np.linalg.norm(orig), m
    # act-order: groups are not contiguous runs of input channels and lowbit permutes the input; without it
    # gptqmodel's default group-aware reordering (meta.act_group_aware) still writes the plain g_idx.
    contiguous = np.array_equal(t["model.layers.0.mlp.down_proj.g_idx"].numpy(), np.arange(384) // group)
    assert contiguous != desc_act
    assert all((f.extra.get("input_perm") is not None) == desc_act for f in loaded.fields.values())
    fields = stored_zero_fields(t["model.layers.0.self_attn.q_proj.qzeros"])  # [G, n/8, 8]
    if sym:
        assert (fields == 7).all()
    else:
        # zero 0 in field 0 of word 0 is stored as 15 with a borrow: field 1 holds its zero - 2
        assert (fields[:, 0, 0] == 15).all() and (fields[:, 0, 2] == 15).all()
    # lowbit's fields, dequantized, are exactly gptqmodel's weights (columns in lowbit's act-order permutation)
    for name, f in loaded.fields.items():
        perm = f.extra.get("input_perm")
        want = dense[name] if perm is None else dense[name][:, perm]
        np.testing.assert_array_equal(dequantize(f).astype(np.float64), want, err_msg=name)
        assert f.symmetric == sym
    got = lowbit.LLM(str(path), dtype="f32", progress=False).logits(IDS)
    err = rel(got, reference_logits(model, dense, f"w4a16g{group}"))
    print(f"gptqmodel checkpoint sym={sym} desc_act={desc_act} g{group}: relative logit error vs the float64 "
          f"model of gptqmodel's own unpacking: {err:.2e}")
    assert err < TOL


def test_gptqmodel_checkpoint_without_its_name_reads_the_same(gptq_checkpoint, tmp_path):
    """A gptqmodel v1 file whose meta.quantizer was stripped: the borrows in its qzeros (a 15 below a field that is
    not 15) identify GPTQModel's word offset, so every linear reads as with the name (which the test above checks
    against gptqmodel's own unpacking)."""
    path, _, (sym, _, _) = gptq_checkpoint
    stripped = tmp_path / "stripped"
    shutil.copytree(path, stripped)
    cfg = json.loads((stripped / "config.json").read_text())
    assert any("gptqmodel" in str(x).lower() for x in cfg["quantization_config"]["meta"]["quantizer"])
    del cfg["quantization_config"]["meta"]
    (stripped / "config.json").write_text(json.dumps(cfg))
    want = load_model_source(path, progress=False).fields
    got = load_model_source(stripped, progress=False).fields
    assert got.keys() == want.keys()
    for name, f in got.items():
        np.testing.assert_array_equal(dequantize(f), dequantize(want[name]), err_msg=name)


@pytest.mark.parametrize("sym,desc_act,group", [(True, True, 128), (False, False, 32)],
                         ids=["sym-desc_act-g128", "asym-no_desc_act-g32"])
def test_transformers_gptqconfig_checkpoint_matches_gptqmodels_own_unpacking(tmp_path, sym, desc_act, group):
    """transformers.GPTQConfig -> optimum's GPTQQuantizer (on gptqmodel) -> save_pretrained, loaded as above."""
    pytest.importorskip("optimum.gptq")
    import transformers
    model = positive_rows(ck.base_model(seed=7))
    float_dir = ck.write_float_dir(tmp_path / "float", model)
    tok = transformers.AutoTokenizer.from_pretrained(str(float_dir))
    g = torch.Generator().manual_seed(8)
    texts = [tok.decode(torch.randint(0, 256, (64,), generator=g).tolist()) for _ in range(16)]
    cfg = transformers.GPTQConfig(bits=4, group_size=group, sym=sym, desc_act=desc_act, dataset=texts, tokenizer=tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(float_dir), quantization_config=cfg,
                                                           dtype=torch.float16, device_map="cpu")
    path = tmp_path / "gptq"
    hf.save_pretrained(str(path))
    model.tokenizer.save(path)
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["checkpoint_format"] == "gptq_v2", qc["checkpoint_format"]
    assert any(x.startswith("optimum:") for x in qc["meta"]["quantizer"]), qc["meta"]
    t, dense = checkpoint_dense(path)
    loaded = load_model_source(path, progress=False)
    assert loaded.recipe == f"w4a16g{group}"
    if not sym:  # zero points of 0 stored as such (v2)
        assert (stored_zero_fields(t["model.layers.0.self_attn.q_proj.qzeros"])[:, 0, 0] == 0).all()
    for name, f in loaded.fields.items():
        perm = f.extra.get("input_perm")
        assert (perm is not None) == desc_act and f.symmetric == sym
        want = dense[name] if perm is None else dense[name][:, perm]
        np.testing.assert_array_equal(dequantize(f).astype(np.float64), want, err_msg=name)
    got = lowbit.LLM(str(path), dtype="f32", progress=False).logits(IDS)
    err = rel(got, reference_logits(model, dense, f"w4a16g{group}"))
    print(f"transformers GPTQConfig checkpoint sym={sym} desc_act={desc_act} g{group}: relative logit error vs the "
          f"float64 model of gptqmodel's own unpacking: {err:.2e}")
    assert err < TOL
