"""Greedy decode throughput of the default model (SmolLM2-135M) through the engine on the GPU, f16
compute: tokens per second over whole requests (8-token prompts, 128 new tokens, EOS ignored), per
recipe and batch size. Prints one JSON line per case; `python3 tools/bench_gpu_engine.py [out.json]`."""
import json
import sys
import time

import lowbit


def run(eng, prompts, new_tokens, first_id):
    for i, p in enumerate(prompts):
        eng.add_request(first_id + i, p, temperature=0.0, max_tokens=new_tokens)
    made, steps = 0, 0
    start = time.perf_counter()
    while eng.has_unfinished():
        made += sum(ev.token >= 0 for ev in eng.step())
        steps += 1
    return made, steps, time.perf_counter() - start


def main():
    results = []
    for recipe in ("w16a16", "w4a16kv8"):
        llm = lowbit.LLM(recipe=recipe, device="cuda", dtype="f16", progress=False)
        prompt = llm.tokenizer.encode("The history of the printing press begins")[:8]
        rid = 0
        run(llm.engine, [prompt], 8, rid)  # warm-up: kernels loaded, allocator caches filled
        rid += 1
        for batch in (1, 16, 64):
            made, steps, sec = run(llm.engine, [prompt] * batch, 128, rid)
            rid += batch
            r = {"recipe": recipe, "batch": batch, "tokens": made, "steps": steps, "seconds": round(sec, 3),
                 "tokens_per_s": round(made / sec, 1), "ms_per_step": round(1000 * sec / steps, 3)}
            print(json.dumps(r), flush=True)
            results.append(r)
        del llm
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
