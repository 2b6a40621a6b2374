"""GGUF types lowbit has no kernel for as stored (K-quants, Q5_0/Q5_1, IQ4_NL, BF16, ...) load dequantized exactly
as gguf-py's reference does, with one log line naming the tensors and what they became; types gguf-py cannot read
fail naming the file, tensor and type. Files are written with gguf's GGUFWriter: through gguf.quants.quantize where
gguf-py has a quantizer, else as random blocks of the type (every byte pattern is a valid block once its f16 scales
are finite). References: gguf-py's dequantizer and an F32 file holding its values, never lowbit's own output."""
import re

import numpy as np
import pytest
import torch

import lowbit
from lowbit.models import gguf_loader
from test_gguf_native import LINEAR_SUFFIXES
from test_llm import tiny_tensors
from test_models_loader import _llama_cpp_permute, _tiny_config, make_gguf

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

# type -> byte offsets of its f16 scale fields inside a block (ggml's block_* structs)
RANDOM_BLOCK_TYPES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
                      "IQ4_NL": (0,), "IQ4_XS": (0,)}
QUANTIZED_BY_GGUF = ("Q5_0", "Q5_1", "BF16", "F16")


def _config():
    # k of every linear a multiple of 256 (the K-quants' super-block)
    return _tiny_config(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64)


def _random_blocks(qtype: str, rows: int, k: int, rng) -> np.ndarray:
    block, size = gguf.constants.GGML_QUANT_SIZES[T[qtype]]
    blocks = rng.integers(0, 256, (rows, k // block, size), dtype=np.uint8)
    for off in RANDOM_BLOCK_TYPES[qtype]:
        scale = rng.uniform(0.001, 0.02, (rows, k // block)).astype(np.float16)
        blocks[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, k // block, 2)
    return blocks.reshape(rows, -1)


def _file(tmp_path, linear_type: str, seed=0):
    """A tiny Llama whose linears are all `linear_type`; returns (path, config, the gguf-py dequantized linears in
    HF row order)."""
    config = _config()
    tensors = tiny_tensors(config, seed=seed)
    linears = [n for n in tensors if n.endswith(LINEAR_SUFFIXES)]
    rng = np.random.default_rng(seed)
    raw, qtypes, ref = {}, {}, {}
    for name in linears:
        n, k = tensors[name].shape
        if linear_type in RANDOM_BLOCK_TYPES:
            raw[name] = (_random_blocks(linear_type, n, k, rng), T[linear_type])
            file_rows = gguf.quants.dequantize(raw[name][0], T[linear_type]).reshape(n, k)
        else:
            qtypes[name] = T[linear_type]
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads if "k_proj" in name else None
            w = tensors[name] if heads is None else _llama_cpp_permute(tensors[name], heads)
            file_rows = gguf.quants.dequantize(gguf.quants.quantize(w, T[linear_type]), T[linear_type]).reshape(n, k)
        ref[name] = file_rows  # in the file's row order (q/k permuted as llama.cpp writes them)
    path = make_gguf(tmp_path / f"tiny-{linear_type}.gguf", config, tensors, qtypes=qtypes, raw=raw)
    return path, config, ref


def _unpermuted(name, rows, config):
    """The loader's HF-order tensor back in the file's order, by the converter's own permutation."""
    heads = config.num_heads if "q_proj" in name else config.num_kv_heads if "k_proj" in name else None
    return rows if heads is None else _llama_cpp_permute(rows, heads)


@pytest.mark.parametrize("linear_type", sorted(RANDOM_BLOCK_TYPES) + list(QUANTIZED_BY_GGUF))
def test_loads_exactly_as_gguf_dequantizes(tmp_path, linear_type):
    path, config, ref = _file(tmp_path, linear_type)
    loaded = gguf_loader.load_gguf(path, progress=False)
    assert loaded.native_fields == {}  # nothing of these types runs as stored
    assert loaded.linear_types == {linear_type: len(ref)}
    for name, file_rows in ref.items():
        got = _unpermuted(name, loaded.tensors[name], config)
        np.testing.assert_array_equal(got, file_rows.astype(np.float32), err_msg=name)


@pytest.mark.parametrize("linear_type", ["Q4_K", "Q5_K", "Q6_K", "Q5_0"])
def test_engine_matches_the_f32_file_and_names_the_tensors(tmp_path, linear_type, capfd):
    path, config, ref = _file(tmp_path, linear_type, seed=1)
    llm = lowbit.LLM(path, progress=True)  # no recipe: the exact dequantized values as f32 weights
    err = capfd.readouterr().err
    assert llm.recipe == "w16a16"
    assert f"no recipe given; w16a16 follows the file (no lowbit kernel runs its {linear_type} linears" in err
    line = next(x for x in err.splitlines() if "dequantized exactly" in x)
    assert re.search(rf"{len(ref)} linears dequantized exactly \(gguf-py's reference\) and kept as f32 weights "
                     rf"\(recipe w16a16\).*{linear_type}: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down of "
                     rf"blk\.0-1 \(14 tensors\)", line), line
    assert err.count("dequantized exactly") == 1  # said once
    # the same model with the reference values stored as F32 (written in HF order; make_gguf permutes q/k)
    tensors = tiny_tensors(config, seed=1)
    for name, file_rows in ref.items():
        heads = config.num_heads if "q_proj" in name else config.num_kv_heads if "k_proj" in name else None
        tensors[name] = file_rows if heads is None else gguf_loader.unpermute_rope_rows(file_rows, heads)
    f32 = lowbit.LLM(make_gguf(tmp_path / "tiny-f32.gguf", config, tensors), progress=False)
    assert f32.recipe == "w16a16" and f32.load_note is None
    ids = [5, 80, 33, 120, 7, 250, 64, 9]
    a, b = (torch.from_dlpack(m.engine.logits(ids)).double() for m in (llm, f32))
    assert torch.equal(a, b)  # identical weights and kernels: identical logits


def test_a_quantizing_recipe_names_what_it_re_quantizes(tmp_path, capfd):
    path, _, ref = _file(tmp_path, "Q6_K", seed=2)
    llm = lowbit.LLM(path, recipe="w4a16", progress=True)
    err = capfd.readouterr().err
    assert llm.recipe == "w4a16"
    assert f"{len(ref)} linears dequantized exactly (gguf-py's reference) and re-quantized round-to-nearest to " \
           "w4 g128 (recipe w4a16)" in err


def test_a_type_gguf_py_cannot_read_fails_by_name(tmp_path):
    config = _config()
    tensors = tiny_tensors(config)
    name = "model.layers.1.mlp.up_proj.weight"
    n, k = tensors[name].shape
    block, size = gguf.constants.GGML_QUANT_SIZES[T.Q8_K]
    raw = {name: (np.zeros((n, k // block * size), np.uint8), T.Q8_K)}
    path = make_gguf(tmp_path / "tiny-q8k.gguf", config, tensors, raw=raw)
    with pytest.raises(NotImplementedError, match=r"tiny-q8k.gguf: tensor 'blk.1.ffn_up.weight' has type Q8_K, "
                                                  r"which gguf-py cannot dequantize"):
        gguf_loader.load_gguf(path, progress=False)
