"""A cap on request body size, enforced before the body reaches a route."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxcel.api.hosts import Envelope, json_error
from mlxcel.protocol.errors import APIError


class BodyTooLarge(HTTPException):
    """The body went past the limit while it was being read (FastAPI re-raises HTTP errors)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body is larger than {max_bytes} bytes")


class BodySizeLimit:
    """ASGI middleware: 413 in the error envelope when a body exceeds `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int, envelope: Envelope) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.envelope = envelope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._reject(scope, send)
            return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await self._reject(scope, send)

    async def _reject(self, scope: Scope, send: Send) -> None:
        error = APIError(
            413, f"request body is larger than {self.max_bytes} bytes", code="request_too_large"
        )
        await json_error(send, error, self.envelope(scope["path"], error))


# Set in the scope of a request whose body JsonByDefault labelled JSON without its saying so.
GUESSED_JSON = "mlxcel.guessed_json"


class JsonByDefault:
    """ASGI middleware: read a POST body as JSON unless it says it is something else.

    llama-server does, and `curl -d '{...}'` (form-encoded by default) is how people try a
    local server first; multipart uploads keep their own type.
    """

    _GUESSED = (b"", b"application/x-www-form-urlencoded", b"text/plain")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            given = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip()
            if given in self._GUESSED:
                json_type = (b"content-type", b"application/json")
                scope = {**scope, "headers": [*headers, json_type], GUESSED_JSON: True}
        await self.app(scope, receive, send)
