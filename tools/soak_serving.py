"""Soak test for `lowbit serve`: many concurrent streaming clients for a long time, checking every answer.

Launches `python -m lowbit serve` (or targets --base-url), then runs --clients concurrent clients (official `openai`
client, streaming completions) for --duration seconds. Each client loops over requests of mixed prompt and output
lengths, of three kinds:

  greedy      temperature 0, one of a fixed set of prompts whose reference output was taken from the same server
              one request at a time before the load; the streamed text must equal it (else: garbled)
  sampled     temperature 0.9 / top_p 0.95, random seed; must stream exactly max_tokens tokens (ignore_eos)
  disconnect  a long request the client abandons after a few chunks (the server must abort it and free its KV)

The launched server's RSS is sampled all along. The first --warmup seconds of load are not part of the RSS
baseline (the engine's buffers for large batches and the KV pages are first touched then). At the end the tool
waits for the server to go idle and compares /metrics with the idle values taken before the load.

    python tools/soak_serving.py --clients 100 --duration 600 --out soak.json
    python tools/soak_serving.py --launch "--max-seqs 32 --kv-cache-memory 40000000" --clients 16 --duration 60

Exit status 1 on any error, garbled stream or a server that does not return to idle (and, with
--max-rss-growth, on more RSS growth than that).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import random
import shlex
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serving import _free_port, _stop, _wait_healthy, describe, git_commit, host_info  # noqa: E402

KINDS = ("greedy", "sampled", "disconnect")
# Plain words, so prompts are ordinary text of a predictable length (about one token per word).
WORDS = ("the a of and to in is was for on with as by at from that this it he she they we you one two three "
         "time year day way man world life hand part child eye woman place work week case point government "
         "company number group problem fact river mountain city house garden clock bridge train letter story "
         "music paper window table night morning water light stone field road market school doctor teacher "
         "small large old new early late long short high low good great little own other right big young "
         "said made went took came saw knew gave found told asked seemed felt left called kept began showed "
         "red blue green white black quiet bright warm cold heavy soft open slow quick careful simple").split()


# ------------------------------------------------------------------ workload
def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


@dataclasses.dataclass
class GreedyCase:
    prompt: str
    max_tokens: int
    reference: str = ""
    reference_tokens: int = 0


def greedy_cases(seed: int, count: int, max_prompt_words: int, max_output: int) -> list[GreedyCase]:
    """Mixed lengths; every other prompt starts with one shared preamble, so prefix caching is exercised too."""
    rng = random.Random(seed)
    preamble = random_text(rng, max_prompt_words // 2)
    cases = []
    for i in range(count):
        body = random_text(rng, rng.randint(4, max_prompt_words // 2))
        prompt = f"{preamble} {body}" if i % 2 else body
        cases.append(GreedyCase(prompt, rng.randint(4, max_output)))
    return cases


# ------------------------------------------------------------------ one request
@dataclasses.dataclass
class Outcome:
    kind: str
    status: str                 # ok | error | garbled | disconnected
    tokens: int = 0             # generated tokens received (usage, or chunks for a disconnect)
    ttft: float | None = None
    detail: str = ""


async def stream_completion(client, model: str, prompt: str, max_tokens: int, stop_after_chunks: int | None = None,
                            **sampling) -> tuple[str, int, float | None, bool]:
    """Streams one completion; returns (text, completion tokens from usage, ttft, finished). With
    stop_after_chunks the client closes the connection after that many text chunks (finished is then False)."""
    start = time.perf_counter()
    ttft, parts, usage_tokens, chunks = None, [], 0, 0
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                             stream_options={"include_usage": True}, **sampling)
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                if c.text:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    parts.append(c.text)
                    chunks += 1
            if stop_after_chunks is not None and chunks >= stop_after_chunks:
                return "".join(parts), chunks, ttft, False
    finally:
        await stream.close()  # for a disconnect: drops the connection mid-stream
    return "".join(parts), usage_tokens, ttft, True


async def run_one(client, model: str, kind: str, rng: random.Random, cases: list[GreedyCase],
                  max_prompt_words: int, max_output: int) -> Outcome:
    try:
        if kind == "greedy":
            case = rng.choice(cases)
            text, n, ttft, _ = await stream_completion(client, model, case.prompt, case.max_tokens, temperature=0.0,
                                                       extra_body={"ignore_eos": True})
            if text != case.reference or n != case.reference_tokens:
                return Outcome(kind, "garbled", n, ttft, f"prompt {cases.index(case)}: got {text[:80]!r} "
                               f"({n} tokens), expected {case.reference[:80]!r} ({case.reference_tokens} tokens)")
            return Outcome(kind, "ok", n, ttft)
        prompt = random_text(rng, rng.randint(4, max_prompt_words))
        if kind == "sampled":
            max_tokens = rng.randint(4, max_output)
            text, n, ttft, _ = await stream_completion(client, model, prompt, max_tokens, temperature=0.9, top_p=0.95,
                                                       seed=rng.randrange(2**31), extra_body={"ignore_eos": True})
            if n != max_tokens or not text:
                return Outcome(kind, "error", n, ttft, f"sampled: {n} tokens of {max_tokens}, text {text[:40]!r}")
            return Outcome(kind, "ok", n, ttft)
        _, chunks, ttft, finished = await stream_completion(client, model, prompt, 4 * max_output,
                                                            stop_after_chunks=rng.randint(1, 8), temperature=0.7,
                                                            extra_body={"ignore_eos": True})
        if finished:
            return Outcome(kind, "error", chunks, ttft, "the stream ended before the client meant to leave")
        return Outcome(kind, "disconnected", chunks, ttft)
    except Exception as e:  # noqa: BLE001 - every failure is a result to report, not a crash of the soak
        return Outcome(kind, "error", detail=f"{type(e).__name__}: {e}"[:300])


def pick_kind(rng: random.Random, greedy_frac: float, disconnect_frac: float) -> str:
    x = rng.random()
    return "greedy" if x < greedy_frac else "disconnect" if x < greedy_frac + disconnect_frac else "sampled"


async def references(client, model: str, cases: list[GreedyCase]) -> None:
    """Each greedy case run alone (nothing else in flight): the outputs the loaded server must reproduce."""
    for case in cases:
        case.reference, case.reference_tokens, _, _ = await stream_completion(
            client, model, case.prompt, case.max_tokens, temperature=0.0, extra_body={"ignore_eos": True})


async def load(client, model: str, args, cases: list[GreedyCase], deadline: float) -> list[tuple[float, Outcome]]:
    """--clients loops, each sending one request after another until the deadline; (finish time, outcome)."""
    results: list[tuple[float, Outcome]] = []

    async def client_loop(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        await asyncio.sleep(rng.random() * min(2.0, args.duration / 10))  # stagger the start a little
        while time.monotonic() < deadline:
            kind = pick_kind(rng, args.greedy_frac, args.disconnect_frac)
            out = await run_one(client, model, kind, rng, cases, args.max_prompt_words, args.max_output)
            results.append((time.monotonic(), out))

    await asyncio.gather(*(client_loop(i) for i in range(args.clients)))
    return results


# ------------------------------------------------------------------ the server's side
def rss_bytes(pid: int) -> int:
    try:
        import psutil
        return psutil.Process(pid).memory_info().rss
    except ImportError:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RSS for process {pid}")


class RssSampler(threading.Thread):
    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid, self.interval, self.t0 = pid, interval, time.monotonic()
        self.samples: list[tuple[float, int]] = []  # (monotonic time, bytes)
        self._stop_event = threading.Event()

    def sample(self) -> int:
        rss = rss_bytes(self.pid)
        self.samples.append((time.monotonic(), rss))
        return rss

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            with contextlib.suppress(Exception):  # the server may be gone at the very end
                self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def metrics(root: str, names: tuple[str, ...]) -> dict[str, float]:
    text = httpx.get(f"{root}/metrics", timeout=30).text
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in names:
            values[key] = float(value)
    return values


COUNTER_SERIES = ("lowbit_preemptions_total", "lowbit_prefix_cache_hit_rate", "lowbit_prefix_cache_evictions_total",
                  "lowbit_generation_tokens_total", 'lowbit_http_requests_total{endpoint="completions",status="ok"}',
                  'lowbit_http_requests_total{endpoint="completions",status="disconnected"}',
                  'lowbit_http_requests_total{endpoint="completions",status="error"}')
IDLE_SERIES = ("lowbit_kv_blocks_used", "lowbit_kv_blocks_free", "lowbit_requests_running",
               "lowbit_requests_waiting", "lowbit_http_requests_in_flight")


def wait_idle(root: str, idle: dict[str, float], timeout: float) -> tuple[dict[str, float], float]:
    """Polls /metrics until the engine holds what it held before the load; returns the last values and the wait."""
    start = time.monotonic()
    while True:
        now = metrics(root, IDLE_SERIES + ("lowbit_prefix_cache_blocks",))
        if all(now.get(k) == idle.get(k) for k in IDLE_SERIES) or time.monotonic() - start > timeout:
            return now, time.monotonic() - start
        time.sleep(0.5)


@contextlib.contextmanager
def launched(launch_args: str, timeout: float):
    """`python -m lowbit serve ARGS` on a free port; yields (root URL, pid) and always stops it."""
    args = shlex.split(launch_args)
    if "--port" not in args:
        args += ["--port", str(_free_port())]
    root = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
    cmd = [sys.executable, "-m", "lowbit", "serve", *args]
    print(f"launching: {shlex.join(cmd)}", file=sys.stderr)
    proc = subprocess.Popen(cmd, start_new_session=True)  # the pid is the server itself: its RSS is sampled
    try:
        _wait_healthy(proc, root, timeout)
        yield root, proc.pid
    finally:
        _stop(proc)


# ------------------------------------------------------------------ report
def summarize(results: list[tuple[float, Outcome]], load_start: float, load_end: float,
              warmup_end: float) -> dict[str, Any]:
    outcomes = [o for _, o in results]
    by = {s: sum(o.status == s for o in outcomes) for s in ("ok", "error", "garbled", "disconnected")}
    tokens = sum(o.tokens for o in outcomes)
    duration = load_end - load_start
    steady = [o for t, o in results if t >= warmup_end]
    return {
        "requests": len(outcomes), **by,
        "by_kind": {k: {s: sum(o.kind == k and o.status == s for o in outcomes)
                        for s in ("ok", "error", "garbled", "disconnected")} for k in KINDS},
        "tokens": tokens,
        "duration_s": duration,
        "output_throughput_tok_s": tokens / duration,
        "request_throughput": len(outcomes) / duration,
        "steady_output_throughput_tok_s": sum(o.tokens for o in steady) / max(load_end - warmup_end, 1e-9),
        "ttft": describe([o.ttft for o in outcomes if o.ttft is not None and o.status == "ok"]),
        "first_problems": [dataclasses.asdict(o) for o in outcomes if o.status in ("error", "garbled")][:10],
    }


def rss_report(sampler: RssSampler, before_load: int, baseline_t: float) -> dict[str, Any]:
    after = [(t, r) for t, r in sampler.samples if t >= baseline_t]
    mb = 1 / 2**20
    start, end = after[0][1], after[-1][1]
    return {"before_load_mb": before_load * mb, "start_mb": start * mb, "end_mb": end * mb,
            "max_mb": max(r for _, r in after) * mb, "growth_pct": 100 * (end - start) / start,
            "samples": [[round(t - sampler.t0, 1), round(r * mb, 2)] for t, r in sampler.samples]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--launch", metavar="ARGS", default="",
                       help='start `lowbit serve ARGS` (default: "", the defaults: SmolLM2 on the CPU)')
    where.add_argument("--base-url", help="a running server's root URL, e.g. http://127.0.0.1:8000 (no RSS then "
                       "unless --server-pid)")
    p.add_argument("--server-pid", type=int, help="with --base-url: the server's pid, to sample its RSS")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--clients", type=int, default=100, help="concurrent streaming clients")
    p.add_argument("--duration", type=float, default=600, help="seconds of load (requests in flight then finish)")
    p.add_argument("--warmup", type=float, help="seconds of load before the RSS baseline (default: 10%% of "
                   "--duration, at most 60)")
    p.add_argument("--greedy-frac", type=float, default=0.5, help="share of requests checked against references")
    p.add_argument("--disconnect-frac", type=float, default=0.15, help="share of requests abandoned mid-stream")
    p.add_argument("--greedy-prompts", type=int, default=24, help="distinct greedy prompts (each run alone first)")
    p.add_argument("--max-prompt-words", type=int, default=300, help="prompts have 4 .. this many words")
    p.add_argument("--max-output", type=int, default=128, help="greedy/sampled requests generate 4 .. this many")
    p.add_argument("--rss-interval", type=float, default=2.0, help="seconds between RSS samples")
    p.add_argument("--idle-timeout", type=float, default=60, help="seconds the server may take to go idle at the end")
    p.add_argument("--max-rss-growth", type=float, help="also fail when RSS grows more than this many percent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--launch-timeout", type=float, default=300)
    p.add_argument("--out", help="write the report as JSON here")
    p.add_argument("--commit", help="commit to record (default: git rev-parse of this checkout)")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = min(60.0, args.duration / 10)
    if not (0 <= args.greedy_frac and 0 <= args.disconnect_frac and args.greedy_frac + args.disconnect_frac <= 1):
        p.error("--greedy-frac and --disconnect-frac must be >= 0 and add up to at most 1")
    if args.clients < 1 or args.duration <= 0 or args.warmup >= args.duration:
        p.error("need --clients >= 1 and 0 <= --warmup < --duration")
    return args


async def soak(args, root: str, pid: int | None) -> dict[str, Any]:
    import openai  # the official client, as users drive the server
    model = httpx.get(f"{root}/v1/models", headers={"Authorization": f"Bearer {args.api_key}"},
                      timeout=30).json()["data"][0]["id"]
    # Connections for every client at once; a request may wait minutes behind the others, never time out.
    http_client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                                    timeout=httpx.Timeout(None, connect=30))
    client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=args.api_key, max_retries=0, http_client=http_client)
    cases = greedy_cases(args.seed, args.greedy_prompts, args.max_prompt_words, args.max_output)
    t = time.monotonic()
    await references(client, model, cases)
    print(f"{len(cases)} greedy references in {time.monotonic() - t:.1f} s", file=sys.stderr)
    idle = metrics(root, IDLE_SERIES)
    sampler = RssSampler(pid, args.rss_interval) if pid else None
    before_load = sampler.sample() if sampler else 0
    if sampler:
        sampler.start()
    load_start = time.monotonic()
    results = await load(client, model, args, cases, load_start + args.duration)
    load_end = time.monotonic()
    await client.close()
    end, idle_wait = wait_idle(root, idle, args.idle_timeout)
    if sampler:
        sampler.sample()
        sampler.stop()
    report = summarize(results, load_start, load_end, load_start + args.warmup)
    report["idle_before"] = idle
    report["idle_after"] = end
    report["idle_wait_s"] = idle_wait
    report["returned_to_idle"] = all(end.get(k) == idle.get(k) for k in IDLE_SERIES)
    report["server_counters"] = metrics(root, COUNTER_SERIES)  # the server's own view of the run (since start)
    report["rss"] = rss_report(sampler, before_load, load_start + args.warmup) if sampler else None
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if args.base_url:
        report = asyncio.run(soak(args, args.base_url.rstrip("/"), args.server_pid))
    else:
        with launched(args.launch, args.launch_timeout) as (root, pid):
            report = asyncio.run(soak(args, root, pid))
    rss = report["rss"]
    failed = report["error"] or report["garbled"] or not report["returned_to_idle"] or (
        args.max_rss_growth is not None and rss is not None and rss["growth_pct"] > args.max_rss_growth)
    arguments = {k: v for k, v in vars(args).items() if k != "api_key"}
    out = {"benchmark": "soak_serving", "date": date, "commit": args.commit or git_commit(), "host": host_info(),
           "arguments": arguments, "passed": not failed, **report}
    brief = {k: out[k] for k in ("requests", "ok", "error", "garbled", "disconnected", "tokens",
                                 "output_throughput_tok_s", "returned_to_idle")}
    if rss:
        brief.update({f"rss_{k}": round(rss[k], 2) for k in ("start_mb", "end_mb", "max_mb", "growth_pct")})
    print(json.dumps(brief, indent=1))
    for problem in report["first_problems"]:
        print(f"{problem['kind']} {problem['status']}: {problem['detail']}", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
