"""LLM(DIR) on directories written by lowbit.quantize: the engine computes what the directory means (the torch
fake-quant model of lowbit.quantize.api.fake_quant_model) for every algorithm family; the recipe comes from the
manifest; KV modes the engine lacks, bad permutations and FMPQ block maps fail clearly."""
import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lowbit import _core  # noqa: E402
from lowbit.info import fmpq_blocks_by_layer, format_info, model_info  # noqa: E402
from lowbit.llm import LLM  # noqa: E402
from lowbit.model_loading import core_config, core_quantized_weight  # noqa: E402
from lowbit.models import load_model_source  # noqa: E402
from lowbit.quantize import api, parse_recipe  # noqa: E402
from lowbit.quantize.recipes import RecipeError  # noqa: E402
from lowbit.quantize.testing import random_tokens, tiny_llama  # noqa: E402

# hidden 256 gives FMPQ two 128-channel blocks; intermediate 352 = 2 * 128 + 96 gives short last groups/blocks.
SHAPE = dict(hidden=256, intermediate=352, heads=4, kv_heads=2, layers=2)

# (recipe, algorithm, options, rounded): `rounded` when activations or KV are quantized at run time (see below)
FAMILIES = [
    ("w4a16g64", "rtn", {}, False),
    ("w4a16", "awq", {}, False),
    ("w8a16", "gptq", {"act_order": True}, False),
    ("wfp8a16", "rtn", {}, False),
    ("w8a8", "smoothquant", {"alpha": 0.5}, True),
    ("w4a8kv4", "qoq", {}, True),
    ("w4a8g64-liquid", "liquid", {"alpha": 0.5}, True),
    ("w4a4kv8", "fmpq", {"outlier_ratio": 3.0}, True),
    ("w16a16kv4", "rtn", {"smooth_attention": True}, True),
]


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    rng = np.random.default_rng(0)
    words = ["license", "software", "free", "copy", "the", "of", "and", "you", "program", "source", "(c)", "2007"]
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text(" ".join(rng.choice(words, 500)), encoding="utf-8")
    return path


def quantized_dir(tmp_path, calib, recipe, algo, kv_mode="token", **opts):
    out = tmp_path / f"{recipe}-{algo}"
    api.quantize(None, recipe, algo, out, calib=[calib], num_sequences=4, seq_len=48, kv_mode=kv_mode,
                 progress=False, loaded=tiny_llama(seed=3, **SHAPE), **opts)
    return out


def rel(a, b):
    return float((a - b).norm() / b.norm())


def engine_logits(model_or_llm, ids):
    engine = model_or_llm.engine if isinstance(model_or_llm, LLM) else _core.Engine(model_or_llm)
    out = torch.from_dlpack(engine.logits(ids)).clone()
    assert torch.isfinite(out).all()
    return out


def fake_quant_logits_f64(model, ids):
    """The fake-quant model's logits computed in float64 (its reference rounding decisions)."""
    saved = model.weights
    model.weights, model._rope_cache = {k: v.double() for k, v in saved.items()}, {}
    try:
        return model.logits(ids)[0].float()
    finally:
        model.weights, model._rope_cache = saved, {}


@pytest.mark.parametrize("recipe,algo,opts,rounded", FAMILIES, ids=[f"{r}-{a}" for r, a, _, _ in FAMILIES])
def test_engine_matches_fake_quant_model(tmp_path, calib, recipe, algo, opts, rounded):
    out = quantized_dir(tmp_path, calib, recipe, algo, **opts)
    llm = LLM(out, progress=False)
    assert llm.recipe == parse_recipe(recipe).text  # the manifest's canonical spelling
    ref_model, _ = api.fake_quant_model(out)
    seqs = [random_tokens(1, 24, seed=s) for s in range(8)]
    errs = sorted(rel(engine_logits(llm, ids[0].tolist()), fake_quant_logits_f64(ref_model, ids)) for ids in seqs)
    if not rounded:
        # float activations and KV: the engine's f32 arithmetic vs float64 (observed <= 4e-7)
        assert errs[-1] < 1e-5, errs
        return
    # Activations / KV rounded at run time: where a value lies within f32 rounding noise of a rounding boundary,
    # f32 and f64 can pick neighbouring levels (one step); everywhere else the engine agrees with the float64
    # model to f32 precision. Most sequences hit no such value (observed: 1e-7 typical, single flips 1e-3); a
    # systematic difference (a missing permutation, a wrong scale, no rounding) shows in every sequence.
    assert errs[len(errs) // 2] < 1e-5, errs
    ref_model.fake.act_quant, ref_model.fake.kv = None, None
    effect = rel(fake_quant_logits_f64(ref_model, seqs[0]), fake_quant_logits_f64(api.fake_quant_model(out)[0], seqs[0]))
    assert errs[-1] < 0.5 * effect, (errs, effect)


def test_quantized_llm_generates(tmp_path, calib):
    llm = LLM(quantized_dir(tmp_path, calib, "w4a8kv4", "qoq"), progress=False)
    ids = random_tokens(1, 12, seed=4)[0].tolist()
    out = llm.generate([ids], max_tokens=6, temperature=0.0, ignore_eos=True)[0]
    assert len(out.token_ids) == 6
    # greedy decode continues the prefill's argmax (same engine, KV reused)
    assert out.token_ids[0] == int(engine_logits(llm, ids)[-1].argmax())


def build_from_dir(path, skip_perm=False, skip_bits=False):
    loaded = load_model_source(path)
    m = _core.Model(core_config(loaded.config), loaded.recipe)
    for name, f in loaded.fields.items():
        m.set_quantized_weight(name, core_quantized_weight(f))
        if "input_perm" in f.extra and not skip_perm:
            m.set_input_permutation(name, f.extra["input_perm"])
        if "fmpq_block_bits" in f.extra and not skip_bits:
            m.set_fmpq_block_bits(name, f.extra["fmpq_block_bits"])
    for name, t in loaded.tensors.items():
        m.set_weight(name, t)
    m.finalize()
    return m, loaded


def test_fmpq_permutation_is_applied(tmp_path, calib):
    """Leaving the input permutations out changes the logits by far more than the test tolerance."""
    out = quantized_dir(tmp_path, calib, "w4a4", "fmpq", outlier_ratio=3.0)
    m, loaded = build_from_dir(out)
    perms = {n for n, f in loaded.fields.items() if "input_perm" in f.extra}
    for short in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"):
        assert any(short in n for n in perms), short
    assert not any("down_proj" in n for n in perms)  # folded into gate/up rows offline
    ids = random_tokens(1, 30, seed=8)[0].tolist()
    good = engine_logits(m, ids)
    unpermuted, _ = build_from_dir(out, skip_perm=True)
    assert rel(engine_logits(unpermuted, ids), good) > 0.05


def test_recipe_comes_from_the_manifest(tmp_path, calib):
    out = quantized_dir(tmp_path, calib, "w4a8kv4", "rtn")
    assert LLM(out, recipe="w4a8g128kv4", progress=False).recipe == "w4a8kv4"  # the same recipe, spelled out
    assert LLM(out, recipe=" W4A8K4V4-qoq ", progress=False).recipe == "w4a8kv4"  # case, spaces, -qoq, k4v4
    with pytest.raises(ValueError, match="quantized for recipe 'w4a8kv4' \\(algorithm rtn\\).*'w4a16'"):
        LLM(out, recipe="w4a16", progress=False)
    with pytest.raises(ValueError, match="quantized for recipe 'w4a8kv4'.*'w16a16'"):
        LLM(out, recipe="w16a16", progress=False)


@pytest.mark.parametrize("mode,words", [("static", "static calibrated KV ranges"), ("channel", "per-channel K ranges")])
def test_kv_modes_the_engine_lacks_are_refused(tmp_path, calib, mode, words):
    out = quantized_dir(tmp_path, calib, "w4a16kv4", "rtn", kv_mode=mode)
    with pytest.raises(NotImplementedError, match=f"kv_mode '{mode}' \\({words}\\).*--kv-mode token"):
        LLM(out, progress=False)


def test_loader_returns_a_quantized_checkpoint(tmp_path, calib):
    out = quantized_dir(tmp_path, calib, "w8a8", "rtn")
    loaded = load_model_source(out)
    assert loaded.recipe == "w8a8" and loaded.manifest["algorithm"] == "rtn"
    # w8a8 keeps lm_head in float (float activations): it is not a quantized field
    assert len(loaded.fields) == 7 * 2 and "lm_head.weight" not in loaded.fields
    assert not any(n in loaded.tensors for n in loaded.fields)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "lowbit_quant.json").write_text("{}")
    with pytest.raises(ValueError, match="format_version None, this lowbit reads 1"):
        load_model_source(bad)


def test_info_reports_recipe_algorithm_and_parameters(tmp_path, calib):
    out = quantized_dir(tmp_path, calib, "w4a4", "fmpq", outlier_ratio=3.0)
    info = model_info(LLM(out, progress=False))
    q = info["quantization"]
    assert (q["recipe"], q["algorithm"], q["weight_format"], q["group"]) == ("w4a4", "fmpq", "qoq", 128)
    assert q["parameters"]["outlier_ratio"] == 3.0 and 0 < q["fmpq_int8_block_fraction_mean"] < 1
    text = format_info(info)
    assert "quantized   w4a4 by fmpq: qoq g128 weights, fmpq activations" in text
    assert "outlier_ratio=3.0" in text and "calibration 4 x 48 tokens of calib.txt" in text
    manifest = json.loads((out / "lowbit_quant.json").read_text())
    assert "lm_head" not in manifest  # activation-quantized recipes keep lm_head in float
    weight_only = json.loads((quantized_dir(tmp_path, calib, "w4a16", "rtn") / "lowbit_quant.json").read_text())
    assert weight_only["lm_head"] == "rtn"


def test_info_plan_shows_the_int8_block_share_per_layer(tmp_path, calib):
    """`lowbit info --plan` on a w4a4 directory: one line per layer with the int8 share of each linear's blocks, the
    manifest's own fractions (q/k/v and gate/up share a map)."""
    out = quantized_dir(tmp_path, calib, "w4a4", "fmpq", outlier_ratio=3.0)
    fr = json.loads((out / "lowbit_quant.json").read_text())["fmpq_int8_block_fraction"]
    layers = fmpq_blocks_by_layer(fr)
    assert sorted(layers) == list(range(SHAPE["layers"]))
    for i, roles in layers.items():
        p = f"model.layers.{i}."
        assert roles == {"qkv": fr[p + "self_attn.q_proj.weight"], "o": fr[p + "self_attn.o_proj.weight"],
                         "gate_up": fr[p + "mlp.gate_proj.weight"], "down": fr[p + "mlp.down_proj.weight"]}
    assert any(0 < v < 1 for roles in layers.values() for v in roles.values())  # some blocks of each kind
    r = subprocess.run([sys.executable, "-m", "lowbit", "info", "--model", str(out), "--quiet", "--plan"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "fmpq int8 activation blocks per layer" in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.strip().startswith("layer   0"))
    assert f"qkv {100 * layers[0]['qkv']:5.1f}%" in row and f"down {100 * layers[0]['down']:5.1f}%" in row


# ---- C++ Model: input permutations and FMPQ block maps ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(seed=5, **SHAPE)


def float_model(tiny, recipe):
    m = _core.Model(core_config(tiny.config), recipe)
    for name, t in tiny.tensors.items():
        m.set_weight(name, t)
    return m


def test_set_input_permutation_errors(tiny):
    m = _core.Model(core_config(tiny.config), "w16a16")
    name = "model.layers.0.mlp.up_proj.weight"  # k = hidden = 256
    with pytest.raises(ValueError, match="perm' of '.*up_proj.weight' must be a permutation of 0..255; entry 1 is 0 "
                                         "\\(repeated\\)"):
        m.set_input_permutation(name, np.zeros(256, dtype=np.int64))
    with pytest.raises(ValueError, match="entry 255 is 256 \\(out of range\\)"):
        m.set_input_permutation(name, np.arange(1, 257, dtype=np.int32))
    with pytest.raises(ValueError, match="set_input_permutation.*'perm'.*\\[256\\].*\\[255\\]"):
        m.set_input_permutation(name, np.arange(255, dtype=np.int64))
    with pytest.raises(TypeError, match="'perm' must be s32 or s64, got f32"):
        m.set_input_permutation(name, np.arange(256, dtype=np.float32))
    with pytest.raises(ValueError, match="'model.norm.weight' is not a decoder linear weight"):
        m.set_input_permutation("model.norm.weight", np.arange(256))


def test_shared_inputs_need_equal_permutations(tiny):
    m = float_model(tiny, "w16a16")
    rng = np.random.default_rng(0)
    m.set_input_permutation("model.layers.1.self_attn.q_proj.weight", rng.permutation(256))
    m.set_input_permutation("model.layers.1.self_attn.k_proj.weight", rng.permutation(256))
    with pytest.raises(ValueError, match="q/k/v read one input, so their input permutations must be equal; "
                                         "'model.layers.1.self_attn.k_proj.weight' differs"):
        m.finalize()


def test_permutation_gathers_input_channels(tiny):
    """A float model whose down_proj columns were permuted, served with that permutation, equals the original."""
    ids = random_tokens(1, 23, seed=2)[0].tolist()
    ref = float_model(tiny, "w16a16")
    ref.finalize()
    perm = np.random.default_rng(1).permutation(tiny.config.intermediate_size)
    m = _core.Model(core_config(tiny.config), "w16a16")
    for name, t in tiny.tensors.items():
        m.set_weight(name, t[:, perm].copy() if name.endswith("down_proj.weight") else t)
        if name.endswith("down_proj.weight"):
            m.set_input_permutation(name, perm)
    m.finalize()
    assert rel(engine_logits(m, ids), engine_logits(ref, ids)) < 1e-6  # only the f32 summation order differs


def test_fmpq_block_map_errors(tiny):
    name = "model.layers.0.mlp.down_proj.weight"  # k = 352 -> 3 blocks
    with pytest.raises(ValueError, match="recipe w4a16 has no FMPQ \\(a4\\) activations"):
        _core.Model(core_config(tiny.config), "w4a16").set_fmpq_block_bits(name, np.array([4, 4, 4], np.uint8))
    m = _core.Model(core_config(tiny.config), "w4a4")
    with pytest.raises(ValueError, match="must hold 4 or 8 per block, got 5 for block 1"):
        m.set_fmpq_block_bits(name, np.array([8, 5, 4], np.uint8))
    with pytest.raises(ValueError, match="block_bits.*\\[3\\].*\\[2\\]"):
        m.set_fmpq_block_bits(name, np.array([8, 4], np.uint8))
    with pytest.raises(TypeError, match="block_bits"):
        m.set_fmpq_block_bits(name, np.array([8, 4, 4], np.int32))


def test_fmpq_without_block_maps(tiny):
    m = float_model(tiny, "w4a4")  # round-to-nearest weights carry no block map
    m.finalize()
    with pytest.raises(NotImplementedError, match="w4a4 \\(FMPQ activations\\) needs a block map per linear"):
        _core.Engine(m).logits([1, 2, 3])
    partial = float_model(tiny, "w4a4")
    partial.set_fmpq_block_bits("model.layers.0.mlp.down_proj.weight", np.array([8, 4, 4], np.uint8))
    with pytest.raises(ValueError, match="layer 0: FMPQ block maps were set for some linears but not all"):
        partial.finalize()


def test_per_channel_k_recipe_with_smooth_attention_runs_in_the_engine(tmp_path, calib):
    """`lowbit quantize` for a kc recipe calibrates with per-channel K and folds SmoothAttention into q/k weights
    (it works for any K format); the engine runs the directory with its per-channel K cache (block = K group)."""
    outs = {}
    for sa in (False, True):
        outs[sa] = tmp_path / f"kc-sa{int(sa)}"
        _, _, manifest = api.quantize(None, "w4a16kc4g32v4", "rtn", outs[sa], calib=[calib], num_sequences=4,
                                      seq_len=48, progress=False, loaded=tiny_llama(seed=3, **SHAPE),
                                      smooth_attention=sa)
        assert manifest["kv"] == {"k_bits": 4, "v_bits": 4, "mode": "channel"}
        assert manifest["parameters"].get("smooth_attention", False) is sa
    llms = {sa: LLM(out, progress=False) for sa, out in outs.items()}
    ids = random_tokens(1, 40, seed=5)[0].tolist()  # crosses the first 32-token K group
    logits = {}
    for sa, llm in llms.items():
        assert llm.recipe == "w4a16kc4g32v4" and llm.stats()["block_size"] == 32
        out = llm.generate([ids], max_tokens=4, temperature=0.0, ignore_eos=True)[0]
        assert len(out.token_ids) == 4
        logits[sa] = np.asarray(engine_logits(llm, ids), dtype=np.float64)
        assert np.isfinite(logits[sa]).all()
    assert not np.array_equal(logits[False], logits[True])  # λ reached the K/Q weights
    with pytest.raises(RecipeError, match="quantizes K per channel; kv_mode 'token' contradicts it"):
        api.quantize(None, "w4a16kc4v4", "rtn", tmp_path / "bad", calib=[calib], num_sequences=4, seq_len=48,
                     kv_mode="token", progress=False, loaded=tiny_llama(seed=3, **SHAPE))
