"""The Host allowlist: a request must name this server, so DNS rebinding cannot reach it.

A page on evil.example can make its own name resolve to 127.0.0.1; the browser then sends it
here as same-origin, with `Host: evil.example`. Accepted are IP addresses (a page cannot
rebind a literal address), `localhost` and names under `.localhost`, the name given to --host,
and the names in --allowed-hosts; anything else is a 400 before any work. A Unix socket has
no such check: a browser cannot reach one.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mlxcel.protocol.errors import APIError

ANY_HOST = "*"
# The body of an error a middleware answers on a path: None for the OpenAI envelope.
Envelope = Callable[[str, APIError], bytes | None]
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?$")


def parse_allowed_hosts(value: str) -> tuple[str, ...]:
    """--allowed-hosts: `*`, or comma-separated host names (no ports)."""
    names = tuple(n.strip().lower() for n in value.split(",") if n.strip())
    if not names:
        raise ValueError("--allowed-hosts needs '*' or at least one host name")
    for name in names:
        if name != ANY_HOST and not _NAME.match(name):
            raise ValueError(f"--allowed-hosts: '{name}' is not a host name (no scheme or port)")
    return names


def host_name(header: str) -> str:
    """The name in a Host header, without its port or an IPv6 address's brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostAllowlist:
    """ASGI middleware: 400 for a request whose Host names another server."""

    def __init__(self, app: ASGIApp, bound: tuple[str, ...], allowed: tuple[str, ...]) -> None:
        self.app = app
        self.any = ANY_HOST in allowed
        self.names = frozenset({*allowed, *(name.lower() for name in bound), *LOOPBACK_NAMES})

    def allows(self, header: str) -> bool:
        """Whether a Host header value names this server."""
        name = host_name(header).rstrip(".")
        return self.any or name in self.names or name.endswith(".localhost") or _is_address(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        # HTTP/1.1 requires the header (h11 refuses a request without it); 1.0 may omit it.
        host = Headers(scope=scope).get("host")
        if host is None or self.allows(host):
            await self.app(scope, receive, send)
            return
        error = APIError(
            400,
            f"the Host header '{host[:100]}' does not name this server; reach it by IP "
            "address or localhost, or start it with --allowed-hosts",
            code="host_not_allowed",
        )
        if scope["type"] == "websocket":
            await deny_websocket(scope, receive, send, error)
        else:
            await json_error(send, error)


async def json_error(send: Send, error: APIError, body: bytes | None = None) -> None:
    """Answer `error` in the envelope (or `body`, another shape of it) from a middleware."""
    data = json.dumps(error.body()).encode() if body is None else body
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def deny_websocket(scope: Scope, receive: Receive, send: Send, error: APIError) -> None:
    """Refuse a WebSocket before its upgrade: `error`'s status and envelope where the server
    can answer the handshake with a response (uvicorn can), else a 403."""
    await receive()  # websocket.connect
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    data = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send(
        {"type": "websocket.http.response.start", "status": error.status, "headers": headers}
    )
    await send({"type": "websocket.http.response.body", "body": data})
