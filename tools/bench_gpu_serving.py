"""Issue 17's serving targets in one command: `lowbit serve` against the same engine's offline throughput, and the
shared-prefix TTFT with prefix caching on and off, on a random-weight model of a config.json's shape.

    python tools/bench_gpu_serving.py --model DIR_WITH_CONFIG_JSON --recipe w4a8kv4 --device cuda

1. offline: `LLM.generate` on --num-requests random token-id prompts (--input-len in, --output-len out,
   ignore_eos), in a child process so that its GPU memory is gone before a server starts;
2. server with prefix caching on (started once): the same prompts all at once (saturation), then
   --rate-requests fresh prompts at each of --rates req/s (Poisson), then the shared-prefix scenario;
3. server with --no-prefix-caching: the shared-prefix scenario again.
Every run goes through tools/bench_serving.py's HTTP client (TTFT, TPOT, ITL percentiles, errors). One JSON goes to
--out (default $OUT/bench_gpu_serving.json, $OUT defaulting to ./gpu_out) and a short table is printed. Exit status
1 when any request failed. Defaults are sized for Llama-3-8B on one H100 (about 5 minutes, 3 model builds)."""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serving as bs  # noqa: E402  (the online benchmark's workload, client and statistics)


# The model: Llama-3-8B's shape (its config.json, without weights or tokenizer).
LLAMA3_8B_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
                    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 500000.0,
                    "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": False,
                    "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"}


def write_llama3_8b_config(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    Path(directory, "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG, indent=1))


# ------------------------------------------------------------------ arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model directory (config.json; weights unless --load-format random)")
    p.add_argument("--write-llama3-8b-config", action="store_true",
                   help="write Llama-3-8B's config.json into --model and exit")
    p.add_argument("--load-format", default="random", choices=("auto", "random"), help="default random")
    p.add_argument("--recipe", default="w4a8kv4")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: the engine's (f16 on a GPU, f32 on the CPU)")
    p.add_argument("--max-seqs", type=int, default=128, help="sequences the engine runs at once, offline and served")
    p.add_argument("--kv-cache-memory", type=int, default=None, help="KV cache bytes (default: the engine's choice)")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-requests", type=int, default=256, help="offline and saturation requests")
    p.add_argument("--rates", default="2,8,32", help="Poisson request rates (req/s), comma-separated")
    p.add_argument("--rate-requests", type=int, default=64, help="requests per rate")
    p.add_argument("--prefix-len", type=int, default=2000, help="shared-prefix scenario: common prefix tokens")
    p.add_argument("--prefix-suffix-len", type=int, default=48, help="... distinct tokens after it")
    p.add_argument("--prefix-output-len", type=int, default=16, help="... generated tokens")
    p.add_argument("--prefix-requests", type=int, default=100,
                   help="0 skips the shared-prefix runs and the second server (saturation and rates only)")
    p.add_argument("--prefix-rate", type=bs.parse_rate, default=math.inf, help="... req/s (default inf: all at once)")
    p.add_argument("--warmup", type=int, default=4, help="requests (at once, short) before measuring, per engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--launch-timeout", type=float, default=600, help="seconds to wait for a server to be healthy")
    p.add_argument("--client-procs", type=int, default=1,
                   help="client processes the saturation run is spread over (one may bound ~1000 streams)")
    p.add_argument("--out", default=None, help="JSON path (default $OUT/bench_gpu_serving.json)")
    p.add_argument("--offline-child", default=None, help=argparse.SUPPRESS)  # internal: run step 1, write here
    args = p.parse_args(argv)
    args.rate_list = [bs.parse_rate(r) for r in args.rates.split(",") if r.strip()]
    for name in ("input_len", "output_len", "num_requests", "rate_requests", "max_seqs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.prefix_requests < 0:
        p.error("--prefix-requests must be >= 0")
    if args.client_procs < 1:
        p.error("--client-procs must be >= 1")
    if args.prefix_len < 1 or args.prefix_suffix_len < 0 or args.prefix_output_len < 1 or args.warmup < 0:
        p.error("--prefix-len and --prefix-output-len must be >= 1, --prefix-suffix-len and --warmup >= 0")
    return args


def token_range(args) -> tuple[int, int]:
    """Random prompt ids: bench_serving's [100, 10000), kept inside a small config's vocabulary."""
    try:
        vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    except (OSError, ValueError, KeyError):
        vocab = 10000
    hi = min(10000, vocab)
    return min(100, hi // 2), hi


def prompts(args, seed: int, num: int, input_len: int, shared: int = 0) -> list[list[int]]:
    return bs.build_prompts(seed, num, input_len, shared, *token_range(args))


# ------------------------------------------------------------------ step 1: offline, in a child process
def device_name(device: str) -> str:
    if str(device).startswith("cuda"):
        try:
            import torch
            return torch.cuda.get_device_name()
        except Exception:  # noqa: BLE001 - no torch, or no usable GPU: say what was asked for
            return device
    return f"cpu: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def run_offline(args) -> dict:
    import lowbit
    llm = lowbit.LLM(args.model, load_format=args.load_format, recipe=args.recipe, device=args.device,
                     dtype=args.dtype, max_seqs=args.max_seqs, kv_cache_memory=args.kv_cache_memory,
                     gpu_memory_fraction=args.gpu_memory_fraction, num_threads=args.threads)
    sampling = {"temperature": 0.0, "ignore_eos": True}  # what bench_serving sends
    if args.warmup:
        llm.generate(prompts(args, args.seed + 1000, args.warmup, args.input_len), max_tokens=min(16, args.output_len),
                     **sampling)
    work = prompts(args, args.seed, args.num_requests, args.input_len)
    start = time.perf_counter()
    outs = llm.generate(work, max_tokens=args.output_len, **sampling)
    duration = time.perf_counter() - start
    out_tokens = sum(len(o.token_ids) for o in outs)
    in_tokens = sum(map(len, work))
    return {"device": device_name(args.device), "num_requests": len(work), "duration_s": duration,
            "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
            "request_throughput": len(work) / duration, "output_throughput": out_tokens / duration,
            "total_token_throughput": (in_tokens + out_tokens) / duration}


def offline_in_child(argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "offline.json")
        subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--offline-child", path], check=True)
        return json.loads(Path(path).read_text())


# ------------------------------------------------------------------ steps 2 and 3: the server
def launch_args(args, prefix_caching: bool) -> str:
    a = ["--model", args.model, "--load-format", args.load_format, "--recipe", args.recipe, "--device", args.device,
         "--max-seqs", str(args.max_seqs), "--gpu-memory-fraction", str(args.gpu_memory_fraction),
         # Every request of a run may wait: none should be refused for capacity.
         "--max-queue", str(max(args.num_requests, args.rate_requests, args.prefix_requests, args.warmup)),
         "--log-level", "warning"]
    for flag, value in (("--dtype", args.dtype), ("--kv-cache-memory", args.kv_cache_memory),
                        ("--threads", args.threads)):
        if value is not None:
            a += [flag, str(value)]
    return shlex.join(a + ([] if prefix_caching else ["--no-prefix-caching"]))


def run(base_url: str, model: str, work: list[list[int]], output_len: int, rate: float, seed: int,
        client_procs: int = 1) -> dict:
    results, duration = bs.run_workload(base_url, None, model, work, output_len, rate, seed, None, client_procs)
    summary = bs.summarize(results, duration, rate)
    del summary["requests"]  # per-request lists would make the JSON large; the percentiles are what we report
    return summary


def warm(args, base_url: str, model: str) -> None:
    if args.warmup:
        run(base_url, model, prompts(args, args.seed + 1000, args.warmup, args.input_len), min(16, args.output_len),
            math.inf, args.seed)


def prefix_workload(args) -> list[list[int]]:
    return prompts(args, args.seed + 500, args.prefix_requests, args.prefix_len + args.prefix_suffix_len,
                   args.prefix_len)


def serve_caching_on(args, report: dict, save) -> None:
    """Saturation, the rate sweep and the shared-prefix scenario on one server; the report is saved after each."""
    with bs.launched_server(launch_args(args, True), args.launch_timeout) as url:
        model = bs.served_model(url, None)
        warm(args, url, model)
        phase(f"saturation: {args.num_requests} requests at once")
        pid = bs.SERVER_PIDS.get(url)
        server_before, client_before = bs.thread_cpu_seconds(pid) if pid else {}, os.times()
        report["saturation"] = run(url, model, prompts(args, args.seed, args.num_requests, args.input_len),
                                   args.output_len, math.inf, args.seed, args.client_procs)
        client_after = os.times()
        # Where the CPU went during the run: the server's threads (its Python ones share one GIL) and the client.
        report["saturation_cpu"] = {
            "server_threads": bs.cpu_between(pid, server_before)[:8] if pid else [],
            "client_s": round(sum(client_after[:4]) - sum(client_before[:4]), 3),
            "client_procs": args.client_procs,
        }
        save()
        for i, rate in enumerate(args.rate_list):  # fresh prompts per rate: nothing cached from an earlier run
            phase(f"{args.rate_requests} requests at {rate} req/s")
            work = prompts(args, args.seed + 1 + i, args.rate_requests, args.input_len)
            report["rates"].append(run(url, model, work, args.output_len, rate, args.seed))
            save()
        if args.prefix_requests:
            phase(f"shared prefix, caching on: {args.prefix_requests} requests")
            report["prefix"]["caching_on"] = run(url, model, prefix_workload(args), args.prefix_output_len,
                                                 args.prefix_rate, args.seed)
            save()


def serve_caching_off(args, report: dict, save) -> None:
    with bs.launched_server(launch_args(args, False), args.launch_timeout) as url:
        model = bs.served_model(url, None)
        warm(args, url, model)
        phase(f"shared prefix, caching off: {args.prefix_requests} requests")
        report["prefix"]["caching_off"] = run(url, model, prefix_workload(args), args.prefix_output_len,
                                              args.prefix_rate, args.seed)
        save()


_T0 = time.perf_counter()


def phase(what: str) -> None:
    print(f"== [{time.perf_counter() - _T0:5.0f} s] {what}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ report
def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def commit() -> str | None:
    return os.environ.get("LOWBIT_COMMIT") or bs.git_commit()


def print_table(r: dict) -> None:
    def ms(run: dict, metric: str, key: str) -> str:
        v = run[metric][key]
        return "-" if v is None else f"{v:.1f}"

    off = r["offline"]
    print(f"\n== lowbit serve, {r['parameters']['recipe']} on {r['device']} (commit {r['commit']})")
    print(f"offline LLM.generate: {off['num_requests']} requests in {off['duration_s']:.2f} s, "
          f"{off['output_throughput']:.1f} out tok/s, {off['total_token_throughput']:.1f} total tok/s")
    print(f"{'run':>12} {'ok/n':>8} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} "
          f"{'TPOT p99':>9} {'ITL p50':>8} {'ITL p99':>8}   (ms)")
    named = [("saturation", r["saturation"])] + [(f"{x['request_rate']} req/s", x) for x in r["rates"]]
    named += [(n, x) for n, x in (("prefix on", r["prefix"]["caching_on"]), ("prefix off", r["prefix"]["caching_off"]))
              if x is not None]
    for name, x in named:
        print(f"{name:>12} {x['completed']:>4}/{x['num_requests']:<3} {x['output_throughput']:>10.1f} "
              f"{ms(x, 'ttft', 'p50_ms'):>9} {ms(x, 'ttft', 'p99_ms'):>9} {ms(x, 'tpot', 'p50_ms'):>9} "
              f"{ms(x, 'tpot', 'p99_ms'):>9} {ms(x, 'itl', 'p50_ms'):>8} {ms(x, 'itl', 'p99_ms'):>8}")
        for msg in x["error_messages"]:
            print(f"{'':>13}error: {msg}")

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"
    cpu = r.get("saturation_cpu")
    if cpu and cpu["server_threads"]:
        busiest = ", ".join(f"{'main' if t['main'] else t['name']} {t['cpu_s']:.1f}" for t in cpu["server_threads"][:5])
        print(f"saturation CPU seconds: server threads {busiest}; client ({cpu['client_procs']} process(es)) "
              f"{cpu['client_s']:.1f}; over {r['saturation']['duration_s']:.1f} s")
    print(f"server saturation / offline output throughput: {fmt(r['throughput_ratio'])} (target >= 0.90x)")
    print(f"shared-prefix TTFT median, caching off / on:   {fmt(r['prefix']['ttft_median_ratio'])} (target >= 5x)")
    print(f"errors: {r['errors']}; wall {r['timings_s']['total']:.0f} s")


def finish(report: dict) -> None:
    """The derived figures, from whatever runs are in the report so far."""
    prefix = report["prefix"]
    runs = [report["saturation"], *report["rates"], prefix["caching_on"], prefix["caching_off"]]
    sat, on, off = report["saturation"], prefix["caching_on"], prefix["caching_off"]
    report["throughput_ratio"] = ratio(sat and sat["output_throughput"],
                                       report["offline"] and report["offline"]["output_throughput"])
    prefix["ttft_median_ratio"] = ratio(off and off["ttft"]["median_ms"], on and on["ttft"]["median_ms"])
    report["targets"] = {"server_ge_90pct_offline": (report["throughput_ratio"] or 0) >= 0.9,
                         "prefix_ttft_ge_5x": (prefix["ttft_median_ratio"] or 0) >= 5}
    report["errors"] = sum(x["errors"] for x in runs if x)
    wanted = runs if report["parameters"]["prefix_requests"] else runs[:-2]
    report["complete"] = all(wanted) and len(report["rates"]) == len(
        [x for x in report["parameters"]["rates"].split(",") if x.strip()])
    report["timings_s"]["total"] = time.perf_counter() - _T0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.write_llama3_8b_config:
        write_llama3_8b_config(args.model)
        print(f"wrote {os.path.join(args.model, 'config.json')}")
        return 0
    if args.offline_child:
        Path(args.offline_child).write_text(json.dumps(run_offline(args)))
        return 0
    # A SIGTERM unwinds like Ctrl-C, so a launched server is stopped rather than left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out_path = args.out or os.path.join(os.environ.get("OUT") or "gpu_out", "bench_gpu_serving.json")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    parameters = {k: v for k, v in vars(args).items()
                  if k not in ("offline_child", "rate_list", "write_llama3_8b_config")}
    parameters["prefix_rate"] = str(args.prefix_rate)
    report = {"benchmark": "gpu_serving", "complete": False,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit(), "device": None, "host": bs.host_info(), "parameters": parameters,
              "offline": None, "saturation": None, "saturation_cpu": None, "rates": [], "throughput_ratio": None,
              "prefix": {"caching_on": None, "caching_off": None, "ttft_median_ratio": None},
              "targets": {}, "errors": 0, "timings_s": {}}

    def save() -> None:  # after every run: a run cut short by a timeout still leaves what it measured
        finish(report)
        Path(out_path).write_text(json.dumps(report, indent=1))

    steps = (("offline", "offline LLM.generate (a child process)", None),
             ("server_caching_on", "lowbit serve, prefix caching on", serve_caching_on),
             ("server_caching_off", "lowbit serve --no-prefix-caching", serve_caching_off))
    if not args.prefix_requests:
        steps = steps[:2]
    try:
        for key, what, step in steps:
            phase(what)
            start = time.perf_counter()
            if step is None:
                report["offline"] = offline_in_child(argv)
                report["device"] = report["offline"]["device"]
            else:
                step(args, report, save)
            report["timings_s"][key] = time.perf_counter() - start
            save()
    except (subprocess.CalledProcessError, RuntimeError) as e:  # the child's or the server's own output says why
        save()
        print(f"bench_gpu_serving: {e}; partial results in {out_path}", file=sys.stderr)
        return 1
    print_table(report)
    print(f"wrote {out_path}")
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
