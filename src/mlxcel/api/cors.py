"""CORS for browser apps on other origins (--cors-origins): preflights and response headers.

A preflight carries no credentials, so it is answered before any API key check; the request
that follows it still needs its key. A wildcard origin is answered with `*` and never with
credentials allowed; a listed origin is echoed, with credentials allowed and `Vary: Origin`.
"""

from __future__ import annotations

import json
import re

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxcel.config import ANY_ORIGIN
from mlxcel.serving.errors import APIError

METHODS = "GET, POST, DELETE, OPTIONS"
# Always allowed; a preflight's own Access-Control-Request-Headers are allowed as well (SDKs
# send headers of their own, like OpenAI's X-Stainless-* or Anthropic's anthropic-version).
HEADERS = ("Authorization", "X-Api-Key", "Content-Type")
MAX_AGE = "600"
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


class Cors:
    """ASGI middleware: 204 for an allowed preflight, 403 for another; CORS response headers
    for requests from an allowed origin."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.any = ANY_ORIGIN in origins
        self.origins = frozenset(origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        allowed = self.any or origin in self.origins
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(send, origin if allowed else None, headers)
            return
        if not allowed:
            await self.app(scope, receive, send)
            return
        extra = self._allow(origin)

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_cors)

    def _allow(self, origin: str) -> list[tuple[bytes, bytes]]:
        if self.any:
            return [(b"access-control-allow-origin", b"*")]
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-allow-credentials", b"true"),
            (b"vary", b"Origin"),
        ]

    async def _preflight(self, send: Send, origin: str | None, headers: Headers) -> None:
        if origin is None:
            error = APIError(
                403,
                "this origin is not allowed (--cors-origins)",
                type="invalid_request_error",
                code="cors_origin_not_allowed",
            )
            body = json.dumps(error.body()).encode()
            response = [(b"content-type", b"application/json")]
            await _respond(send, 403, response, body)
            return
        requested = headers.get("access-control-request-headers", "")
        allowed = {name.lower(): name for name in HEADERS}
        for name in (n.strip() for n in requested.split(",")):
            if _HEADER_NAME.match(name):
                allowed.setdefault(name.lower(), name)
        response = [
            *self._allow(origin),
            (b"access-control-allow-methods", METHODS.encode()),
            (b"access-control-allow-headers", ", ".join(allowed.values()).encode()),
            (b"access-control-max-age", MAX_AGE.encode()),
        ]
        await _respond(send, 204, response, b"")


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    length = [(b"content-length", str(len(body)).encode())] if body else []
    await send({"type": "http.response.start", "status": status, "headers": [*headers, *length]})
    await send({"type": "http.response.body", "body": body})
