"""One recipe grammar: the C++ parser (lowbit._core.parse_recipe). Python's RecipeSpec is exactly its fields, bad
recipes raise ValueError with its message (naming the recipe and the position) wherever Python takes a recipe, and
no Python module parses recipe strings by hand."""
import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lowbit import _core
from lowbit.quantize.recipes import RecipeError, RecipeSpec, check_pair, parse_recipe, same_recipe

# (typed, canonical, Python weight_format, act, wa_key): every grammar feature: each weight part (16, 8, 4, fp8),
# each activation part, every group size, the default groups (g128; liquid g64) spelled out, kv and k..v for every
# bit width, both suffixes, case and surrounding spaces.
TABLE = [
    ("w16a16", "w16a16", None, None, "w16a16"),
    ("w16a16kv16", "w16a16", None, None, "w16a16"),
    ("w16a16kv4", "w16a16kv4", None, None, "w16a16"),
    ("w16a16k8v4", "w16a16k8v4", None, None, "w16a16"),
    ("w8a16", "w8a16", "w8", None, "w8a16"),
    ("w8a16kv8", "w8a16kv8", "w8", None, "w8a16"),
    ("w8a8", "w8a8", "w8", "int8", "w8a8"),
    ("w8a8k8v4", "w8a8k8v4", "w8", "int8", "w8a8"),
    ("w4a16", "w4a16", "w4", None, "w4a16"),
    ("w4a16g128", "w4a16", "w4", None, "w4a16"),
    ("w4a16g64kv8", "w4a16g64kv8", "w4", None, "w4a16"),
    ("w4a16g32k8v4", "w4a16g32k8v4", "w4", None, "w4a16"),
    ("w4a16kv2", "w4a16kv2", "w4", None, "w4a16"),
    ("w4a16k16v2", "w4a16k16v2", "w4", None, "w4a16"),
    ("w4a16kc4v4", "w4a16kc4v4", "w4", None, "w4a16"),
    ("w8a8kc2g32v4", "w8a8kc2g32v4", "w8", "int8", "w8a8"),
    ("w4a8", "w4a8", "qoq", "int8", "w4a8"),
    ("w4a8kv4", "w4a8kv4", "qoq", "int8", "w4a8"),
    ("w4a8-qoq", "w4a8", "qoq", "int8", "w4a8"),
    ("w4a8g64kv4-qoq", "w4a8g64kv4", "qoq", "int8", "w4a8"),
    ("w4a8-liquid", "w4a8-liquid", "liquid", "int8", "w4a8-liquid"),
    ("w4a8g64-liquid", "w4a8-liquid", "liquid", "int8", "w4a8-liquid"),
    ("w4a8k8v4-liquid", "w4a8k8v4-liquid", "liquid", "int8", "w4a8-liquid"),
    ("w4a8g128kv4-liquid", "w4a8g128kv4-liquid", "liquid", "int8", "w4a8-liquid"),
    ("w4a4", "w4a4", "qoq", "fmpq", "w4a4"),
    ("w4a4kv4", "w4a4kv4", "qoq", "fmpq", "w4a4"),
    ("w4a4g64kv8", "w4a4g64kv8", "qoq", "fmpq", "w4a4"),
    ("wfp8a16", "wfp8a16", "e4m3", None, "wfp8a16"),
    ("wfp8a8", "wfp8a8", "e4m3", "fp8", "wfp8a8"),
    ("wfp8a8k8v4", "wfp8a8k8v4", "e4m3", "fp8", "wfp8a8"),
    (" W4A16G64KV8 ", "w4a16g64kv8", "w4", None, "w4a16"),
    ("\tW4A8K8V4-LIQUID\n", "w4a8k8v4-liquid", "liquid", "int8", "w4a8-liquid"),
]


@pytest.mark.parametrize("text,canon,fmt,act,wa", TABLE, ids=[row[0].strip() for row in TABLE])
def test_python_view_equals_the_cpp_fields(text, canon, fmt, act, wa):
    core = _core.parse_recipe(text)
    spec = parse_recipe(text)
    assert isinstance(spec, RecipeSpec) and spec.text == core["text"] == canon
    for name in ("text", "weight_bits", "group", "activation", "activation_bits", "variant", "k_bits", "v_bits",
                 "has_kv2", "k_per_channel", "k_group", "kv_format"):
        assert getattr(spec, name) == core[name], name
    # 16-bit weights mean the compute dtype: C++ says f32, Python None
    assert spec.weight_format == (None if core["weight_bits"] == 16 else core["weight_format"])
    assert parse_recipe(canon) == spec and _core.parse_recipe(canon) == core  # the canonical spelling round-trips
    assert same_recipe(text, canon)
    assert (spec.weight_format, spec.act, spec.wa_key) == (fmt, act, wa)


def test_fields_of_the_grammar():
    s = parse_recipe("w4a16g32k8v4")
    assert (s.weight_format, s.weight_bits, s.group, s.activation, s.k_bits, s.v_bits) == ("w4", 4, 32, "float16", 8, 4)
    assert (parse_recipe("w4a8").variant, parse_recipe("w4a8-liquid").variant, parse_recipe("w4a4").variant) == \
        ("qoq", "liquid", "")
    assert (parse_recipe("w4a8").group, parse_recipe("w4a8-liquid").group) == (128, 64)  # default groups
    assert parse_recipe("w4a16kv2").has_kv2 and not parse_recipe("w4a16kv4").has_kv2
    assert parse_recipe("wfp8a8").activation == "fp8_per_token" and parse_recipe("wfp8a8").activation_bits == 8
    assert not same_recipe("w4a8", "w4a8-liquid") and not same_recipe("w4a16", "w5a16")


BAD = [
    ("w5a16", "weight bits must be 16, 8, 4 or fp8", 2), ("w4a3", "activation bits must be 16, 8 or 4", 4),
    ("w4a16g48", "group size must be 32, 64 or 128", 8), ("wfp8a16g32", "applies to 4-bit and int8 weights only", 10),
    ("w8a8g32", "grouped int8 weights run with float activations only", 7),
    ("w4a8kv3", "kv bits must be 16, 8, 4 or 2", 7), ("w4a8k8", "expected 'v'", 6),
    ("w4a16-liquid", "need w4a8", 12), ("w4a8-awq", "expected '-qoq' or '-liquid'", 5),
    ("w4a8kv4x", "unexpected trailing text 'x'", 7), ("w16a8", "16-bit weights need 16-bit activations", 5),
    ("w8a4", "not a supported pair", 4), ("wfp8a4", "fp8 weights run with 16-bit or fp8 activations", 6),
    ("hello", "expected 'w'", 0), ("", "expected 'w'", 0),
]


@pytest.mark.parametrize("text,why,pos", BAD, ids=[t or "empty" for t, _, _ in BAD])
def test_bad_recipes_raise_the_cpp_message(text, why, pos):
    with pytest.raises(ValueError) as cpp:
        _core.parse_recipe(text)
    msg = str(cpp.value)
    assert f"parse_recipe: bad recipe {text!r}: " in msg and why in msg and f"at position {pos};" in msg
    assert "valid recipes look like" in msg
    with pytest.raises(RecipeError) as py:  # RecipeError is a ValueError
        parse_recipe(text)
    assert isinstance(py.value, ValueError) and str(py.value) == msg  # the same message, unchanged


def test_llm_and_quantize_report_the_cpp_message(tmp_path):
    import lowbit
    from lowbit.quantize import api
    with pytest.raises(ValueError, match=r"LLM: unknown recipe 'w4a16g48': parse_recipe: bad recipe 'w4a16g48': "
                                         r"group size must be 32, 64 or 128 at position 8"):
        lowbit.LLM(str(tmp_path / "absent.gguf"), recipe="w4a16g48", progress=False)
    with pytest.raises(RecipeError, match=r"^parse_recipe: bad recipe 'w4a8kv3': kv bits must be 16, 8, 4 or 2 "
                                          r"at position 7"):
        api.quantize(None, "w4a8kv3", "rtn", None, calib=["unused"])


def test_pair_rules_are_quantize_rules_not_grammar():
    spec = parse_recipe("wfp8a8")  # a valid recipe (the engine runs it) that `lowbit quantize` does not write
    with pytest.raises(RecipeError, match="writes fp8 weights for 16-bit activations only"):
        check_pair("rtn", spec)
    check_pair("rtn", parse_recipe("wfp8a16"))
    check_pair("liquid", parse_recipe("w4a8g64-liquid"))
    with pytest.raises(RecipeError, match="does not handle recipe 'w4a8-liquid'"):
        check_pair("qoq", parse_recipe("w4a8-liquid"))


def test_without_the_extension_parsing_says_so():
    """No second grammar: with lowbit._core unavailable, the pure-Python parts import and parse_recipe raises a
    clear error (instead of a Python re-implementation answering)."""
    code = ("import sys; sys.modules['lowbit._core'] = None\n"
            "import lowbit.quantize.recipes as r\n"
            "try:\n    r.parse_recipe('w4a16')\nexcept r.RecipeError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, LOWBIT_NO_CORE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "ERR parsing a recipe needs lowbit's C++ extension (lowbit._core)" in out.stdout


def _package_dir() -> Path:
    spec = importlib.util.find_spec("lowbit")
    return Path(next(iter(spec.submodule_search_locations)))


def test_no_python_recipe_grammar():
    """No module of the installed package pattern-matches recipe strings itself (regexes on w../a../kv..)."""
    import re
    hand = re.compile(r"re\.(compile|match|fullmatch|search)\([^)]*(w\(|a\(16|kv\(|\(16\|8\|4)")
    offenders = [str(p.relative_to(_package_dir())) for p in _package_dir().rglob("*.py")
                 if hand.search(p.read_text(encoding="utf-8"))]
    assert not offenders
    assert "import re" not in (_package_dir() / "quantize" / "recipes.py").read_text(encoding="utf-8")
