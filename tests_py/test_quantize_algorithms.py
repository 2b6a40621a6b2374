"""Algorithm properties on random data and a tiny random Llama: GPTQ beats RTN on layer error, the AWQ / QoQ /
clip searches never worsen their calibration loss, FMPQ puts outliers into int8 blocks, KV/activation fake-quant
match their definitions."""

import numpy as np
import pytest
import torch

from lowbit.quantize import pipeline  # noqa: E402
from lowbit.quantize.activation_quant import fake_quant_fmpq, fake_quant_per_token_int8  # noqa: E402
from lowbit.quantize.api import algorithm_class  # noqa: E402
from lowbit.quantize.clipping import clip_search  # noqa: E402
from lowbit.quantize.fmpq import outlier_permutation  # noqa: E402
from lowbit.quantize.formats import dequantize, fake_quant, quantize_rtn  # noqa: E402
from lowbit.quantize.gptq import Hessian, gptq_quantize  # noqa: E402
from lowbit.quantize.kv_quant import KVQuantizer  # noqa: E402
from lowbit.quantize.recipes import RecipeError, check_pair, parse_recipe  # noqa: E402
from lowbit.quantize.testing import random_tokens, tiny_llama  # noqa: E402
from lowbit.quantize.torch_model import TorchLlama  # noqa: E402


def correlated_inputs(t, k, seed):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g) / k ** 0.5 + torch.eye(k)
    x = torch.randn(t, k, generator=g) @ mix
    x[:, :3] *= 10  # outlier channels
    return x


def layer_err(x, w, wq):
    return float((x @ (w - wq).T).pow(2).sum())


@pytest.mark.parametrize("fmt,group,act_order", [("w4", 128, False), ("w4", 32, False), ("w4", 64, True),
                                                 ("w8", 0, False), ("w8", 0, True)])
def test_gptq_reduces_layer_error_vs_rtn(fmt, group, act_order):
    k, n = 200, 48  # k not a multiple of 64/128: short last group
    x = correlated_inputs(512, k, 1)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(2)) * 0.05
    h = Hessian(k)
    h.add(x[:256])
    h.add(x[256:])  # accumulation over batches equals one pass
    np.testing.assert_allclose(h.h.numpy(), (2 / 512 * x.double().T @ x.double()).numpy(), rtol=1e-10, atol=1e-9)
    f = gptq_quantize(w, h.h, fmt, group or 128, act_order=act_order)
    assert f.q.shape == (n, k) and (f.group == (group if fmt == "w4" else 0))
    rtn = dequantize(quantize_rtn(w, fmt, group or 128))
    e_gptq = layer_err(x, w, torch.from_numpy(dequantize(f)))
    e_rtn = layer_err(x, w, torch.from_numpy(rtn))
    assert e_gptq < 0.9 * e_rtn, (e_gptq, e_rtn)


def test_gptq_bad_hessian_shape():
    with pytest.raises(ValueError, match=r"hessian shape \(3, 3\) does not match k=4"):
        gptq_quantize(torch.ones(2, 4), torch.eye(3), "w4")


def test_clip_search_never_worsens():
    x = correlated_inputs(256, 96, 3)
    for seed in range(3):
        w = torch.randn(32, 96, generator=torch.Generator().manual_seed(seed)) * 0.05
        w[0, 5] = 2.0  # an outlier weight makes clipping attractive for its group
        fq = lambda v: fake_quant(v, "w4", 32)  # noqa: E731
        wc, ratio = clip_search(w, x, fq, 32)
        assert layer_err(x, w, fq(wc)) <= layer_err(x, w, fq(w))
        assert 0.6 <= ratio <= 1.0


def run_algo(algo, recipe, seed=0, **opts):
    lm = tiny_llama(seed=seed)
    m = TorchLlama(lm.config, lm.tensors)
    a = algorithm_class(algo)(parse_recipe(recipe), **opts)
    fields, stats = pipeline.run(m, random_tokens(4, 48), a, pipeline.Progress(False, 2))
    return m, a, fields, stats, lm


def test_awq_search_never_worsens_calibration_loss():
    _, a, fields, _, lm = run_algo("awq", "w4a16g32")
    searches = a.params["scale_search"]
    assert len(searches) == lm.config.num_layers
    for rec in searches.values():
        for site in ("q_proj", "o_proj", "gate_proj", "down_proj"):
            assert rec[site]["loss"] <= rec[site]["loss_unscaled"]
    assert any(r[s]["alpha"] for r in searches.values() for s in r)  # the search does pick non-trivial scales
    assert all(f.format == "w4" and f.group == 32 for f in fields.values())


def test_qoq_output_smoothing_never_worsens():
    _, a, fields, _, _ = run_algo("qoq", "w4a8kv4")
    for rec in a.params["layers"].values():
        for site in ("o_proj", "down_proj"):
            assert rec[site]["loss"] <= rec[site]["loss_unsmoothed"]
    assert all(f.format == "qoq" and f.channel_scales is not None for f in fields.values())
    assert a.params["rotation"].startswith("scaled Hadamard")


@pytest.mark.parametrize("algo,recipe,fmt", [("rtn", "w8a8", "w8"), ("gptq", "w4a16g64", "w4"),
                                             ("smoothquant", "w8a8kv8", "w8"), ("liquid", "w4a8-liquid", "liquid"),
                                             ("rtn", "wfp8a16", "e4m3")])
def test_every_algorithm_runs_and_stays_close(algo, recipe, fmt):
    m, _, fields, _, lm = run_algo(algo, recipe)
    assert {f.format for f in fields.values()} == {fmt}
    assert len(fields) == 7 * lm.config.num_layers
    tok = random_tokens(2, 32, seed=9)
    ref = TorchLlama(lm.config, lm.tensors).logits(tok)
    err = float((m.logits(tok) - ref).norm() / ref.norm())
    assert 0 < err < 0.3, err


def test_fmpq_permutation_and_block_bits():
    x = torch.randn(300, 300)
    outl = [7, 150, 299]
    x[:, outl] *= 50
    perm, bits, n_out = outlier_permutation(x, ratio=8.0)
    assert n_out == 3 and sorted(perm.tolist()) == list(range(300))
    assert set(perm[:3].tolist()) == set(outl)
    assert bits.tolist() == [8, 4, 4]  # 3 outliers fit in one 128-channel int8 block; k=300 has 3 blocks
    m, a, fields, _, _ = run_algo("fmpq", "w4a4kv4", outlier_ratio=3.0)
    for name, f in fields.items():
        assert f.format == "qoq" and f.group == 128  # what ops::linear_fmpq reads
        bb = m.fake.fmpq_block_bits[name]
        assert f.extra["int8_block_fraction"] == pytest.approx(float((bb == 8).mean()))
        if not name.endswith("down_proj.weight"):
            assert sorted(m.fake.input_perm[name].tolist()) == list(range(f.k))


def test_fmpq_int8_fraction_budget():
    k = 1000  # 8 blocks, the last one partial
    nb = 8
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, k, generator=g) * torch.rand(k, generator=g) * 4
    x[:, [5, 600]] *= 40
    amax = x.abs().amax(0)
    for frac in (0.0, 0.1, 0.2, 0.4, 1.0):
        perm, bits, _ = outlier_permutation(x, ratio=8.0, int8_fraction=frac)
        assert sorted(perm.tolist()) == list(range(k))
        assert abs(float((bits == 8).mean()) - frac) <= 1 / nb + 1e-9
        # the int8 blocks hold the largest channels: none of the int4 channels is larger than an int8 one
        blk = (torch.arange(k) // 128).numpy()
        is8 = torch.from_numpy(bits[blk] == 8)
        a = amax[perm]
        if 0 < int(is8.sum()) < k:
            assert float(a[is8].min()) >= float(a[~is8].max())
    with pytest.raises(ValueError, match="int8_fraction must be in"):
        outlier_permutation(x, ratio=8.0, int8_fraction=1.5)


@pytest.mark.parametrize("frac", [0.2, 0.4])
def test_fmpq_int8_fraction_in_pipeline(frac):
    m, a, fields, _, _ = run_algo_wide("fmpq", "w4a4kv4", int8_fraction=frac)
    assert a.params["int8_fraction"] == frac
    for name, f in fields.items():
        nb = -(-f.k // 128)
        assert abs(f.extra["int8_block_fraction"] - frac) <= 1 / nb + 1e-9, (name, f.extra["int8_block_fraction"])


def run_algo_wide(algo, recipe, **opts):
    """run_algo on a model wide enough for several 128-channel blocks per input (hidden 3 blocks, down_proj 6)."""
    lm = tiny_llama(hidden=384, intermediate=700, heads=4, kv_heads=2)
    m = TorchLlama(lm.config, lm.tensors)
    a = algorithm_class(algo)(parse_recipe(recipe), **opts)
    fields, stats = pipeline.run(m, random_tokens(2, 32), a, pipeline.Progress(False, 2))
    return m, a, fields, stats, lm


@pytest.mark.parametrize("awq_scales", [False, True])
def test_fmpq_permutation_preserves_float_outputs(awq_scales):
    """With float weights and activations, the permutations (activation input_perm, and down_proj's folded into
    gate/up) and the optional AWQ scales must leave the logits unchanged."""
    lm = tiny_llama(hidden=384, intermediate=700, heads=4, kv_heads=2)
    ref = TorchLlama(lm.config, lm.tensors)
    m = TorchLlama(lm.config, lm.tensors)
    algo = algorithm_class("fmpq")(parse_recipe("w4a4kv4"), int8_fraction=0.4, awq_scales=awq_scales)
    tok = random_tokens(2, 24)
    before = {n: w.clone() for n, w in m.weights.items()}
    with torch.no_grad():
        h = m.embed(tok)
        for i in range(lm.config.num_layers):
            algo.transform_layer(m, i, pipeline.capture(m, i, h))
            h = m.layer(i, h)
    assert m.fake.act_quant is None  # only the permutation is applied, no quantization
    moved = [n for n in before if not torch.equal(before[n], m.weights[n])]
    assert any("down_proj" in n for n in moved) and any("q_proj" in n for n in moved)  # the test permutes
    torch.testing.assert_close(m.logits(tok), ref.logits(tok), rtol=1e-4, atol=1e-4)
    if awq_scales:
        assert any(r[s]["alpha"] for r in algo.params["scale_search"].values() for s in r)  # some scale was folded


def test_activation_fake_quant_definitions():
    x = torch.randn(5, 300) * torch.linspace(0.1, 5, 300)
    s = x.abs().amax(1, keepdim=True) / 127
    torch.testing.assert_close(fake_quant_per_token_int8(x), torch.round(x / s) * s)
    bits = np.array([8, 4, 4], dtype=np.uint8)
    y = fake_quant_fmpq(x, bits)
    b2 = x[:, 256:]
    s2 = b2.abs().amax(1, keepdim=True) / 7
    torch.testing.assert_close(y[:, 256:], torch.clamp(torch.round(b2 / s2), -8, 7) * s2)
    assert len(torch.unique(torch.round(y[:, 128:256] / (x[:, 128:256].abs().amax(1, keepdim=True) / 7)))) <= 16
    with pytest.raises(ValueError, match="block_bits has 2 entries, expected 3"):
        fake_quant_fmpq(x, bits[:2])


def test_kv_quant_modes():
    k = torch.randn(2, 3, 17, 8)
    v = torch.randn(2, 3, 17, 8)
    kq, vq = KVQuantizer(4, 2)(0, k, v)
    lo, hi = k.amin(-1, keepdim=True), k.amax(-1, keepdim=True)
    sc = (hi - lo) / 15
    torch.testing.assert_close(kq, torch.clamp(torch.round((k - lo) / sc), 0, 15) * sc + lo)
    assert all(len(torch.unique(vq[b, h, t])) <= 4 for b in range(2) for h in range(3) for t in range(17))
    kc, vc = KVQuantizer(4, 16, k_mode="channel")(0, k, v)
    assert torch.equal(vc, v)
    assert all(len(torch.unique(kc[b, h, :, d])) <= 16 for b in range(2) for h in range(3) for d in range(8))
    rng = {(0, "k"): (torch.full((1, 3, 1, 8), -0.5), torch.full((1, 3, 1, 8), 0.5)),
           (0, "v"): (torch.full((1, 3, 1, 8), -1.0), torch.full((1, 3, 1, 8), 1.0))}
    ks, _ = KVQuantizer(8, 8, k_mode="static", v_mode="static", static_ranges=rng)(0, k, v)
    assert float(ks.max()) <= 0.5 + 1e-6 and float(ks.min()) >= -0.5 - 1e-6
    with pytest.raises(ValueError, match="k_bits must be 16, 8, 4 or 2, got 3"):
        KVQuantizer(3, 8)
    with pytest.raises(ValueError, match="static mode needs static_ranges"):
        KVQuantizer(8, 8, k_mode="static")


def test_recipe_and_pair_errors():
    # the C++ parser's messages (test_recipes.py checks the whole table)
    with pytest.raises(RecipeError, match="bad recipe 'w5a8': weight bits must be 16, 8, 4 or fp8 at position 2"):
        parse_recipe("w5a8")
    with pytest.raises(RecipeError, match="bad recipe 'w4a16-liquid': '-qoq' / '-liquid' select the W4A8 weight "
                                          "format and need w4a8 at position 12"):
        parse_recipe("w4a16-liquid")
    with pytest.raises(RecipeError, match="writes fp8 weights for 16-bit activations only"):
        check_pair("rtn", parse_recipe("wfp8a8"))
    with pytest.raises(RecipeError, match=r"algorithm 'gptq' does not handle recipe 'w8a8'.*pairs that exist: rtn"):
        check_pair("gptq", parse_recipe("w8a8"))
    with pytest.raises(RecipeError, match="unknown algorithm 'foo'; known: rtn, awq"):
        check_pair("foo", parse_recipe("w4a16"))
    assert parse_recipe("w4a8kv4").weight_format == "qoq" and parse_recipe("w4a8g64kv4-liquid").group == 64
    assert (parse_recipe("w4a16k8v4").k_bits, parse_recipe("w4a16k8v4").v_bits) == (8, 4)


@pytest.mark.parametrize("rotate", ["qkv", "gate_up", ["qkv", "gate_up"]])
def test_qoq_online_rotation_ablation(rotate):
    m, a, fields, _, lm = run_algo("qoq", "w4a8kv4", rotate=rotate)
    sites = [rotate] if isinstance(rotate, str) else rotate
    shorts = {u for s in sites for u in {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}[s]}
    assert {n.split(".")[-2] for n in m.fake.input_rotation} == shorts
    assert len(m.fake.input_rotation) == len(shorts) * lm.config.num_layers
    assert "online at " + "/".join(sites) in a.params["rotation"]
    tok = random_tokens(2, 32, seed=9)
    ref = TorchLlama(lm.config, lm.tensors).logits(tok)
    err = float((m.logits(tok) - ref).norm() / ref.norm())
    assert 0 < err < 0.3, err
    # the rotation is part of the model (the weights hold W·H): dropping it changes the logits
    got = m.logits(tok)
    m.fake.input_rotation = {}
    assert float((m.logits(tok) - got).norm() / got.norm()) > 0.05


def test_qoq_online_rotation_without_folding_keeps_the_norm_weights():
    m, a, _, _, lm = run_algo("qoq", "w4a8kv4", rotate=["qkv", "gate_up"], fold_norms=False)
    assert a.params["rotation"].endswith("RMSNorm weights not folded")
    norm = "model.layers.0.post_attention_layernorm.weight"
    assert torch.equal(m.weights[norm], torch.from_numpy(lm.tensors[norm]))
    assert not bool((m.weights[norm] == 1).all())
    m2, _, _, _, _ = run_algo("qoq", "w4a8kv4", rotate=["qkv", "gate_up"])
    assert bool((m2.weights[norm] == 1).all())  # the default folds them


def test_qoq_bad_rotate_option():
    with pytest.raises(ValueError, match="rotate must be True, False or block-input sites"):
        algorithm_class("qoq")(parse_recipe("w4a8kv4"), rotate="down_proj")


def test_qoq_protective_range_off_uses_the_plain_s8_range():
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(1))
    for s8_max in (119, 127):
        f = quantize_rtn(w, "qoq", 128, s8_max=s8_max)
        np.testing.assert_allclose(f.channel_scales, (w.abs().amax(1) / s8_max).numpy(), rtol=1e-6)
    assert quantize_rtn(w, "qoq", 128).channel_scales.tolist() == quantize_rtn(w, "qoq", 128, s8_max=119).channel_scales.tolist()
    with pytest.raises(ValueError, match="s8_max must be in"):
        quantize_rtn(w, "qoq", 128, s8_max=128)
    _, a, fields, _, _ = run_algo("qoq", "w4a8kv4", protective_range=False)
    overflow = a.params["s8_overflow_fraction"]
    assert set(overflow) == set(fields) and all(0 <= v < 1 for v in overflow.values())
    # the level-2 grid of a plain-range row can leave [-128, 127] (what the protective range prevents)
    assert max(overflow.values()) > 0
    _, a119, _, _, _ = run_algo("qoq", "w4a8kv4")
    assert "s8_overflow_fraction" not in a119.params


def test_qoq_ablation_options_are_not_written(tmp_path):
    from lowbit.quantize.api import quantize
    for opts in (dict(rotate="qkv"), dict(protective_range=False)):
        with pytest.raises(ValueError, match="ablations of the torch model"):
            quantize(None, "w4a8kv4", "qoq", tmp_path / "out", calib=[tmp_path], **opts)
