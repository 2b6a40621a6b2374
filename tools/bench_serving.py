"""Online serving benchmark for `lowbit serve` (or any OpenAI-compatible completions server).

Sends random token-id prompts through the streaming completions API at a Poisson request rate (or all at once)
and measures what a client sees: time to first token (TTFT), time per output token after the first (TPOT),
inter-token latencies (ITL) and end-to-end latency (E2E), plus request and token throughput.

    python tools/bench_serving.py --launch "--recipe w4a16" --input-len 256 --output-len 64 \\
        --num-requests 64 --sweep-rates 1,2,4,inf --out results.json --plot rates.png
    python tools/bench_serving.py --base-url http://127.0.0.1:8000/v1 --request-rate 4

Every request uses temperature 0 and ignore_eos, so each one generates exactly --output-len tokens.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import glob
import json
import math
import os
import platform
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import httpx

PERCENTILES = (50, 90, 99)


# ------------------------------------------------------------------ workload
def build_prompts(seed: int, num: int, input_len: int, shared_prefix_len: int,
                  min_id: int, max_id: int) -> list[list[int]]:
    """Random token-id prompts of input_len tokens; the first shared_prefix_len are the same in every prompt."""
    if not 0 <= shared_prefix_len <= input_len:
        raise ValueError("--shared-prefix-len must be between 0 and --input-len")
    rng = random.Random(seed)
    prefix = [rng.randrange(min_id, max_id) for _ in range(shared_prefix_len)]
    suffix_len = input_len - shared_prefix_len
    return [prefix + [rng.randrange(min_id, max_id) for _ in range(suffix_len)] for _ in range(num)]


def arrival_offsets(seed: int, num: int, rate: float) -> list[float]:
    """Send times in seconds from the start: a Poisson process at `rate` req/s, or all at 0 for rate inf."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.expovariate(rate)  # exponential gaps make the arrivals Poisson
    return out


# ------------------------------------------------------------------ one request
@dataclasses.dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0               # seconds from send to the first generated text
    e2e: float = 0.0                # seconds from send to the end of the stream
    itl: list[float] = dataclasses.field(default_factory=list)  # gaps between chunks after the first

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def _request_body(model: str, prompt: list[int], output_len: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def send_request(client: httpx.AsyncClient, model: str, prompt: list[int], output_len: int) -> RequestResult:
    """Streams one completion; records when each chunk with text arrives and the usage the server reports."""
    res = RequestResult(prompt_tokens=len(prompt))
    start = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", "completions", json=_request_body(model, prompt, output_len)) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    res.error = f"stream error: {event['error'].get('message', event['error'])}"
                    return res
                if event.get("usage"):
                    res.output_tokens = event["usage"]["completion_tokens"]
                if any(c.get("text") for c in event.get("choices", [])):
                    now = time.perf_counter()
                    if last is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.e2e = time.perf_counter() - start
        if last is None:
            res.error = "the stream carried no text"
        elif res.output_tokens == 0:
            res.error = "the stream carried no usage (stream_options.include_usage)"
        else:
            res.ok = True
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


# ------------------------------------------------------------------ one run
async def run_at_rate(base_url: str, api_key: str | None, model: str, prompts: list[list[int]], output_len: int,
                      rate: float, seed: int, max_concurrency: int | None, offsets: list[float] | None = None,
                      start_wall: float | None = None) -> tuple[list[RequestResult], float]:
    """Fires the prompts on the arrival schedule (`offsets` when given, else drawn from seed and rate), counted
    from now or from the wall-clock time `start_wall`; returns the results and the wall time of the whole run."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    if offsets is None:
        offsets = arrival_offsets(seed, len(prompts), rate)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # No pool limit of httpx's own: concurrency is the workload's to choose, not the client's.
    pool = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", headers=headers, timeout=None,
                                 limits=pool) as client:
        start = time.perf_counter()
        if start_wall is not None:
            start += start_wall - time.time()

        async def one(prompt: list[int], offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            async with limit:
                return await send_request(client, model, prompt, output_len)

        results = await asyncio.gather(*(one(p, o) for p, o in zip(prompts, offsets)))
        return list(results), time.perf_counter() - start


def _client_process(base_url: str, api_key: str | None, model: str, prompts: list[list[int]], offsets: list[float],
                    output_len: int, max_concurrency: int | None, start_wall: float) -> tuple[list[RequestResult], float]:
    """One client process's share of a run (run_workload)."""
    return asyncio.run(run_at_rate(base_url, api_key, model, prompts, output_len, math.inf, 0, max_concurrency,
                                   offsets, start_wall))


def run_workload(base_url: str, api_key: str | None, model: str, prompts: list[list[int]], output_len: int,
                 rate: float, seed: int, max_concurrency: int | None,
                 client_procs: int = 1) -> tuple[list[RequestResult], float]:
    """run_at_rate from this process, or spread over `client_procs` processes: at a thousand streams one Python
    client's SSE parsing can be the bound, not the server. The arrival schedule is the same either way (request i
    keeps its offset from a common start; process j sends requests j, j + N, ...); results come back in request
    order and the wall time is the last process's."""
    if client_procs <= 1:
        return asyncio.run(run_at_rate(base_url, api_key, model, prompts, output_len, rate, seed, max_concurrency))
    import concurrent.futures
    import multiprocessing
    offsets = arrival_offsets(seed, len(prompts), rate)
    share = None if max_concurrency is None else -(-max_concurrency // client_procs)
    start_wall = time.time() + 2.0  # every process is up and connected before the first send
    with concurrent.futures.ProcessPoolExecutor(client_procs, mp_context=multiprocessing.get_context("spawn")) as ex:
        jobs = [ex.submit(_client_process, base_url, api_key, model, prompts[j::client_procs],
                          offsets[j::client_procs], output_len, share, start_wall) for j in range(client_procs)]
        parts = [job.result() for job in jobs]
    results: list[RequestResult | None] = [None] * len(prompts)
    for j, (part, _) in enumerate(parts):
        results[j::client_procs] = part
    return results, max(elapsed for _, elapsed in parts)  # type: ignore[return-value]: every slot is filled


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), without needing numpy."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: list[float]) -> dict[str, float | None]:
    """mean, median and percentiles in milliseconds (None when there is nothing to describe)."""
    keys = ["mean_ms", "median_ms"] + [f"p{q}_ms" for q in PERCENTILES]
    if not values:
        return dict.fromkeys(keys)
    ms = [v * 1000 for v in values]
    stats = [sum(ms) / len(ms), percentile(ms, 50)] + [percentile(ms, q) for q in PERCENTILES]
    return dict(zip(keys, stats))


def summarize(results: list[RequestResult], duration: float, rate: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    return {
        "request_rate": "inf" if math.isinf(rate) else rate,
        "num_requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "error_messages": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft": describe([r.ttft for r in ok]),
        "tpot": describe([r.tpot for r in ok if r.tpot is not None]),
        "itl": describe([gap for r in ok for gap in r.itl]),
        "e2e": describe([r.e2e for r in ok]),
        "requests": [{**dataclasses.asdict(r), "tpot": r.tpot} for r in results],
    }


# ------------------------------------------------------------------ server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, root: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lowbit serve exited with status {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"lowbit serve was not healthy within {timeout:.0f} s")


SERVER_PIDS: dict[str, int] = {}  # base URL -> pid of a server launched_server started


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of each thread of process `pid`, {tid: (name, seconds)}; empty where
    /proc is not there (not Linux)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{task}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(task.rsplit("/", 1)[1])] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_between(pid: int, before: dict[int, tuple[str, float]]) -> list[dict[str, Any]]:
    """Per-thread CPU seconds of `pid` since `before` (thread_cpu_seconds), busiest first; the main thread (the
    server's event loop) is the one whose tid is the pid."""
    after = thread_cpu_seconds(pid)
    rows = [{"tid": tid, "name": name, "main": tid == pid, "cpu_s": round(s - before.get(tid, (name, 0.0))[1], 3)}
            for tid, (name, s) in after.items()]
    return sorted(rows, key=lambda r: -r["cpu_s"])


@contextlib.contextmanager
def launched_server(launch_args: str, timeout: float) -> Iterator[str]:
    """Starts `python -m lowbit serve <launch_args>` on a free port (unless the args name one), waits for
    /health, yields the /v1 base URL, and always stops the server's whole process group."""
    args = shlex.split(launch_args)
    if "--port" not in args:
        args += ["--port", str(_free_port())]
    port = args[args.index("--port") + 1]
    cmd = [sys.executable, "-m", "lowbit", "serve", *args]
    print(f"launching: {shlex.join(cmd)}", file=sys.stderr)
    # Its own session, so stopping it reaches anything it started too.
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        root = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, root, timeout)
        SERVER_PIDS[root + "/v1"] = proc.pid
        yield root + "/v1"
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def served_model(base_url: str, api_key: str | None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=30)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


# ------------------------------------------------------------------ report
def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine(),
                            "processor": platform.processor(), "cpu_count": os.cpu_count(),
                            "python": platform.python_version()}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
        if gpus.returncode == 0:
            info["gpus"] = [g.strip() for g in gpus.stdout.splitlines() if g.strip()]
    return info


def git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def print_table(runs: list[dict[str, Any]]) -> None:
    head = (f"{'rate':>6} {'ok/n':>7} {'dur s':>7} {'req/s':>7} {'out tok/s':>9} {'tot tok/s':>9} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} {'ITL p50':>8} {'E2E p50':>8}")
    print(head + "   (latencies in ms)")
    for r in runs:
        def ms(metric: str, key: str) -> str:
            v = r[metric][key]
            return "-" if v is None else f"{v:.1f}"
        print(f"{str(r['request_rate']):>6} {r['completed']:>3}/{r['num_requests']:<3} {r['duration_s']:>7.2f} "
              f"{r['request_throughput']:>7.2f} {r['output_throughput']:>9.1f} {r['total_token_throughput']:>9.1f} "
              f"{ms('ttft', 'p50_ms'):>9} {ms('ttft', 'p99_ms'):>9} {ms('tpot', 'p50_ms'):>9} "
              f"{ms('tpot', 'p99_ms'):>9} {ms('itl', 'p50_ms'):>8} {ms('e2e', 'p50_ms'):>8}")
        for msg in r["error_messages"]:
            print(f"       error: {msg}")


def plot(runs: list[dict[str, Any]], path: str) -> bool:
    """TTFT and TPOT (P50, P99) against request rate; inf is drawn to the right of the largest finite rate."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install matplotlib); the JSON was still written", file=sys.stderr)
        return False
    finite = [r["request_rate"] for r in runs if r["request_rate"] != "inf"]
    inf_x = max(finite) * 2 if finite else 1.0
    xs = [inf_x if r["request_rate"] == "inf" else r["request_rate"] for r in runs]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("ttft", "tpot")):
        for key in ("p50_ms", "p99_ms"):
            ax.plot(xs, [r[metric][key] for r in runs], marker="o", label=key.split("_")[0].upper())
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_xticks(xs, [str(r["request_rate"]) for r in runs])
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------ main
def parse_rate(text: str) -> float:
    rate = float(text)
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"a request rate must be > 0 or inf, not {text!r}")
    return rate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="a running server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    where.add_argument("--launch", metavar="ARGS", help='start `lowbit serve ARGS` for the run ("" for defaults)')
    p.add_argument("--api-key", help="Bearer key of a server started with --api-key")
    p.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=64, help="generated tokens per request")
    p.add_argument("--shared-prefix-len", type=int, default=0, help="leading prompt tokens every request shares")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--request-rate", type=parse_rate, default=float("inf"), help="req/s (Poisson) or inf")
    p.add_argument("--sweep-rates", help="comma-separated rates to run one after another, e.g. 1,2,4,inf")
    p.add_argument("--max-concurrency", type=int, help="requests in flight at most (default: no limit)")
    p.add_argument("--client-procs", type=int, default=1,
                   help="client processes the requests are spread over (a thousand streams can bound one)")
    p.add_argument("--num-warmup", type=int, default=1, help="requests sent (one at a time) before measuring")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts and the arrival times")
    p.add_argument("--min-token-id", type=int, default=100, help="random prompt ids are drawn from")
    p.add_argument("--max-token-id", type=int, default=10000, help="[min, max): inside any vocabulary, past "
                   "most special tokens")
    p.add_argument("--launch-timeout", type=float, default=300, help="seconds to wait for a launched server")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--plot", help="with --sweep-rates: draw TTFT/TPOT against rate into this image")
    p.add_argument("--commit", help="commit to record (default: git rev-parse of this checkout)")
    args = p.parse_args(argv)
    args.rates = [parse_rate(r) for r in args.sweep_rates.split(",")] if args.sweep_rates else [args.request_rate]
    if args.output_len < 1 or args.input_len < 1 or args.num_requests < 1:
        p.error("--input-len, --output-len and --num-requests must be >= 1")
    if args.client_procs < 1:
        p.error("--client-procs must be >= 1")
    return args


def benchmark(args: argparse.Namespace, base_url: str) -> list[dict[str, Any]]:
    model = args.model or served_model(base_url, args.api_key)
    prompts = build_prompts(args.seed, args.num_requests, args.input_len, args.shared_prefix_len,
                            args.min_token_id, args.max_token_id)
    if args.num_warmup:  # the first requests pay one-time costs (allocation, caches) a steady server does not
        warm = build_prompts(args.seed + 1, args.num_warmup, args.input_len, 0, args.min_token_id, args.max_token_id)
        for p in warm:
            asyncio.run(run_at_rate(base_url, args.api_key, model, [p], args.output_len, math.inf, 0, None))
    runs = []
    for rate in args.rates:
        results, duration = run_workload(base_url, args.api_key, model, prompts, args.output_len, rate, args.seed,
                                         args.max_concurrency, args.client_procs)
        runs.append(summarize(results, duration, rate))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # A SIGTERM to the tool unwinds like Ctrl-C, so a launched server is stopped rather than left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.launch is not None:
        with launched_server(args.launch, args.launch_timeout) as base_url:
            runs = benchmark(args, base_url)
    else:
        runs = benchmark(args, args.base_url)
    print_table(runs)
    arguments = {k: v for k, v in vars(args).items() if k not in ("rates", "api_key")}
    arguments["request_rate"] = str(arguments["request_rate"])
    report = {"benchmark": "serving", "date": date, "commit": args.commit or git_commit(), "host": host_info(),
              "arguments": arguments, "runs": runs}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")
    if args.plot:
        if plot(runs, args.plot):
            print(f"wrote {args.plot}")
    return 0 if all(r["errors"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
