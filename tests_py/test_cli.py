"""`lowbit <verb>` through lowbit.cli.main (and one real subprocess): generate, chat (stdin), perplexity, bench, info,
and bad input as `lowbit <verb>: error: ...` with exit status 2 and no traceback."""
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lowbit import cli
from test_models_loader import _default_gguf

GPL3 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eval" / "gpl-3.txt"


@pytest.fixture(scope="module")
def loads():
    """cli._load, remembering what it was asked for and loading each distinct model once per module."""
    _default_gguf()
    real, cache, calls = cli._load, {}, []

    def load(args):
        key = (args.model, args.recipe, args.device, args.dtype, args.threads, args.gpu_memory_fraction,
               args.no_cuda_graphs)
        calls.append(key)
        if key not in cache:
            cache[key] = real(args)
        return cache[key]

    cli._load = load
    yield calls
    cli._load = real


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_default_model_chat_template_and_raw(loads, capsys):
    code, out, err = run(capsys, "generate", "--max-tokens", "12", "--quiet", "What is the capital of France?")
    assert code == 0 and "Paris" in out and not out.startswith("What is")  # the reply only, via the chat template
    assert loads[-1] == (None, None, "cpu", None, None, 0.9, False)  # no --model: the default SmolLM2
    # no --recipe: the file's precision (SmolLM2's Q4_1 layers as stored)
    assert cli._load(cli.build_parser().parse_args(["generate", "hi"])).recipe == "w4a16g32"
    assert cli._load(cli.build_parser().parse_args(["generate", "hi"])).dtype == "f32"  # no --dtype: f32 on the CPU
    assert re.search(r"\[\d+ tokens, (stop|length), ttft \d+ ms", err)
    code, out, _ = run(capsys, "generate", "--raw", "--max-tokens", "6", "--quiet", "The capital of France is")
    assert code == 0 and out.startswith("The capital of France is") and "Paris" in out
    code, out, _ = run(capsys, "generate", "--raw", "--max-tokens", "4", "--quiet", "One", "Two")
    assert code == 0 and out.count("--- ") == 2 and "--- One" in out and "--- Two" in out


def test_generate_with_model_path_and_sampling_flags(loads, capsys):
    path = str(_default_gguf())
    argv = ["generate", "--model", path, "--raw", "--quiet", "--max-tokens", "8", "--temperature", "0.9",
            "--top-k", "20", "--top-p", "0.9", "--seed", "7", "Once upon a time"]
    code, first, _ = run(capsys, *argv)
    code2, again, _ = run(capsys, *argv)
    assert code == code2 == 0 and first == again and loads[-1][0] == path  # seeded sampling reproduces


def test_chat_reads_turns_from_stdin(loads, capsys, monkeypatch):
    too_long = " x" * 9000  # 9000 tokens: more than the 8192-token context
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"What is 2 + 2?\n\n{too_long}\nSay hi.\n/exit\n"))
    code, out, err = run(capsys, "chat", "--quiet", "--max-tokens", "16")
    assert code == 0
    # "> " before each read: answer 1, a blank line (skipped), the too-long turn (no answer), answer 3, /exit
    turns = out.split("> ")
    assert len(turns) == 6 and "4" in turns[1] and turns[2] == "" and turns[3] == "\n" and turns[4].strip()
    assert err.startswith("lowbit chat: error: prompt 0:") and "exceed the model's context" in err


def test_perplexity_verb(loads, capsys, tmp_path):
    if not GPL3.is_file():
        pytest.skip(f"shared eval data not found at {GPL3}")
    code, out, _ = run(capsys, "perplexity", "--quiet", "--text", str(GPL3), "--window", "64", "--max-tokens", "256")
    assert code == 0
    got = float(re.search(r"perplexity ([\d.]+) \(w4a16g32, window 64, first 256 tokens", out).group(1))
    args = cli.build_parser().parse_args(["perplexity", "--quiet", "--text", str(GPL3)])
    ref = cli._load(args).perplexity(GPL3.read_text(), window=64, max_tokens=256)
    assert got == pytest.approx(ref, abs=1e-4) and 5 < got < 200


def test_bench_and_info_verbs(loads, capsys):
    code, out, _ = run(capsys, "bench", "--quiet", "--prompt-tokens", "24", "--new-tokens", "6")
    assert code == 0
    m = re.search(r"w4a16g32: prefill ([\d.]+) tok/s \(24 tokens\), decode ([\d.]+) tok/s \(6 new tokens\)", out)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0
    code, out, _ = run(capsys, "info", "--quiet")
    assert code == 0 and "arch        llama: 30 layers, hidden 576, 9/3 heads x 64" in out and "recipe      w4a16g32" in out
    # The optional GPU libraries the build found are named in CUDA builds only (a CPU build has neither).
    from lowbit import _core
    from lowbit.info import cuda_libraries
    libs = cuda_libraries()
    assert set(libs) == {"cublaslt", "nccl"}
    if _core.has_cuda_build():
        assert re.search(r"cuda        build yes, device .*; cublaslt (yes|no), nccl (yes|no)", out), out
    else:
        assert libs == {"cublaslt": False, "nccl": False} and "cuda        build no, device not available\n" in out + "\n"


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "/nonexistent/m.gguf", "hi"], "model not found: /nonexistent/m.gguf"),
    (["generate", "--recipe", "w5a16", "hi"], "unknown recipe 'w5a16'"),
    (["generate", "--max-tokens", "0", "hi"], "max_tokens must be a positive integer, got 0"),
    (["generate", "--top-p", "1.5", "hi"], r"top_p must be in \(0, 1\], got 1.5"),
    (["generate", "--temperature", "-1", "hi"], "temperature must be >= 0"),
    (["generate", "--raw", "--max-tokens", "8192", "hi"], "exceed the model's context of 8192 tokens"),
    (["generate", "--raw", ""], "empty prompt"),
    (["generate", "--raw", "bad \udcff bytes"], "not valid UTF-8"),  # what Python makes of non-UTF-8 argv bytes
    (["perplexity", "--text", "/nonexistent/t.txt"], "No such file"),
    (["perplexity", "--text", "NONUTF8", "--window", "64"], r"is not UTF-8 text \(invalid start byte at byte 3\)"),
    (["perplexity", "--text", "NONUTF8", "--window", "1"], "--window must be >= 2, got 1"),
    (["perplexity", "--text", "TEXT", "--window", "9000"], "window 9000 exceeds the model's context"),
    (["bench", "--new-tokens", "1"], "--new-tokens >= 2"),
    (["generate", "--gpu-memory-fraction", "1.5", "hi"], r"gpu_memory_fraction must be in \(0, 1\], got 1.5"),
])
def test_bad_input_exits_2_with_one_line(loads, capsys, tmp_path, argv, message):
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe text")
    (tmp_path / "good.txt").write_text("plain text " * 10)
    names = {"NONUTF8": str(tmp_path / "bad.txt"), "TEXT": str(tmp_path / "good.txt")}
    argv = [names.get(a, a) for a in argv]
    code, out, err = run(capsys, *argv, "--quiet")
    assert code == 2 and out == ""
    assert err.startswith(f"lowbit {argv[0]}: error: ") and re.search(message, err), err
    assert "Traceback" not in err and err.count("\n") == 1


def test_subprocess_error_has_no_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-m", "lowbit", "generate", "--model", str(tmp_path / "missing.gguf"), "hi"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("lowbit generate: error: model not found:") and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "lowbit", "generate", "--bogus-flag"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and "lowbit generate: error: unrecognized arguments: --bogus-flag" in r.stderr
