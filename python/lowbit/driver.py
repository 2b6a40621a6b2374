"""Runs the C++ engine's step loop for every live request: detokenizes, finds stop strings, keeps timings.

Each request owns a RequestState. Two ways to drive the engine:
- inline (default): whoever waits for a request (a generate() call, a stream, a session turn) steps the engine
  and routes every event to its state, so interleaved callers never lose one another's tokens;
- step thread: one background thread owns the engine and steps it while requests are live; callers from any
  Python thread submit work to it and wait for their states. Engine.step releases the GIL, so callers run
  Python (detokenize, print a stream) while the next step computes.
The C++ Engine is not thread-safe: in both modes exactly one thread at a time calls into it.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from ._threads import name_native_thread
from .generation import GenerationConfig
from .outputs import RequestOutput, Timings


class RequestState:
    def __init__(self, request_id: int, prompt: str | None, prompt_ids: list[int], config: GenerationConfig,
                 tokenizer, stop_token_ids: set[int]) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.config = config
        self._decoder = tokenizer.decode_stream(skip_special_tokens=True)
        self._stop_token_ids = stop_token_ids
        self._max_stop_len = max((len(s) for s in config.stop), default=0)
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.finished = False
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.t_submit = time.perf_counter()
        self.t_first: float | None = None
        self.t_done: float | None = None
        self.streamed = 0  # characters already handed to a streaming caller
        self.error: BaseException | None = None  # a failed step (step-thread mode) ends the request with it

    def on_event(self, ev) -> bool:
        """Applies one engine event; True when a stop string ended the request (the caller aborts it)."""
        if ev.token >= 0 and ev.finish_reason != "abort":
            now = time.perf_counter()
            self.t_first = self.t_first or now
            self.token_ids.append(int(ev.token))
            self.logprobs.append(float(ev.logprob))
            if self.config.logprobs:
                self.top_logprobs.append([(int(t), float(p)) for t, p in ev.top_logprobs])
            ends_on_stop_token = ev.finished and ev.finish_reason == "stop" and ev.token in self._stop_token_ids
            if ends_on_stop_token:
                self.stop_reason = int(ev.token)
            else:
                if self._append_text(self._decoder.step(ev.token)):
                    return True
        if ev.finished:
            if self._append_text(self._decoder.flush()):
                return True
            self._finish(ev.finish_reason or "stop")
        return False

    def _append_text(self, delta: str) -> bool:
        if not delta:
            return False
        start = max(0, len(self.text) - self._max_stop_len + 1)
        self.text += delta
        if not self.config.stop or len(self.token_ids) < self.config.min_tokens:
            return False
        hits = [(i, s) for s in self.config.stop if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self.text = self.text[:index]
        self.stop_reason = stop
        self._finish("stop")
        return True

    def _finish(self, reason: str) -> None:
        self.finished = True
        self.finish_reason = reason
        self.t_done = time.perf_counter()

    def safe_text_end(self) -> int:
        """How much of the text can be streamed: all of it once finished, else without a possible stop-string start."""
        if self.finished or not self.config.stop:
            return len(self.text)
        held = 0
        for s in self.config.stop:
            for k in range(min(len(s) - 1, len(self.text)), held, -1):
                if self.text.endswith(s[:k]):
                    held = k
                    break
        return len(self.text) - held

    def take_stream_delta(self) -> str:
        end = self.safe_text_end()
        delta = self.text[self.streamed:end]
        self.streamed = max(self.streamed, end)
        return delta

    def output(self) -> RequestOutput:
        t_first = self.t_first or self.t_done or self.t_submit
        t_done = self.t_done or time.perf_counter()
        after_first = len(self.token_ids) - 1
        rate = after_first / (t_done - t_first) if after_first > 0 and t_done > t_first else 0.0
        return RequestOutput(prompt=self.prompt, text=self.text, token_ids=list(self.token_ids),
                             finish_reason=self.finish_reason or "abort", prompt_token_count=len(self.prompt_ids),
                             logprobs=list(self.logprobs), top_logprobs=list(self.top_logprobs),
                             stop_reason=self.stop_reason,
                             timings=Timings(ttft_s=t_first - self.t_submit, total_s=t_done - self.t_submit,
                                             decode_tokens_per_s=rate))


class EngineDriver:
    """Submits requests, steps the engine, routes events; optionally on a background step thread."""

    def __init__(self, engine, tokenizer, eos_token_ids: list[int], step_thread: bool = False) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self._ids = itertools.count()
        self._live: dict[int, RequestState] = {}  # touched only by the thread that owns the engine
        # Guards request states (read by waiting callers) and the command queue of the step thread.
        self._cond = threading.Condition()
        self._commands: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self._closing = False
        self._thread: threading.Thread | None = None
        if step_thread:
            self._thread = threading.Thread(target=self._loop, name="lowbit-step", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    # ------------------------------------------------------------------ engine access
    def call(self, fn: Callable[[], Any]) -> Any:
        """Runs fn (which uses the engine) on the thread that owns the engine and returns its result."""
        return self.call_nowait(fn).result()

    def call_nowait(self, fn: Callable[[], Any]) -> Future:
        """Queues fn for the thread that owns the engine (runs it now when that is this thread, or in inline mode);
        the future holds its result or exception."""
        fut: Future = Future()
        if self._thread is None or threading.current_thread() is self._thread:
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                fut.set_exception(e)
            return fut
        with self._cond:
            if self._closing:
                raise RuntimeError("LLM: the engine's step thread is closed")
            self._commands.append((fn, fut))
            self._cond.notify_all()
        return fut

    def submit(self, prompt: str | None, prompt_ids: list[int], config: GenerationConfig,
               session_id: int = -1) -> RequestState:
        state, added = self.submit_nowait(prompt, prompt_ids, config, session_id)
        added.result()
        return state

    def submit_nowait(self, prompt: str | None, prompt_ids: list[int], config: GenerationConfig,
                      session_id: int = -1) -> tuple[RequestState, Future]:
        """Queues the request for the engine's thread and returns at once: its state, and a future that is done
        (or holds the engine's error) once the engine has the request. A server awaits that future instead of
        holding a thread per submission (each submission waits for the step thread's next turn, one step away)."""
        stop_ids = set(config.stop_token_ids) | (set() if config.ignore_eos else set(self.eos_token_ids))
        state = RequestState(next(self._ids), prompt, prompt_ids, config, self.tokenizer, stop_ids)

        def add() -> None:
            self.engine.add_request(
                state.request_id, prompt_ids, temperature=config.temperature, top_k=config.top_k,
                top_p=config.top_p, min_p=config.min_p, repetition_penalty=config.repetition_penalty,
                presence_penalty=config.presence_penalty, frequency_penalty=config.frequency_penalty,
                seed=config.seed, max_tokens=config.max_tokens, min_tokens=config.min_tokens,
                stop_token_ids=sorted(stop_ids), logprobs=config.logprobs, session_id=session_id)
            self._live[state.request_id] = state

        return state, self.call_nowait(add)

    def abort(self, state: RequestState) -> None:
        """Ends the request (no-op once finished) and frees its KV."""
        with self._cond:
            if not state.finished:
                state._finish("abort")

        def drop() -> None:
            if self._live.pop(state.request_id, None) is not None:
                self.engine.abort(state.request_id)

        if self._thread is not None and threading.current_thread() is not self._thread:
            with self._cond:  # fire and forget: the step thread applies it before its next step
                if not self._closing:
                    self._commands.append((drop, Future()))
                    self._cond.notify_all()
        else:
            drop()

    # ------------------------------------------------------------------ stepping
    def step(self) -> None:
        """One engine step in the calling thread (inline mode), routing its events."""
        self._route(self.engine.step())

    def _route(self, events) -> None:
        with self._cond:
            for ev in events:
                state = self._live.get(ev.request_id)
                if state is None:
                    continue  # the abort event of a request we already closed
                if state.finished:
                    # abort() from another thread ended it after this step began: its drop command would find
                    # it gone from _live and the engine would keep running it, so free it in the engine here.
                    del self._live[state.request_id]
                    self.engine.abort(state.request_id)
                    continue
                if state.on_event(ev):
                    self.engine.abort(state.request_id)  # a stop string: free its KV now
                if state.finished:
                    del self._live[state.request_id]
            self._cond.notify_all()

    def wait(self, states: list[RequestState], until: Callable[[], bool] | None = None) -> None:
        """Returns when every state finished (or `until()` holds); raises a failed step's error."""
        done = until or (lambda: all(s.finished for s in states))
        if self._thread is None:
            while not done():
                self.step()
            return
        with self._cond:
            self._cond.wait_for(lambda: done() or any(s.error for s in states) or self._closing)
            for s in states:
                if s.error is not None:
                    raise s.error
            if not done():
                raise RuntimeError("LLM: the engine's step thread was closed while requests were running")

    def run_until_done(self, states: list[RequestState]) -> None:
        self.wait(states)

    def locked(self):
        """Context manager under which request states may be read consistently (step-thread mode)."""
        return self._cond

    def _loop(self) -> None:
        name_native_thread("lowbit-step")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._commands or self._live)
                if self._closing:
                    break
                commands = list(self._commands)
                self._commands.clear()
            for fn, fut in commands:
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller waiting on it
                    fut.set_exception(e)
            if not self._live:
                continue
            try:
                events = self.engine.step()  # the GIL is released inside
            except BaseException as e:  # noqa: BLE001 - the engine re-queued these requests; end them with it
                self._fail_live(e)
                continue
            self._route(events)
        self._fail_pending()

    def _fail_live(self, error: BaseException) -> None:
        with self._cond:
            live = list(self._live.values())
            self._live.clear()
            for s in live:
                s.error = error
                s._finish("abort")
            self._cond.notify_all()
        for s in live:
            self.engine.abort(s.request_id)

    def _fail_pending(self) -> None:
        with self._cond:
            commands = list(self._commands)
            self._commands.clear()
        for _, fut in commands:
            if not fut.done():
                fut.set_exception(RuntimeError("LLM: the engine's step thread is closed"))

    def close(self) -> None:
        """Stops the step thread (live requests end with an error); inline mode has nothing to stop."""
        if self._thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for s in list(self._live.values()):
            if not s.finished:
                s._finish("abort")
