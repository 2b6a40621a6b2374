"""HF quantized checkpoints (AutoAWQ GEMM, GPTQ v1/v2 with and without act-order, compressed-tensors int4/int8/fp8)
load into lowbit's formats with the file's own integers and scales: the engine's logits match a float64
transformers Llama built from the weights the checkpoint means (computed by the writers in hf_quant_checkpoints.py
from the integers they chose), the fields match an independent unpack bit for bit, and checkpoints lowbit cannot
represent exactly fail with an error naming the field."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import lowbit  # noqa: E402
from lowbit import _core  # noqa: E402
from lowbit.models import load_model_source  # noqa: E402
from lowbit.models.hf_quant import CheckpointFormatError  # noqa: E402
from lowbit.models.hf_quant import awq as awq_reader  # noqa: E402
from lowbit.quantize.formats import dequantize  # noqa: E402

import hf_quant_checkpoints as ck  # noqa: E402

IDS = [5, 77, 140, 3, 251, 99, 18, 200, 64, 1, 33, 180]
# f32 engine vs float64 reference over 2 layers: observed max |diff| / max |logit| ~1e-6; a wrong nibble order,
# zero convention or permutation gives > 1e-1 (see test_the_comparison_can_fail).
TOL = 1e-4


def reference_logits(model, dense, recipe, head_in_file=False, ids=IDS):
    """transformers' Llama in float64 with the checkpoint's dense weights. An lm_head the file keeps in float goes
    through the engine's documented round-to-nearest quantization for the recipe (lowbit._core.quantize_weight)."""
    c = model.config
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
              num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
              rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
              tie_word_embeddings=False)
    hf = (transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw)) if c.arch == "qwen2" else
          transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw, head_dim=c.head_dim)))
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in dense.items()}
    if not head_in_file:  # a tied checkpoint's lm_head is its embedding table
        head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
        spec = lowbit.quantize.parse_recipe(recipe)
        qw = _core.quantize_weight(head.float().contiguous(), spec.weight_format, spec.group, False)
        sd["lm_head.weight"] = torch.from_dlpack(_core.dequantize_weight(qw)).clone()
    hf.load_state_dict(sd, strict=True)
    hf = hf.double().eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


def rel(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def engine_logits(path, recipe=None):
    llm = lowbit.LLM(str(path), recipe=recipe, dtype="f32", progress=False)
    return llm, llm.logits(IDS)


# ---- each format: logits against the float model the checkpoint describes -------------------------------------
def test_awq_gemm_matches_float_model(tmp_path):
    path, model, dense = ck.write_awq(tmp_path / "awq")
    assert load_model_source(path, progress=False).recipe == "w4a16g128"
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g128")) < TOL


@pytest.mark.parametrize("tie,arch", [(True, "llama"), (False, "qwen2")], ids=["tied", "qwen2_bias"])
def test_awq_tied_embeddings_and_qwen2_biases(tmp_path, tie, arch):
    path, model, dense = ck.write_awq(tmp_path / "awq", tie=tie, arch=arch)
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g128")) < TOL


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("desc_act", [False, True], ids=["no_act_order", "act_order"])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_matches_float_model(tmp_path, sym, desc_act, fmt):
    path, model, dense = ck.write_gptq(tmp_path / "gptq", sym=sym, desc_act=desc_act, fmt=fmt)
    loaded = load_model_source(path, progress=False)
    perms = [f.extra.get("input_perm") for f in loaded.fields.values()]
    assert all(p is not None for p in perms) if desc_act else all(p is None for p in perms)
    assert all(f.symmetric == sym for f in loaded.fields.values())
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g128")) < TOL


def test_gptq_per_channel_and_quantized_lm_head(tmp_path):
    """group_size -1 becomes g128 with the row's scale repeated (exact); a quantized lm_head is used as stored."""
    path, model, dense = ck.write_gptq(tmp_path / "gptq", group=-1, sym=False, fmt="gptq_v2", lm_head=True)
    loaded = load_model_source(path, progress=False)
    head = loaded.fields["lm_head.weight"]
    assert head.group == 128 and "lm_head.weight" not in loaded.tensors
    np.testing.assert_array_equal(dequantize(head), dense["lm_head.weight"])
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g128", head_in_file=True)) < TOL


def test_gptq_8bit_per_channel_is_w8(tmp_path):
    path, model, dense = ck.write_gptq_w8(tmp_path / "gptq8")
    _, got = engine_logits(path)
    assert {f.format for f in load_model_source(path, progress=False).fields.values()} == {"w8"}
    assert rel(got, reference_logits(model, dense, "w8a16")) < TOL


@pytest.mark.parametrize("scheme,recipe", [("w4_group_sym", "w4a16g64"), ("w4_group_asym", "w4a16g64"),
                                           ("w4_channel_sym", "w4a16g128"), ("w8_channel", "w8a16"),
                                           ("w8_group", "w8a16g64"),
                                           ("fp8_channel", "wfp8a16"), ("fp8_tensor", "wfp8a16")])
def test_compressed_tensors_matches_float_model(tmp_path, scheme, recipe):
    path, model, dense = ck.write_ct(tmp_path / "ct", scheme)
    loaded = load_model_source(path, progress=False)
    assert loaded.recipe == recipe
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, recipe)) < TOL


def test_compressed_tensors_quantized_lm_head(tmp_path):
    path, model, dense = ck.write_ct(tmp_path / "ct", "w4_group_asym", quantize_lm_head=True)
    loaded = load_model_source(path, progress=False)
    np.testing.assert_array_equal(dequantize(loaded.fields["lm_head.weight"]), dense["lm_head.weight"])
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g64", head_in_file=True)) < TOL


# ---- fields bit-exact against independent unpacking -------------------------------------------------------------
def test_awq_fields_equal_an_independent_unpack(tmp_path):
    from safetensors.numpy import load_file
    path, model, dense = ck.write_awq(tmp_path / "awq")
    raw = load_file(str(path / "model.safetensors"))
    loaded = load_model_source(path, progress=False)
    for name, f in loaded.fields.items():
        m = name[:-len(".weight")]
        np.testing.assert_array_equal(f.q.T, ck.awq_unpack_reference(raw[m + ".qweight"]))
        np.testing.assert_array_equal(f.zeros.T, ck.awq_unpack_reference(raw[m + ".qzeros"]))
        np.testing.assert_array_equal(f.scales.T, raw[m + ".scales"])
        np.testing.assert_array_equal(dequantize(f), dense[name])


def test_gptq_act_order_fields_reproduce_the_dense_weight(tmp_path):
    path, model, dense = ck.write_gptq(tmp_path / "g", sym=False, desc_act=True, fmt="gptq")
    for name, f in load_model_source(path, progress=False).fields.items():
        perm = f.extra["input_perm"]
        w = np.empty_like(dense[name])
        w[:, perm] = dequantize(f)  # the engine feeds x[:, perm] to the permuted weight
        np.testing.assert_array_equal(w, dense[name])


def test_compressed_tensors_library_agrees(tmp_path):
    """With compressed-tensors installed: its own pack_to_int32 writes the same words as our writer, its config
    model accepts our config, and its decompressor gives the weights lowbit's fields dequantize to."""
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file
    for scheme in ("w4_group_asym", "w4_group_sym", "w8_channel", "w8_group"):
        path, model, dense = ck.write_ct(tmp_path / scheme, scheme)
        qc = json.loads((path / "config.json").read_text())["quantization_config"]
        cfg = QuantizationConfig.model_validate(qc)
        s = cfg.config_groups["group_0"]
        raw = load_file(str(path / "model.safetensors"))
        fields = load_model_source(path, progress=False).fields
        bits = s.weights.num_bits
        for name, f in list(fields.items())[:3]:
            m = name[:-len(".weight")]
            signed = (f.q.astype(np.int16) - (8 if bits == 4 else 0)).astype(np.int8)
            assert torch.equal(pack_to_int32(torch.from_numpy(signed), bits), raw[m + ".weight_packed"])
            sd = {k[len(m) + 1:]: v for k, v in raw.items() if k.startswith(m + ".")}
            sd["weight_scale"] = sd["weight_scale"].float()  # the library computes in the scale's dtype: f32 is exact
            lib = PackedQuantizationCompressor.decompress(sd, s)["weight"].float().numpy()
            np.testing.assert_array_equal(dequantize(f), lib)
    assert ct.__version__


# ---- the comparison can fail ------------------------------------------------------------------------------------
def test_the_comparison_can_fail(tmp_path, monkeypatch):
    """A reader with AWQ's interleave undone the wrong way, or GPTQ's v1 zero offset ignored, is caught."""
    path, model, dense = ck.write_awq(tmp_path / "awq")
    ref = reference_logits(model, dense, "w4a16g128")
    monkeypatch.setattr(awq_reader, "AWQ_ORDER", tuple(range(8)))
    _, got = engine_logits(path)
    assert rel(got, ref) > 1e-2
    monkeypatch.undo()
    path, model, dense = ck.write_gptq(tmp_path / "g1", sym=False, fmt="gptq")
    qc_file = path / "config.json"
    cfg = json.loads(qc_file.read_text())
    cfg["quantization_config"]["checkpoint_format"] = "gptq_v2"  # lie: the zeros are stored minus 1
    qc_file.write_text(json.dumps(cfg))
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g128")) > 1e-2


# ---- recipes: weights fixed by the file, KV the user's choice ----------------------------------------------------
def test_recipe_follows_the_file_and_kv_is_free(tmp_path):
    path, model, dense = ck.write_awq(tmp_path / "awq")
    assert load_model_source(path, progress=False).recipe == "w4a16g128"
    llm = lowbit.LLM(str(path), recipe="w4a16kv8", dtype="f32", progress=False)
    assert np.isfinite(llm.logits(IDS)).all()
    with pytest.raises(ValueError, match="w4a16g128"):
        lowbit.LLM(str(path), recipe="w8a16", progress=False)


# ---- checkpoints lowbit cannot run exactly -----------------------------------------------------------------------
def _edit(path, **qc_changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in qc_changes.items():
        if v is None:
            cfg["quantization_config"].pop(k, None)
        else:
            cfg["quantization_config"][k] = v
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes,words", [
    ({"bits": None}, "quantization_config.bits is missing"),
    ({"group_size": None}, "quantization_config.group_size is missing"),
    ({"bits": 3}, "quantization_config.bits = 3"),
    ({"bits": 8}, "qweight"),  # bits 8 needs [k/4, n] words: the 4-bit tensors have the wrong shape
    ({"group_size": 16}, "group size 16 cannot be represented exactly"),
    ({"checkpoint_format": "marlin"}, "checkpoint_format = 'marlin'"),
    ({"is_marlin_format": True}, "is_marlin_format"),
    ({"dynamic": {"-:.*down_proj": {}}}, "quantization_config.dynamic"),
    ({"quant_method": "bitsandbytes"}, "quant_method = 'bitsandbytes'"),
    ({"quant_method": None}, "quant_method is missing"),
])
def test_bad_gptq_configs_name_the_field(tmp_path, changes, words):
    path, _, _ = ck.write_gptq(tmp_path / "g", sym=True)
    _edit(path, **changes)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
        load_model_source(path, progress=False)


@pytest.mark.parametrize("changes,words", [
    ({"version": "gemv"}, "quantization_config.version = 'gemv'"),
    ({"bits": 8}, "quantization_config.bits = 8"),
    ({"group_size": None}, "quantization_config.group_size is missing"),
    ({"zero_point": False}, "quantization_config.zero_point"),
])
def test_bad_awq_configs_name_the_field(tmp_path, changes, words):
    path, _, _ = ck.write_awq(tmp_path / "a")
    _edit(path, **changes)
    with pytest.raises(ValueError, match=words):
        load_model_source(path, progress=False)


def test_bad_compressed_tensors_configs_name_the_field(tmp_path):
    path, _, _ = ck.write_ct(tmp_path / "c", "w4_group_sym")
    cfg = json.loads((path / "config.json").read_text())
    qc = cfg["quantization_config"]
    cases = [
        (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=3), "weights.num_bits = 3"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block"), "weights.strategy = 'block'"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(group_size=48), "group size 48"),
        (lambda q: q["config_groups"]["group_0"].update(input_activations={"num_bits": 8}),
         "config_groups.group_0.input_activations"),
        (lambda q: q.update(quantization_status="frozen"), "quantization_status = 'frozen'"),
        (lambda q: q.update(format="marlin-24") or q["config_groups"]["group_0"].pop("format"), "'marlin-24'"),
        (lambda q: q.pop("config_groups"), "config_groups is missing"),
        (lambda q: q.update(ignore=["re:.*q_proj"]), "no quantization_config.config_groups target matches"),
    ]
    for change, words in cases:
        q = json.loads(json.dumps(qc))
        change(q)
        (path / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
        with pytest.raises(ValueError, match=words):
            load_model_source(path, progress=False)


def test_int8_group_and_asymmetric_are_refused(tmp_path):
    """Grouped int8 runs with float activations only (W8A8 needs per-channel scales), in groups lowbit has; int8
    has no zero point."""
    path, _, _ = ck.write_ct(tmp_path / "c", "w8_group")
    cfg = json.loads((path / "config.json").read_text())
    group_0 = cfg["quantization_config"]["config_groups"]["group_0"]
    a8 = ck.ct_config(8, "int", "group", 64, True, "pack-quantized", activations="int8")["config_groups"]["group_0"]
    for change, words in (({"input_activations": a8["input_activations"]}, "groups of 64 with int8_per_token "
                           "activations: lowbit's W8A8 takes per-channel weight scales only"),
                          ({"weights": group_0["weights"] | {"group_size": 48}}, "group size 48 cannot be represented"),
                          ({"weights": group_0["weights"] | {"symmetric": False}}, "lowbit's w8 has no zero point")):
        (path / "config.json").write_text(json.dumps(cfg | {"quantization_config": cfg["quantization_config"] | {
            "config_groups": {"group_0": group_0 | change}}}))
        with pytest.raises(ValueError, match=words):
            load_model_source(path, progress=False)


def test_mismatched_shapes_and_missing_tensors_name_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file
    path, _, _ = ck.write_gptq(tmp_path / "g", sym=True)
    raw = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.scales"
    bad = dict(raw, **{name: raw[name][:, :-8].contiguous()})
    save_file(bad, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"'{name}' has shape \[3, 248\], expected \[3, 256\]"):
        load_model_source(path, progress=False)
    missing = {k: v for k, v in raw.items() if k != "model.layers.0.self_attn.k_proj.qzeros"}
    save_file(missing, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.k_proj.qzeros' is missing"):
        load_model_source(path, progress=False)


def test_sym_with_other_zeros_and_unrepresentable_scales_are_refused(tmp_path):
    path, _, _ = ck.write_gptq(tmp_path / "g", sym=False, fmt="gptq_v2")
    _edit(path, sym=True)
    with pytest.raises(ValueError, match="quantization_config.sym is true but qzeros"):
        load_model_source(path, progress=False)
    path, _, _ = ck.write_ct(tmp_path / "c", "w4_group_sym", scale_dtype="f32")
    from safetensors.torch import load_file, save_file
    raw = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.mlp.up_proj.weight_scale"
    raw[name] = raw[name] * (1 + 2 ** -20)  # f32 scales with more mantissa than f16 holds
    save_file(raw, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="not exactly representable in f16"):
        load_model_source(path, progress=False)


def test_gptq_v1_zero_16_is_rewritten_exactly_or_refused(tmp_path):
    """auto-gptq v1 stores zero - 1, so a stored 15 reads as zero 16: (q - 16) = ((q - 1) - 15) when no q is 0.
    The 15 sits in the top field of its word (nothing above it), where it cannot be told from GPTQModel's borrow
    (see test_gptqmodel_v1_word_offset_zero_0), so the per-field reading applies."""
    from safetensors.numpy import load_file, save_file
    path, model, dense = ck.write_gptq(tmp_path / "g", sym=False, fmt="gptq")
    raw = load_file(str(path / "model.safetensors"))
    m = "model.layers.0.self_attn.o_proj"
    n, k = model.tensors[m + ".weight"].shape
    q = np.stack([(raw[m + ".qweight"].view(np.uint32) >> np.uint32(4 * i)) & 0xF for i in range(8)], 1)
    q = q.reshape(k, n).T.astype(np.uint8)   # [n, k]
    q[7, :128] = np.maximum(q[7, :128], 1)   # row 7, group 0: no q = 0 ...
    zeros_words = raw[m + ".qzeros"].view(np.uint32).copy()
    zeros_words[0, 0] |= np.uint32(0xF << 28)  # ... and its stored zero (field 7 of word 0) 15 -> zero 16
    raw[m + ".qweight"] = ck.pack_rows_lsb_first(q, 4).T.copy()
    raw[m + ".qzeros"] = zeros_words.view(np.int32)
    save_file(raw, str(path / "model.safetensors"))
    f = load_model_source(path, progress=False).fields[m + ".weight"]
    scale = raw[m + ".scales"][0, 7].astype(np.float32)
    np.testing.assert_array_equal(dequantize(f)[7, :128], (q[7, :128].astype(np.float32) - 16) * scale)
    q[7, 5] = 0
    raw[m + ".qweight"] = ck.pack_rows_lsb_first(q, 4).T.copy()
    save_file(raw, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="zero point 16"):
        load_model_source(path, progress=False)


@pytest.mark.parametrize("desc_act", [False, True], ids=["no_desc_act", "desc_act"])
def test_gptqmodel_v1_word_offset_zero_0(tmp_path, desc_act):
    """GPTQModel's v1 export subtracts 0x11111111 from each qzeros word, so a zero of 0 is stored as field 15 with
    a borrow from the next field; lowbit reads it back exactly when meta.quantizer names gptqmodel, and also when
    that name was stripped: a 15 with a field other than 15 above it is a borrow (per field it would be a zero of 16,
    which no GPTQ quantizer writes, and auto-gptq's -1 sets every higher field)."""
    from safetensors.numpy import load_file
    path, model, dense = ck.write_gptq(tmp_path / "g", sym=False, desc_act=desc_act, fmt="gptq", gptqmodel_v1=True)
    raw = load_file(str(path / "model.safetensors"))
    stored = np.concatenate([((raw[k].view(np.uint32)[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF)
                             .ravel() for k in raw if k.endswith(".qzeros")])
    assert (stored == 15).sum() > 100  # zeros of 0 (borrows) are in the file, not only in theory
    loaded = load_model_source(path, progress=False)
    for name, f in loaded.fields.items():
        perm = f.extra.get("input_perm")
        np.testing.assert_array_equal(dequantize(f), dense[name] if perm is None else dense[name][:, perm])
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g128")) < TOL
    cfg = json.loads((path / "config.json").read_text())
    del cfg["quantization_config"]["meta"]
    (path / "config.json").write_text(json.dumps(cfg))
    stripped = load_model_source(path, progress=False).fields
    assert stripped.keys() == loaded.fields.keys()
    for name, f in stripped.items():
        np.testing.assert_array_equal(dequantize(f), dequantize(loaded.fields[name]))


def test_info_says_what_was_loaded_and_what_was_quantized_at_load(tmp_path):
    from lowbit.info import format_info, model_info
    path, _, _ = ck.write_gptq(tmp_path / "g", sym=False, desc_act=True, fmt="gptq")
    text = format_info(model_info(lowbit.LLM(str(path), dtype="f32", progress=False)))
    assert ("checkpoint  gptq: 14 linears loaded as stored (w4 g128 asymmetric; 14 with act-order input "
            "permutations); quantized at load (round to nearest): lm_head.weight") in text
    path, _, _ = ck.write_ct(tmp_path / "c", "fp8_channel", quantize_lm_head=True)
    text = format_info(model_info(lowbit.LLM(str(path), dtype="f32", progress=False)))
    assert "checkpoint  compressed-tensors: 15 linears loaded as stored (e4m3; 0 with" in text
    assert "quantized at load (round to nearest): none" in text


@pytest.mark.parametrize("writer,side", [(lambda p: ck.write_gptq(p, sym=False), "quantize_config.json"),
                                         (lambda p: ck.write_awq(p), "quant_config.json")])
def test_side_quantization_config_files(tmp_path, writer, side):
    """auto-gptq's quantize_config.json / AutoAWQ's quant_config.json beside a config.json without one."""
    path, model, dense = writer(tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    qc.pop("quant_method")
    (path / "config.json").write_text(json.dumps(cfg))
    (path / side).write_text(json.dumps(qc))
    _, got = engine_logits(path)
    assert rel(got, reference_logits(model, dense, "w4a16g128")) < TOL


def test_quantize_refuses_an_already_quantized_checkpoint(tmp_path):
    from lowbit.quantize import api
    path, _, _ = ck.write_awq(tmp_path / "awq")
    calib = tmp_path / "calib.txt"
    calib.write_text("some calibration text " * 20)
    with pytest.raises(ValueError, match=r"is already quantized \(awq checkpoint, recipe w4a16g128\)"):
        api.quantize(str(path), "w4a16", "rtn", tmp_path / "out", calib=[calib], progress=False)


@pytest.mark.parametrize("scheme,act,recipe", [("w8_channel", "int8", "w8a8"), ("fp8_channel", "fp8", "wfp8a8")])
def test_compressed_tensors_dynamic_activations(tmp_path, scheme, act, recipe):
    """W8A8 (int8) and FP8_DYNAMIC: the file's weights, activations quantized per token at run time. The reference
    is lowbit's float64 torch model with the same activation rule; where a value sits within f32 noise of a
    rounding boundary the two may pick neighbouring levels, so most sequences agree to f32 precision and none
    differs by more than half of what activation quantization itself changes (as in test_quantized_dir_engine)."""
    path, model, dense = ck.write_ct(tmp_path / "ct", scheme, activations=act)
    assert load_model_source(path, progress=False).recipe == recipe
    check_dynamic_activations(path, model.config, dense, act)


def check_dynamic_activations(path, config, dense, act, label=""):
    """lowbit's f32 engine on `path` against the float64 torch model of `dense` with activations quantized per
    token (`act`) at run time: the median of 8 sequences agrees to f32 precision, the worst differs by less than
    half of what activation quantization itself changes."""
    from lowbit.quantize.torch_model import FakeQuant, TorchLlama
    llm = lowbit.LLM(str(path), dtype="f32", progress=False)
    ref = TorchLlama(config, dense, FakeQuant(act_quant=act))
    ref.weights = {k: v.double() for k, v in ref.weights.items()}
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, 256, 24).tolist() for _ in range(8)]
    errs = sorted(rel(llm.logits(ids), ref.logits(torch.tensor([ids]))[0].numpy()) for ids in seqs)
    with_act = ref.logits(torch.tensor([seqs[0]]))[0].numpy()
    ref.fake.act_quant = None
    effect = rel(ref.logits(torch.tensor([seqs[0]]))[0].numpy(), with_act)
    if label:
        print(label, "relative logit errors:", errs, "activation quantization's own effect:", effect)
    assert errs[len(errs) // 2] < 1e-5, errs
    assert errs[-1] < 0.5 * effect, (errs, effect)


def test_static_or_mismatched_activation_schemes_are_refused(tmp_path):
    path, _, _ = ck.write_ct(tmp_path / "c", "w8_channel", activations="int8")
    cfg = json.loads((path / "config.json").read_text())
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    for change, words in (({"dynamic": False, "strategy": "tensor"}, "input_activations = .*dynamically per token"),
                          ({"type": "float"}, "w8 weights with fp8_per_token activations")):
        group2 = dict(group, input_activations=dict(group["input_activations"], **change))
        qc = dict(cfg["quantization_config"], config_groups={"group_0": group2})
        (path / "config.json").write_text(json.dumps(dict(cfg, quantization_config=qc)))
        with pytest.raises(ValueError, match=words):
            load_model_source(path, progress=False)
