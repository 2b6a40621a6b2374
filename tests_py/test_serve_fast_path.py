"""The server's per-token path, piece by piece (the HTTP behaviour is test_serve.py's): the lock-free token
histogram and counter expose what prometheus_client's own Histogram and Counter would for the same samples, and a
request's update channel hands over every update once, in order, waking a waiting handler."""
import asyncio
import random

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest  # noqa: E402

from lowbit.serve.engine_loop import Update, UpdateChannel  # noqa: E402
from lowbit.serve.metrics import _LATENCY_BUCKETS, TokenCounter, TokenHistogram  # noqa: E402


def _samples(text: bytes, name: str) -> dict[str, float]:
    """name's sample lines (bucket, count, sum, total) of an exposition, as {line's left side: value}."""
    out = {}
    for line in text.decode().splitlines():
        if line.startswith(name) and not line.startswith(name + "_created"):
            left, value = line.rsplit(" ", 1)
            out[left] = float(value)
    return out


def test_token_histogram_and_counter_expose_what_prometheus_client_would():
    rng = random.Random(5)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hist = TokenHistogram("lowbit_x_seconds", "x", _LATENCY_BUCKETS)
    count = TokenCounter("lowbit_y", "y")
    ours.register(hist)
    ours.register(count)
    ref_hist = Histogram("lowbit_x_seconds", "x", buckets=_LATENCY_BUCKETS, registry=theirs)
    ref_count = Counter("lowbit_y", "y", registry=theirs)
    # values on and between the bounds, 0, past the last bound; several samples at once
    values = [0.0, 0.005, 0.01, 30.0, 31.0, 1e-9] + [rng.choice([rng.uniform(0, 40), rng.choice(_LATENCY_BUCKETS)])
                                                      for _ in range(300)]
    for v in values:
        k = rng.randint(1, 4)
        hist.observe(v, k)
        count.inc(k)
        for _ in range(k):
            ref_hist.observe(v)
            ref_count.inc()
    a, b = generate_latest(ours), generate_latest(theirs)
    got, want = _samples(a, "lowbit_x_seconds"), _samples(b, "lowbit_x_seconds")
    assert got.keys() == want.keys() and len(got) == len(_LATENCY_BUCKETS) + 3  # buckets with +Inf, count, sum
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    assert _samples(a, "lowbit_y_total") == _samples(b, "lowbit_y_total")


def test_update_channel_hands_over_every_update_in_order():
    async def main():
        channel = UpdateChannel()
        waiter = asyncio.ensure_future(channel.take_all())
        await asyncio.sleep(0)
        assert not waiter.done()  # nothing yet: the handler waits
        channel.put(Update(index=0, text="a"))
        channel.put(Update(index=1, text="b"))
        first = await asyncio.wait_for(waiter, 5)
        assert [u.text for u in first] == ["a", "b"]
        for t in "cde":
            channel.put(Update(index=0, text=t))
        assert [u.text for u in await channel.take_all()] == ["c", "d", "e"]  # no wait when some are there
        cancelled = asyncio.ensure_future(channel.take_all())
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        channel.put(Update(index=2, text="f"))  # a cancelled wait leaves nothing behind
        assert [u.text for u in await channel.take_all()] == ["f"]

    asyncio.run(main())
