"""`lowbit quantize --export-format compressed-tensors`: a lowbit directory rewritten as a compressed-tensors
checkpoint holds the same integers and scales, lowbit's reader loads it back to the same fields bit for bit and
the engine gives the same logits; compressed-tensors' own decompressor (when installed) agrees."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lowbit  # noqa: E402
from lowbit.models import load_model_source  # noqa: E402
from lowbit.quantize import api  # noqa: E402
from lowbit.quantize.cli import main as quantize_main  # noqa: E402
from lowbit.quantize.export_compressed_tensors import ExportError, export_compressed_tensors, pack_int32  # noqa: E402
from lowbit.quantize.formats import dequantize  # noqa: E402
from lowbit.quantize.testing import tiny_llama  # noqa: E402

SHAPE = dict(hidden=256, intermediate=384, heads=4, kv_heads=2, layers=2)  # whole groups of 128 (compressed-tensors)
IDS = [5, 77, 140, 3, 251, 99, 18, 200]


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    rng = np.random.default_rng(0)
    words = ["license", "software", "free", "copy", "the", "of", "and", "you", "program", "source"]
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text(" ".join(rng.choice(words, 400)), encoding="utf-8")
    return path


def lowbit_dir(tmp_path, calib, recipe, algo, shape=SHAPE, **opts):
    out = tmp_path / f"{recipe}-{algo}"
    api.quantize(None, recipe, algo, out, calib=[calib], num_sequences=2, seq_len=32, progress=False,
                 loaded=tiny_llama(seed=5, **shape), **opts)
    return out


def assert_same_fields(a, b):
    assert set(a) == set(b)
    for name in a:
        fa, fb = a[name], b[name]
        assert (fa.format, fa.n, fa.k, fa.group) == (fb.format, fb.n, fb.k, fb.group), name
        np.testing.assert_array_equal(fa.q, fb.q, err_msg=name)
        np.testing.assert_array_equal(fa.scales, fb.scales, err_msg=name)
        if fa.symmetric == fb.symmetric:
            assert (fa.zeros is None) == (fb.zeros is None)
            if fa.zeros is not None:
                np.testing.assert_array_equal(fa.zeros, fb.zeros, err_msg=name)
        np.testing.assert_array_equal(dequantize(fa), dequantize(fb), err_msg=name)


@pytest.mark.parametrize("recipe,algo,opts", [("w4a16", "rtn", {}), ("w4a16g64", "awq", {}),
                                              ("w4a16", "gptq", {"act_order": True}), ("w8a16", "gptq", {}),
                                              ("wfp8a16", "rtn", {})])
def test_round_trip_is_bit_exact(tmp_path, calib, recipe, algo, opts):
    src = lowbit_dir(tmp_path, calib, recipe, algo, **opts)
    out = export_compressed_tensors(src, tmp_path / "ct")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    orig, back = load_model_source(src, progress=False), load_model_source(out, progress=False)
    assert back.manifest["checkpoint_format"] == "compressed-tensors"
    assert_same_fields(orig.fields, back.fields)
    assert set(orig.tensors) == set(back.tensors)
    for name in orig.tensors:
        np.testing.assert_array_equal(orag := orig.tensors[name], back.tensors[name], err_msg=name)
        assert orag.dtype == np.float32
    a = lowbit.LLM(str(src), dtype="f32", progress=False).logits(IDS)
    b = lowbit.LLM(str(out), dtype="f32", progress=False).logits(IDS)
    np.testing.assert_array_equal(a, b)


def test_compressed_tensors_reads_the_export(tmp_path, calib):
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file
    src = lowbit_dir(tmp_path, calib, "w4a16", "rtn")
    out = export_compressed_tensors(src, tmp_path / "ct")
    cfg = QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    scheme = cfg.config_groups["group_0"]
    raw = load_file(str(out / "model.safetensors"))
    fields = load_model_source(src, progress=False).fields
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight"):
        m, f = name[:-len(".weight")], fields[name]
        signed = torch.from_numpy((f.q.astype(np.int16) - 8).astype(np.int8))
        assert torch.equal(pack_to_int32(signed, 4), raw[m + ".weight_packed"])
        sd = {k[len(m) + 1:]: v for k, v in raw.items() if k.startswith(m + ".")}
        sd["weight_scale"] = sd["weight_scale"].float()  # the library computes in the scale's dtype: f32 is exact
        lib = PackedQuantizationCompressor.decompress(sd, scheme)["weight"].numpy()
        np.testing.assert_array_equal(lib, dequantize(f))
    assert ct.__version__


def test_pack_int32_pads_the_last_word():
    v = np.arange(10, dtype=np.uint8).reshape(1, 10) % 16
    words = pack_int32(v, 4).view(np.uint32)
    assert words.shape == (1, 2) and words[0, 0] == 0x76543210 and words[0, 1] == 0x98


def test_refusals_name_the_reason(tmp_path, calib):
    src = lowbit_dir(tmp_path, calib, "w8a8", "smoothquant", alpha=0.5)
    with pytest.raises(ExportError, match="quantizes activations"):
        export_compressed_tensors(src, tmp_path / "ct")
    src = lowbit_dir(tmp_path, calib, "w4a16", "rtn")  # give one linear an input permutation (as QoQ/FMPQ do)
    from safetensors.numpy import load_file, save_file
    raw = load_file(str(src / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    raw[name + ".input_perm"] = np.random.default_rng(0).permutation(384).astype(np.int64)
    save_file(raw, str(src / "model.safetensors"))
    manifest = json.loads((src / "lowbit_quant.json").read_text())
    manifest["weights"][name]["input_perm"] = name + ".input_perm"
    (src / "lowbit_quant.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="down_proj.weight .and 0 more. has an input permutation"):
        export_compressed_tensors(src, tmp_path / "ct2")
    src = lowbit_dir(tmp_path, calib, "w4a16", "rtn", shape=dict(SHAPE, intermediate=352))
    with pytest.raises(ExportError, match=r"mlp.down_proj.weight has k = 352 input channels, not a multiple of its group 128"):
        export_compressed_tensors(src, tmp_path / "ct3")


def test_cli_export_format(tmp_path, calib, capsys, monkeypatch):
    real = api.quantize
    monkeypatch.setattr(api, "quantize", lambda *a, **k: real(*a, loaded=tiny_llama(seed=5, **SHAPE), **k))
    out = tmp_path / "cli-ct"
    rc = quantize_main(["--recipe", "w4a16kv8", "--algo", "rtn", "--out", str(out), "--calib", str(calib),
                        "--calib-seqs", "2", "--calib-len", "32", "--export-format", "compressed-tensors", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0 and "as compressed-tensors" in text and "recipe='w4a16kv8'" in text
    assert not (out / "lowbit_quant.json").exists()
    llm = lowbit.LLM(str(out), recipe="w4a16kv8", progress=False)
    assert np.isfinite(llm.logits(IDS)).all()
