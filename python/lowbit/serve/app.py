"""The FastAPI app: OpenAI-compatible completions and chat (plain and SSE streaming), models, health, metrics.

One LLM per process, stepped by its own thread (see engine_loop.py); request handlers only validate, submit and
await their updates, so a slow or bad request never holds up the others.
"""
from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..generation import GenerationConfig
from .auth import ApiKeyMiddleware
from .engine_loop import EngineLoop, Update, UpdateChannel
from .metrics import Metrics
from .handlers import chat_job, completion_job, run_job
from .protocol import ChatCompletionRequest, CompletionRequest, RequestError, error_body

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_CONFIG_FIELD = re.compile(r"GenerationConfig: (\w+) must")


class Server:
    """What the routes share: the model, the engine loop, limits and metrics."""

    def __init__(self, llm, model_name: str, max_seqs: int, max_queue: int) -> None:
        self.llm = llm
        self.model_name = model_name
        self.capacity = max_seqs + max_queue  # sequences held at once: running in the engine plus waiting
        self.in_flight = 0
        self.metrics = Metrics()
        self.engine: EngineLoop | None = None  # created on startup, inside the event loop
        self.created = int(time.time())
        base = GenerationConfig.from_model_defaults(llm.generation_defaults)
        self.base_config = base.replace(max_tokens=DEFAULT_COMPLETION_MAX_TOKENS)

    # ------------------------------------------------------------------ validation
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise RequestError(f"The model '{name}' does not exist; this server serves '{self.model_name}'",
                               "model", code="model_not_found")

    def config(self, overrides: dict[str, Any], field_names: dict[str, str]) -> GenerationConfig:
        """GenerationConfig validates the values; its error names the field, which we map to the request's."""
        try:
            return self.base_config.replace(**overrides)
        except (ValueError, TypeError) as e:
            m = _CONFIG_FIELD.search(str(e))
            name = m.group(1) if m else None
            raise RequestError(str(e), field_names.get(name, name)) from None

    def prompt_ids(self, prompt, index: int, cfg: GenerationConfig, param: str) -> tuple[str | None, list[int]]:
        try:
            return self.llm._prompt_ids(prompt, index, cfg)
        except (ValueError, TypeError) as e:
            raise RequestError(str(e), param) from None

    def reserve(self, sequences: int) -> None:
        if self.in_flight + sequences > self.capacity:
            raise RequestError(f"The server is overloaded ({self.in_flight} sequences in flight); retry later",
                               None, status=503, type_="server_overloaded")
        self.in_flight += sequences
        self.metrics.in_flight.set(self.in_flight)

    def release(self, sequences: int) -> None:
        self.in_flight -= sequences
        self.metrics.in_flight.set(self.in_flight)

    # ------------------------------------------------------------------ generation
    @staticmethod
    def choice_configs(cfg: GenerationConfig, n: int, seed_given: bool) -> list[GenerationConfig]:
        """n samples of one prompt differ by seed (seed, seed+1, ...; random when the request gives none)."""
        if not 1 <= n <= 128:
            raise RequestError(f"n must be in [1, 128], got {n}", "n")
        seed = cfg.seed if seed_given else random.randrange(2**31)
        return [cfg.replace(seed=seed + j) for j in range(n)]

    async def generate(self, prompts: list[tuple[str | None, list[int]]], configs: list[GenerationConfig],
                       t_arrival: float) -> AsyncIterator[list[Update]]:
        """Runs every prompt once per config; yields its updates (index = prompt * len(configs) + config) in
        lists: everything queued when the caller asks again, so a stream that fell behind writes its backlog at once
        instead of one write per engine step.

        Closing the iterator early (a client gone, an error) aborts whatever is still running."""
        channel = UpdateChannel()
        states = []
        last_token_time: dict[int, float] = {}
        try:
            for text, ids in prompts:
                for cfg in configs:
                    states.append(await self.engine.submit(text, ids, cfg, len(states), channel))
                    self.metrics.prompt_tokens.inc(len(ids))
            remaining = len(states)
            while remaining:
                queued = await channel.take_all()
                batch = []
                for u in queued:
                    if u.error is not None:
                        if batch:  # what came before the error still reaches the client
                            yield batch
                        raise u.error
                    if u.token_ids:
                        self._observe_latency(u, last_token_time, t_arrival)
                    if u.finish_reason is not None:
                        remaining -= 1
                    batch.append(u)
                yield batch
        finally:
            for s in states:
                self.engine.abort(s)

    def _observe_latency(self, u: Update, last: dict[int, float], t_arrival: float) -> None:
        m = self.metrics
        k = len(u.token_ids)
        m.generation_tokens.inc(k)
        previous = last.get(u.index)
        if previous is None:
            m.ttft.observe(u.time - t_arrival)
            if k > 1:  # further tokens that came with the first one
                m.itl.observe(0.0, k - 1)
        else:
            m.itl.observe((u.time - previous) / k, k)  # tokens that arrived together share the gap
        last[u.index] = u.time


def _error_response(e: RequestError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 503 else None
    return JSONResponse(error_body(e.message, e.type, e.param, e.code), status_code=e.status, headers=headers)


def create_app(llm, model_name: str, api_key: str | None = None, max_seqs: int = 64,
               max_queue: int = 256) -> FastAPI:
    server = Server(llm, model_name, max_seqs, max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.engine = EngineLoop(llm, asyncio.get_running_loop())
        try:
            yield
        finally:
            server.engine.close()

    app = FastAPI(title="lowbit", lifespan=lifespan)
    app.state.server = server

    # ------------------------------------------------------------------ errors, auth
    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, e: RequestError):
        return _error_response(e)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {}
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        msg = f"{param}: {err.get('msg', 'invalid value')}" if param else str(err.get("msg", "invalid request body"))
        return _error_response(RequestError(msg, param))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, e: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(e.status_code, "invalid_request_error")
        message = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(error_body(message, kind), status_code=e.status_code)

    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)

    # ------------------------------------------------------------------ plain routes
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        stats = await server.engine.stats()
        return Response(server.metrics.render(stats), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": server.created,
                                            "owned_by": "lowbit", "max_model_len": llm.config.max_position_embeddings}]}

    # ------------------------------------------------------------------ generation routes
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await run_job(server, completion_job(server, req), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await run_job(server, chat_job(server, req), request)

    return app
