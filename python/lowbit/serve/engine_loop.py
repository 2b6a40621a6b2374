"""EngineLoop: hands the step thread's progress to asyncio without ever blocking either side.

The LLM runs in step-thread mode: its driver owns the engine and steps it on a background thread. Each HTTP
request submits its prompts here with an UpdateChannel. One "pump" thread waits on the driver's condition
(notified after every engine step), collects what each watched request produced since last time (text safe to
stream, new token ids and logprobs, the finish) and posts the whole round to the event loop in one
call_soon_threadsafe: one wake-up of the loop per engine step, not one per request (at a thousand streams the
per-call wake-ups were a large share of the loop's time).
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from .._threads import name_native_thread
from ..driver import RequestState
from ..generation import GenerationConfig


@dataclass
class Update:
    """What one request produced since its previous update."""
    index: int                        # which choice of the HTTP request
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None  # set on the last update
    error: BaseException | None = None
    time: float = 0.0                 # perf_counter when the pump collected it


class UpdateChannel:
    """One HTTP request's updates, put by the pump's round on the event loop and taken all at once by the request's
    handler: a list and a future, lighter than an asyncio.Queue's put and get per update (both sides run on the
    event loop's thread, so nothing is locked)."""
    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Update] = []
        self._waiter: asyncio.Future | None = None

    def put(self, u: Update) -> None:
        self._items.append(u)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take_all(self) -> list[Update]:
        """Waits for at least one update; returns every update put so far, oldest first."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


class _Watch:
    def __init__(self, state: RequestState, index: int, channel: UpdateChannel) -> None:
        self.state, self.index, self.channel = state, index, channel
        self.tokens_seen = 0

    def has_news(self) -> bool:
        s = self.state
        return s.finished or s.error is not None or len(s.token_ids) > self.tokens_seen

    def collect(self) -> Update:  # under the driver's lock
        s = self.state
        start, end = self.tokens_seen, len(s.token_ids)
        self.tokens_seen = end
        return Update(index=self.index, text=s.take_stream_delta(), token_ids=s.token_ids[start:end],
                      logprobs=s.logprobs[start:end], top_logprobs=s.top_logprobs[start:end],
                      finish_reason=s.finish_reason if s.finished else None, error=s.error,
                      time=time.perf_counter())


def _deliver(updates: list[tuple[UpdateChannel, Update]]) -> None:
    """On the event loop: one pump round's updates into their requests' channels."""
    for channel, u in updates:
        channel.put(u)


class EngineLoop:
    def __init__(self, llm, loop: asyncio.AbstractEventLoop) -> None:
        if not llm._driver.threaded:
            raise ValueError("EngineLoop needs an LLM created with step_thread=True")
        self.llm = llm
        self._driver = llm._driver
        self._cond = self._driver.locked()
        self._loop = loop
        self._watched: dict[int, _Watch] = {}  # guarded by self._cond
        self._closing = False
        self._pump = threading.Thread(target=self._run, name="lowbit-serve-pump", daemon=True)
        self._pump.start()

    async def submit(self, text: str | None, ids: list[int], config: GenerationConfig, index: int,
                     channel: UpdateChannel) -> RequestState:
        """Adds a request to the engine; its updates arrive on `channel` (the last one has finish_reason set)."""
        # The step thread takes the request before its next step; the handler awaits that without holding a thread
        # (a thread per submission capped a burst's admissions at the executor's size per engine step).
        state, added = self._driver.submit_nowait(text, ids, config)
        try:
            await asyncio.shield(asyncio.wrap_future(added))
        except asyncio.CancelledError:  # the client left while the request was being added: abort it once added
            added.add_done_callback(lambda f: f.cancelled() or f.exception() or self._driver.abort(state))
            raise
        with self._cond:
            self._watched[state.request_id] = _Watch(state, index, channel)
            self._cond.notify_all()
        return state

    def abort(self, state: RequestState) -> None:
        """Ends a request (no-op once finished) and frees its KV blocks; never blocks."""
        with self._cond:
            self._watched.pop(state.request_id, None)
        self._driver.abort(state)

    async def stats(self) -> dict[str, int]:
        return await asyncio.to_thread(self.llm.stats)

    def _run(self) -> None:
        name_native_thread("lowbit-pump")
        while True:
            with self._cond:
                # Woken by every engine step; the timeout only bounds how late a close is noticed.
                self._cond.wait_for(lambda: self._closing or any(w.has_news() for w in self._watched.values()),
                                    timeout=1.0)
                if self._closing:
                    return
                updates = []
                for rid, w in list(self._watched.items()):
                    if w.has_news():
                        u = w.collect()
                        updates.append((w.channel, u))
                        if u.finish_reason is not None or u.error is not None:
                            del self._watched[rid]
            if not updates:
                continue
            try:
                self._loop.call_soon_threadsafe(_deliver, updates)
            except RuntimeError:  # the event loop is closed: the server is shutting down
                return

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._pump.join(timeout=5)
        self.llm.close()
