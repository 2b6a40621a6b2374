"""Request bodies of the OpenAI-compatible endpoints (pydantic) and the helpers that turn them into lowbit terms.

Only the shape of each field is checked here; the values (temperature >= 0, top_p in (0, 1], ...) are checked by
GenerationConfig, so the server and the Python API reject the same requests with the same messages.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    # OpenAI clients send fields lowbit does not use (user, metadata, ...): accept and ignore them.
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    n: int = 1
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: bool = False
    # vLLM's extension: logprobs name each token "token_id:<id>" instead of its text, so that a client can tell
    # apart tokens whose texts are equal or are not valid UTF-8 on their own
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None


class CompletionRequest(_SamplingRequest):
    # text, list of texts, token ids, or a list of token-id lists
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: Optional[int] = None  # legacy completions: the number of top alternatives per token
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    # a string, or a list of content parts of which only {"type": "text"} ones are supported
    content: Union[str, list[dict[str, Any]], None] = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None


class RequestError(ValueError):
    """A bad request: becomes a 400 (or `status`) with the OpenAI error shape naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type_: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sampling_overrides(req: _SamplingRequest, max_tokens: int | None) -> dict[str, Any]:
    """The GenerationConfig fields a request sets; fields it leaves out keep GenerationConfig's defaults."""
    values: dict[str, Any] = {
        "max_tokens": max_tokens, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "min_p": req.min_p, "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty, "seed": req.seed,
    }
    out = {k: v for k, v in values.items() if v is not None}
    if req.stop is not None:
        out["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    out["ignore_eos"] = req.ignore_eos
    return out


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template takes them: content parts are joined into one text."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"messages[{i}]: only text content parts are supported", f"messages.{i}.content")
                texts.append(part["text"])
            content = "".join(texts)
        out.append({"role": m.role, "content": content or ""})
    return out
