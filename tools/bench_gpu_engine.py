"""End-to-end greedy decode throughput of the default model (SmolLM2-135M) on the GPU, f16 compute: lowbit's
engine per GPU recipe beside HF transformers (f16, eager, SDPA attention) in the same process when it is
installed. Each case is a batch of identical 8-token prompts generating 128 new tokens with EOS ignored; the
figure is new tokens per second over the whole request (prefill included), median of 3 runs after a warm-up
per batch size (which also captures that batch's CUDA graphs). Two recipes run again with cuda_graphs=False
("lowbit-eager") to show what the graphs buy.
Prints one JSON line per case; `python3 tools/bench_gpu_engine.py [out.json]` also writes them with the
device, date and commit."""
import datetime
import json
import os
import statistics
import sys
import time

import torch

import lowbit

NEW_TOKENS, BATCHES, REPEATS = 128, (1, 16, 64), 3
# w4a16kv8 keeps the Q4_1 file's weights as stored (runs as w4a16g32kv8); w4a16g128kv8 re-quantizes them.
RECIPES = ("w16a16", "w4a16kv8", "w4a16g128kv8", "w4a16kv4", "w8a8kv8")
EAGER_RECIPES = ("w16a16", "w4a16kv8")
PROMPT = "The history of the printing press begins"


def run_lowbit(eng, prompts, new_tokens, first_id):
    for i, p in enumerate(prompts):
        eng.add_request(first_id + i, p, temperature=0.0, max_tokens=new_tokens)  # no stop ids: EOS ignored
    made, steps = 0, 0
    start = time.perf_counter()
    while eng.has_unfinished():
        made += sum(ev.token >= 0 for ev in eng.step())
        steps += 1
    return made, steps, time.perf_counter() - start


def case(engine, recipe, batch, runs):
    """runs: [(tokens, steps, seconds)] -> one result row (median seconds)."""
    sec = statistics.median(r[2] for r in runs)
    made, steps = runs[0][0], runs[0][1]
    assert made == batch * NEW_TOKENS, f"{engine} {recipe} batch {batch}: {made} tokens, expected {batch * NEW_TOKENS}"
    return {"engine": engine, "recipe": recipe, "batch": batch, "tokens": made, "steps": steps,
            "seconds_median": round(sec, 4), "seconds_all": [round(r[2], 4) for r in runs],
            "tokens_per_s": round(made / sec, 1), "ms_per_step": round(1000 * sec / steps, 3)}


def bench_lowbit(results):
    for recipe, graphs in [(r, True) for r in RECIPES] + [(r, False) for r in EAGER_RECIPES]:
        llm = lowbit.LLM(recipe=recipe, device="cuda", dtype="f16", progress=False, cuda_graphs=graphs,
                         prefix_caching=False)  # repeated prompts must be prefilled, not served from the cache
        prompt = llm.tokenizer.encode(PROMPT)[:8]
        rid = 0
        for batch in BATCHES:
            run_lowbit(llm.engine, [prompt] * batch, 8, rid)  # warm-up: kernels loaded, caches filled, graphs captured
            rid += batch
            runs = []
            for _ in range(REPEATS):
                runs.append(run_lowbit(llm.engine, [prompt] * batch, NEW_TOKENS, rid))
                rid += batch
            results.append(case("lowbit" if graphs else "lowbit-eager", recipe, batch, runs))
            results[-1]["recipe_run"] = llm.recipe  # what the loader made of it (the file's g32 grid kept or not)
            print(json.dumps(results[-1]), flush=True)
        del llm


def bench_transformers(results):
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print(f"transformers not installed ({e}); HF peer skipped", flush=True)
        return
    from lowbit.models.registry import default_model_path
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float16)
    model = model.to("cuda").eval()
    from lowbit.models import load_model_source  # the same 8 prompt tokens as lowbit's
    prompt = load_model_source(None, progress=False).tokenizer.encode(PROMPT)[:8]

    def run(batch, new_tokens):
        ids = torch.tensor([prompt] * batch, device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return int(out.shape[1] - ids.shape[1]) * batch, new_tokens, time.perf_counter() - start

    run(4, 8)
    for batch in BATCHES:
        results.append(case("transformers", "f16", batch, [run(batch, NEW_TOKENS) for _ in range(REPEATS)]))
        print(json.dumps(results[-1]), flush=True)


def main():
    results = []
    bench_lowbit(results)
    bench_transformers(results)
    if len(sys.argv) > 1:
        meta = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                "commit": os.environ.get("LOWBIT_COMMIT", "unknown"), "torch": torch.__version__,
                "model": "SmolLM2-135M-Instruct", "prompt_tokens": 8, "new_tokens": NEW_TOKENS,
                "statistic": f"median of {REPEATS} runs after a warm-up"}
        with open(sys.argv[1], "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
