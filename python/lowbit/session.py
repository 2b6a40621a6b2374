"""Session: a multi-turn chat whose KV cache stays in the engine between turns (engine session ids).

Each turn's prompt is the previous turn's exact tokens (prompt + generated) plus the template text that
follows them, so the engine prefills only the new suffix. When the re-rendered conversation does not
continue those tokens (e.g. a reply cut by a stop string), the turn is encoded afresh and the engine
recomputes the whole prompt: slower, never wrong.
"""
from __future__ import annotations

from typing import Any, Iterator

from .generation import GenerationConfig, resolve_config
from .outputs import RequestOutput


class Session:
    def __init__(self, llm, session_id: int, system: str | None = None) -> None:
        self._llm = llm
        self.session_id = session_id
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self._history: list[int] = []  # the engine's token history of this session
        self._closed = False

    def _prompt_ids(self, cfg: GenerationConfig) -> list[int]:
        tok = self._llm.tokenizer
        rendered = tok.apply_chat_template(self.messages, add_generation_prompt=True)
        if self._history:
            done = tok.decode(self._history, skip_special_tokens=False)
            if rendered.startswith(done):
                ids = self._history + tok.encode(rendered[len(done):], add_special_tokens=False)
                return self._llm._prompt_ids(ids, 0, cfg)[1]
        return self._llm._prompt_ids(tok.encode(rendered, add_special_tokens=False), 0, cfg)[1]

    def _turns(self, user: str, config: GenerationConfig | None, overrides: dict[str, Any],
               result: list) -> Iterator[str]:
        if self._closed:
            raise RuntimeError(f"session {self.session_id} is closed")
        if not isinstance(user, str) or not user:
            raise ValueError("Session: the user message must be a non-empty string")
        cfg = resolve_config(config, overrides)
        self.messages.append({"role": "user", "content": user})
        try:
            ids = self._prompt_ids(cfg)
        except BaseException:
            self.messages.pop()
            raise
        yield from self._llm._stream_ids(None, ids, cfg, session_id=self.session_id, result=result)
        out: RequestOutput = result[-1]
        if out.finish_reason == "abort":
            self.messages.pop()
            self._history = []
            return
        self.messages.append({"role": "assistant", "content": out.text})
        self._history = ids + out.token_ids

    def send(self, user: str, config: GenerationConfig | None = None, **overrides: Any) -> RequestOutput:
        """One turn: the reply to `user`, after everything said so far."""
        result: list = []
        for _ in self._turns(user, config, overrides, result):
            pass
        return result[-1]

    def stream(self, user: str, config: GenerationConfig | None = None, **overrides: Any) -> Iterator[str]:
        """One turn, yielding text pieces as they arrive."""
        yield from self._turns(user, config, overrides, [])

    def close(self) -> None:
        """Frees the session's KV cache in the engine."""
        if not self._closed:
            engine = self._llm.engine
            self._llm._driver.call(lambda: engine.end_session(self.session_id))
            self._closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
