"""Prometheus metrics of one server: its own registry, so that several apps in one process never collide."""
from __future__ import annotations

import bisect

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class TokenHistogram(Collector):
    """A histogram for per-token figures, fed from the event loop's thread only (no lock): observe(value, count)
    adds `count` equal samples in one step, where prometheus_client's Histogram takes a locked call per sample (at a
    thousand streams, one call per token was a visible share of the server's time)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.bounds = name, documentation, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    def collect(self):
        cumulative, buckets = 0, []
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)


class TokenCounter(Collector):
    """A counter fed from the event loop's thread only (no lock), for per-update increments."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation, self.value = name, documentation, 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def collect(self):
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)


class _EngineCountersCollector(Collector):
    """The engine's own counters (prefix cache, preemptions) as real prometheus counters: the engine counts, this
    only reports the values of the last Engine.stats() read (nothing before the first scrape)."""

    def __init__(self) -> None:
        self.stats: dict | None = None

    def collect(self):
        s = self.stats
        if s is None:
            return
        yield GaugeMetricFamily("lowbit_prefix_caching_enabled", "1 when automatic prefix caching is on",
                                value=1 if s["prefix_caching"] else 0)
        yield CounterMetricFamily("lowbit_prefix_cache_queries_tokens",
                                  "Prompt tokens of admitted requests that looked up the prefix cache",
                                  value=s["prefix_cache_query_tokens"])
        yield CounterMetricFamily("lowbit_prefix_cache_hits_tokens",
                                  "Prompt tokens whose KV came from the prefix cache", value=s["prefix_cache_hit_tokens"])
        yield GaugeMetricFamily("lowbit_prefix_cache_hit_rate", "Prefix cache hits / queries in tokens, since start",
                                value=s["prefix_cache_hit_rate"])
        yield GaugeMetricFamily("lowbit_prefix_cache_blocks", "KV blocks holding cached prefixes (in use or free)",
                                value=s["prefix_cache_blocks"])
        yield CounterMetricFamily("lowbit_prefix_cache_evictions", "Cached KV blocks evicted to hold other tokens",
                                  value=s["prefix_cache_evictions"])
        yield CounterMetricFamily("lowbit_decode_graph_steps", "Decode steps replayed as CUDA graphs (GPU)",
                                  value=s["decode_graph_steps"])
        yield CounterMetricFamily("lowbit_decode_graph_device_seconds", "GPU time of those steps, uploads included "
                                  "(their wall time minus this is GPU time lost waiting on the host)",
                                  value=(s["decode_graph_ms"] + s["decode_upload_ms"]) / 1000)
        yield CounterMetricFamily("lowbit_decode_graph_wall_seconds", "Wall time of the engine's steps that replayed "
                                  "those graphs (serial steps: minus the device seconds, the GPU's wait on the host; "
                                  "overlapped steps return before the GPU is done, so it may be below them)",
                                  value=s["decode_step_wall_ms"] / 1000)
        yield CounterMetricFamily("lowbit_overlapped_steps", "Decode steps queued on the GPU behind the running one "
                                  "(overlap_steps)", value=s["overlapped_steps"])
        yield CounterMetricFamily("lowbit_dropped_rows", "Rows of queued decode steps whose request had stopped or "
                                  "was aborted meanwhile (computed, not used)", value=s["dropped_rows"])
        yield CounterMetricFamily("lowbit_preemptions", "Running requests preempted (KV freed, recomputed later) "
                                  "because the KV pool ran out", value=s["preemptions"])


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # Engine state, read from Engine.stats() at each scrape.
        self.running = Gauge("lowbit_requests_running", "Requests the engine is running", registry=r)
        self.waiting = Gauge("lowbit_requests_waiting", "Requests waiting in the engine's queue", registry=r)
        self.kv_used = Gauge("lowbit_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_free = Gauge("lowbit_kv_blocks_free", "KV cache blocks free (cached blocks no request holds count)",
                             registry=r)
        self.engine_counters = _EngineCountersCollector()
        r.register(self.engine_counters)
        # The HTTP side.
        self.in_flight = Gauge("lowbit_http_requests_in_flight", "Generation requests the server holds", registry=r)
        self.requests = Counter("lowbit_http_requests", "Finished generation requests", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter("lowbit_prompt_tokens", "Prompt tokens received", registry=r)
        # Per-token figures, fed by the request handlers on the event loop.
        self.generation_tokens = TokenCounter("lowbit_generation_tokens", "Tokens generated")
        self.ttft = TokenHistogram("lowbit_time_to_first_token_seconds", "Request arrival to its first token",
                                   _LATENCY_BUCKETS)
        self.itl = TokenHistogram("lowbit_inter_token_latency_seconds", "Time between consecutive tokens of a request",
                                  _LATENCY_BUCKETS)
        for c in (self.generation_tokens, self.ttft, self.itl):
            r.register(c)

    def render(self, stats: dict) -> bytes:
        self.running.set(stats["running"])
        self.waiting.set(stats["waiting"])
        self.kv_free.set(stats["num_free_blocks"])
        self.kv_used.set(stats["num_blocks"] - stats["num_free_blocks"])
        self.engine_counters.stats = stats
        return generate_latest(self.registry)
