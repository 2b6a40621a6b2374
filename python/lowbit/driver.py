"""Runs the C++ engine's step loop for every live request: detokenizes, finds stop strings, keeps timings.

Each request owns a RequestState; whoever steps the engine (a generate() call, a stream, a session turn)
routes every event to its state, so interleaved callers never lose one another's tokens.
"""
from __future__ import annotations

import itertools
import time

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
    def __init__(self, engine, tokenizer, eos_token_ids: list[int]) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self._ids = itertools.count()
        self._live: dict[int, RequestState] = {}

    def submit(self, prompt: str | None, prompt_ids: list[int], config: GenerationConfig,
               session_id: int = -1) -> RequestState:
        stop_ids = set(config.stop_token_ids) | (set() if config.ignore_eos else set(self.eos_token_ids))
        state = RequestState(next(self._ids), prompt, prompt_ids, config, self.tokenizer, stop_ids)
        self.engine.add_request(
            state.request_id, prompt_ids, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
            min_p=config.min_p, repetition_penalty=config.repetition_penalty,
            presence_penalty=config.presence_penalty, frequency_penalty=config.frequency_penalty, seed=config.seed,
            max_tokens=config.max_tokens, min_tokens=config.min_tokens, stop_token_ids=sorted(stop_ids),
            logprobs=config.logprobs, session_id=session_id)
        self._live[state.request_id] = state
        return state

    def abort(self, state: RequestState) -> None:
        if not state.finished:
            state._finish("abort")
        if self._live.pop(state.request_id, None) is not None:
            self.engine.abort(state.request_id)

    def step(self) -> None:
        for ev in self.engine.step():
            state = self._live.get(ev.request_id)
            if state is None:
                continue  # the abort event of a request we already closed
            if state.on_event(ev):
                self.engine.abort(state.request_id)  # a stop string: free its KV now
            if state.finished:
                del self._live[state.request_id]

    def run_until_done(self, states: list[RequestState]) -> None:
        while not all(s.finished for s in states):
            self.step()
