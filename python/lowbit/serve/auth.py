"""--api-key: a plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which wraps `receive` and so hides a
client's disconnect from the handlers that watch for it)."""
from __future__ import annotations

import secrets

from fastapi.responses import JSONResponse

from .protocol import error_body


class ApiKeyMiddleware:
    """Every /v1/* request needs `Authorization: Bearer <key>`; /health and /metrics stay open for probes."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                response = JSONResponse(error_body("Missing or invalid API key (Authorization: Bearer <key>)",
                                                   "authentication_error", code="invalid_api_key"), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
