"""/v1/completions and /v1/chat/completions: a request becomes a Job (validated prompts and configs), which runs
as one JSON response or as an SSE stream of OpenAI-format chunks."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..generation import GenerationConfig
from .protocol import ChatCompletionRequest, CompletionRequest, RequestError, message_dicts, sampling_overrides
from .responses import Choice, chat_logprobs, completion_logprobs, envelope, usage


DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks that its client is still there


class ClientGone(Exception):
    pass


@dataclass
class Job:
    chat: bool                                   # chat.completion(.chunk) or text_completion
    prompts: list[tuple[str | None, list[int]]]  # (text or None, token ids)
    configs: list[GenerationConfig]              # one per choice of each prompt (n)
    stream: bool
    include_usage: bool
    logprobs: bool                               # the response carries logprobs
    top_logprobs: bool                           # ... and the top alternatives
    t_arrival: float
    tokens_as_ids: bool = False                  # logprobs name tokens "token_id:<id>" (return_tokens_as_token_ids)


def _max_tokens(req, names: tuple[str, ...]) -> tuple[int | None, str]:
    for name in names:
        value = getattr(req, name, None)
        if value is not None:
            return value, name
    return None, names[0]


def _completion_prompts(prompt) -> list:
    """The four shapes of `prompt`: text, list of texts, token ids, list of token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise RequestError("prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [prompt]
    return list(prompt)


def completion_job(server, req: CompletionRequest) -> Job:
    server.check_model(req.model)
    if req.echo:
        raise RequestError("echo is not supported", "echo")
    max_tokens, mt_name = _max_tokens(req, ("max_tokens",))
    overrides = sampling_overrides(req, max_tokens)
    overrides["logprobs"] = req.logprobs or 0
    cfg = server.config(overrides, {"max_tokens": mt_name, "logprobs": "logprobs"})
    prompts = [server.prompt_ids(p, i, cfg, "prompt") for i, p in enumerate(_completion_prompts(req.prompt))]
    return Job(chat=False, prompts=prompts, configs=server.choice_configs(cfg, req.n, req.seed is not None),
               stream=req.stream, include_usage=bool(req.stream_options and req.stream_options.include_usage),
               logprobs=req.logprobs is not None, top_logprobs=bool(req.logprobs), t_arrival=time.perf_counter(),
               tokens_as_ids=req.return_tokens_as_token_ids)


def chat_job(server, req: ChatCompletionRequest) -> Job:
    server.check_model(req.model)
    if not req.messages:
        raise RequestError("messages must not be empty", "messages")
    if req.top_logprobs is not None and not req.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    max_tokens, mt_name = _max_tokens(req, ("max_completion_tokens", "max_tokens"))
    overrides = sampling_overrides(req, 1 if max_tokens is None else max_tokens)  # 1: validated below
    overrides["logprobs"] = req.top_logprobs or 0
    cfg = server.config(overrides, {"max_tokens": mt_name, "logprobs": "top_logprobs"})
    messages = message_dicts(req.messages)
    try:  # the chat template as LLM.chat renders it
        text = server.llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = server.llm.chat_ids(messages)
    except Exception as e:  # noqa: BLE001 - a template may raise anything on messages it refuses
        raise RequestError(f"messages: the chat template refused them: {e}", "messages") from None
    ids = server.prompt_ids(ids, 0, cfg, "messages")[1]
    if max_tokens is None:  # like OpenAI: without a limit, the reply may fill the context
        cfg = cfg.replace(max_tokens=server.llm.config.max_position_embeddings - len(ids))
    return Job(chat=True, prompts=[(text, ids)], configs=server.choice_configs(cfg, req.n, req.seed is not None),
               stream=req.stream, include_usage=bool(req.stream_options and req.stream_options.include_usage),
               logprobs=req.logprobs, top_logprobs=bool(req.top_logprobs), t_arrival=time.perf_counter(),
               tokens_as_ids=req.return_tokens_as_token_ids)


async def _unless_disconnected(request, work) -> Any:
    """Awaits `work`; cancels it (which aborts its requests) when the client goes away first."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientGone()


async def run_job(server, job: Job, request):
    sequences = len(job.prompts) * len(job.configs)
    server.reserve(sequences)  # 503 when the server holds too much already
    endpoint = "chat" if job.chat else "completions"
    if not job.stream:
        try:
            body = await _unless_disconnected(request, _complete(server, job))
        except ClientGone:
            server.metrics.requests.labels(endpoint, "disconnected").inc()
            return Response(status_code=499)  # nobody reads it; keeps the access log honest
        except BaseException:
            server.metrics.requests.labels(endpoint, "error").inc()
            raise
        finally:
            server.release(sequences)
        server.metrics.requests.labels(endpoint, "ok").inc()
        return JSONResponse(body)

    async def events() -> AsyncIterator[str]:
        status = "error"
        try:
            # aclosing: a disconnect closes the inner stream right away, which aborts its requests
            async with contextlib.aclosing(_stream(server, job)) as chunks:
                async for event in chunks:
                    yield event
            status = "ok"
        except (asyncio.CancelledError, GeneratorExit):  # the client went away mid-stream
            status = "disconnected"
            raise
        finally:  # also when the client disconnected: the stream is cancelled and its requests aborted
            server.release(sequences)
            server.metrics.requests.labels(endpoint, status).inc()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _logprobs_body(server, job: Job, token_ids, logprobs, top_logprobs, offset: int = 0):
    if not job.logprobs:
        return None
    tok = server.llm.tokenizer
    if job.chat:
        return chat_logprobs(tok, token_ids, logprobs, top_logprobs if job.top_logprobs else [], job.tokens_as_ids)
    return completion_logprobs(tok, token_ids, logprobs, top_logprobs, job.top_logprobs, offset, job.tokens_as_ids)


def _usage(job: Job, choices) -> dict[str, int]:
    return usage(sum(len(ids) for _, ids in job.prompts), sum(len(c.token_ids) for c in choices))


async def _complete(server, job: Job) -> dict[str, Any]:
    choices = [Choice() for _ in range(len(job.prompts) * len(job.configs))]
    async with contextlib.aclosing(server.generate(job.prompts, job.configs, job.t_arrival)) as batches:
        async for batch in batches:
            for u in batch:
                choices[u.index].add(u)
    out = []
    for i, c in enumerate(choices):
        lp = _logprobs_body(server, job, c.token_ids, c.logprobs, c.top_logprobs)
        if job.chat:
            out.append({"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": lp,
                        "finish_reason": c.finish_reason})
        else:
            out.append({"index": i, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason})
    kind = "chat.completion" if job.chat else "text_completion"
    request_id = ("chatcmpl-" if job.chat else "cmpl-") + uuid.uuid4().hex
    return {**envelope(kind, request_id, server.model_name), "choices": out, "usage": _usage(job, choices)}


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _sse(body: dict[str, Any]) -> str:
    return f"data: {_dumps(body)}\n\n"


async def _stream(server, job: Job) -> AsyncIterator[str]:
    kind = "chat.completion.chunk" if job.chat else "text_completion"
    head = envelope(kind, ("chatcmpl-" if job.chat else "cmpl-") + uuid.uuid4().hex, server.model_name)
    choices = [Choice() for _ in range(len(job.prompts) * len(job.configs))]
    # Every chunk is the envelope, one choice, then usage (null until the last chunk when asked for): the parts
    # around the choice are rendered once per stream, each chunk only encodes its own choice.
    before = "data: " + _dumps(head)[:-1] + ', "choices": ['
    after = ("], " + '"usage": null}\n\n') if job.include_usage else "]}\n\n"

    def chunk(index: int, text: str | None, lp, finish: str | None, first: bool = False) -> str:
        if job.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            c = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            c = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return before + _dumps(c) + after

    if job.chat:  # OpenAI opens every chat choice with the assistant role
        for i in range(len(choices)):
            yield chunk(i, "", None, None, first=True)
    try:
        async with contextlib.aclosing(server.generate(job.prompts, job.configs, job.t_arrival)) as batches:
            async for batch in batches:
                events = []  # the batch's chunks go out in one write
                for u in batch:
                    c = choices[u.index]
                    offset = len(c.text)
                    c.add(u)
                    lp = _logprobs_body(server, job, u.token_ids, u.logprobs, u.top_logprobs, offset)
                    if u.text or (lp and u.token_ids):
                        events.append(chunk(u.index, u.text, lp, None))
                    if u.finish_reason is not None:
                        events.append(chunk(u.index, None if job.chat else "", None, u.finish_reason))
                if events:
                    yield "".join(events)
    except Exception as e:  # noqa: BLE001 - the stream already began (200): report the error in it
        yield _sse({"error": {"message": f"generation failed: {e}", "type": "internal_error", "param": None,
                              "code": None}})
        return
    if job.include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(job, choices)})
    yield "data: [DONE]\n\n"
