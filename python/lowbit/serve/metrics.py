"""Prometheus metrics of one server: its own registry, so that several apps in one process never collide."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # Engine state, read from Engine.stats() at each scrape.
        self.running = Gauge("lowbit_requests_running", "Requests the engine is running", registry=r)
        self.waiting = Gauge("lowbit_requests_waiting", "Requests waiting in the engine's queue", registry=r)
        self.kv_used = Gauge("lowbit_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_free = Gauge("lowbit_kv_blocks_free", "KV cache blocks free", registry=r)
        # The HTTP side.
        self.in_flight = Gauge("lowbit_http_requests_in_flight", "Generation requests the server holds", registry=r)
        self.requests = Counter("lowbit_http_requests", "Finished generation requests", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter("lowbit_prompt_tokens", "Prompt tokens received", registry=r)
        self.generation_tokens = Counter("lowbit_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("lowbit_time_to_first_token_seconds", "Request arrival to its first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("lowbit_inter_token_latency_seconds", "Time between consecutive tokens of a request",
                             buckets=_LATENCY_BUCKETS, registry=r)

    def render(self, stats: dict[str, int]) -> bytes:
        self.running.set(stats["running"])
        self.waiting.set(stats["waiting"])
        self.kv_free.set(stats["num_free_blocks"])
        self.kv_used.set(stats["num_blocks"] - stats["num_free_blocks"])
        return generate_latest(self.registry)
