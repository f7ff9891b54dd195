"""The browser policy: CORS for apps on other origins (--cors-origins), and nothing else.

A request carrying an `Origin` comes from a browser page. One from the server's own origin
(the playground) or from an origin --cors-origins allows goes on; any other is refused with
403 before its body is read, whatever its content type: a page on another site may send a
"simple" POST (text/plain, no preflight) that the browser never lets it read, and the
server would still run it. Requests with no `Origin` (SDKs, curl) are not browser requests.

A preflight carries no credentials, so it is answered before any API key check; the request
that follows it still needs its key. A wildcard origin is answered with `*` and never with
credentials allowed; a listed origin is echoed, with credentials allowed and `Vary: Origin`.

A bare host name allows that host on http and https at any port; `localhost` is llama-server's
keyword for this machine's own names and addresses.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxcel.api.hosts import deny_websocket, json_error
from mlxcel.config.values import ANY_ORIGIN
from mlxcel.protocol.errors import APIError

METHODS = "GET, POST, DELETE, OPTIONS"
# Always allowed; a preflight's own Access-Control-Request-Headers are allowed as well (SDKs
# send headers of their own, like OpenAI's X-Stainless-* or Anthropic's anthropic-version).
HEADERS = ("Authorization", "X-Api-Key", "Content-Type")
MAX_AGE = "600"
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
# What llama-server's `--cors-origins localhost` lets in (an origin's host, any port).
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _refused() -> APIError:
    return APIError(
        403,
        "this origin is not allowed (--cors-origins)",
        type="invalid_request_error",
        code="cors_origin_not_allowed",
    )


def same_origin(scope: Scope, origin: str, headers: Headers) -> bool:
    """Whether `origin` is this server's own, as the request reached it."""
    host = headers.get("host")
    return host is not None and origin.lower() == f"{scope['scheme']}://{host}".lower()


class Cors:
    """ASGI middleware: 204 for an allowed preflight, 403 for another; CORS response headers
    for requests from an allowed origin; 403 for requests from any other but the server's."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.any = ANY_ORIGIN in origins
        self.origins = frozenset(o for o in origins if "://" in o)
        hosts = {o.lower() for o in origins if "://" not in o and o != ANY_ORIGIN}
        self.hosts = hosts | LOOPBACK_NAMES if "localhost" in hosts else hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        allowed = self.any or origin in self.origins or self._host_allowed(origin)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(send, origin if allowed else None, headers)
            return
        if not allowed:
            if same_origin(scope, origin, headers):
                await self.app(scope, receive, send)
            else:
                await json_error(send, _refused())
            return
        extra = self._allow(origin)

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_cors)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket from a page: the same policy, on its handshake (no preflight, no CORS
        headers: a browser sends any page's socket, so the origin is the whole guard)."""
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        web = {"ws": "http", "wss": "https"}.get(scope["scheme"], scope["scheme"])
        if (
            origin is None
            or self.any
            or origin in self.origins
            or self._host_allowed(origin)
            or same_origin({**scope, "scheme": web}, origin, headers)
        ):
            await self.app(scope, receive, send)
            return
        await deny_websocket(scope, receive, send, _refused())

    def _host_allowed(self, origin: str) -> bool:
        if not self.hosts:
            return False
        try:
            parts = urlsplit(origin)
            host = parts.hostname
        except ValueError:  # a malformed origin (an unclosed IPv6 bracket) matches no host
            return False
        return parts.scheme in ("http", "https") and host is not None and host in self.hosts

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
            await json_error(send, _refused())
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
        await send({"type": "http.response.start", "status": 204, "headers": response})
        await send({"type": "http.response.body", "body": b""})
