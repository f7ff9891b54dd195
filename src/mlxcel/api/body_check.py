"""A JSON body is checked whole before any route reads it: valid UTF-8, valid JSON, no lone
surrogates, and nested no deeper than MAX_JSON_DEPTH.

Python's JSON reader passes a lone UTF-16 surrogate through (escaped as "\\ud800", or as raw
bytes), and such a string cannot be encoded again: the tokenizer would fail on it with a 500.
Deep nesting is a RecursionError in the reader or in whatever walks the value after it. Each is
a 400 here naming what is wrong (and where, as a dotted path), in the envelope of the route's
API.

The body is read once: pydantic-core's reader (which refuses invalid UTF-8 and lone surrogates
itself, 5x quicker than `json.loads` on a body carrying an image) parses it, the value waits in
the request's scope, and a `CheckedJsonRoute` hands it to FastAPI instead of parsing the body
again. Only a body that reader refuses is read again, with Python's, to say what is wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic_core import from_json
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxcel.api.hosts import Envelope, json_error
from mlxcel.api.limits import GUESSED_JSON
from mlxcel.protocol.errors import APIError

# Levels of arrays and objects a body may nest. A chat request needs about 6; a JSON schema
# inside one is held to its own limit (serving/structured.py).
MAX_JSON_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")
# A lone surrogate can only come from an escape (UTF-8 cannot carry one): a body without any
# escape of the surrogate range needs no scan of its strings, which for a body carrying an
# image as a data: URI is most of the time checking takes.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
# What a body whose type was only guessed may be: not JSON at all.
_UNREAD = ("invalid_json", "invalid_utf8")
# Where a checked body's value waits in the request's scope for its route.
PARSED_JSON = "mlxcel.parsed_json"
# The scope key of the body that value was read from.
READ_BODY = "mlxcel.read_body"


def _problem(value: Any, strings: bool = True) -> APIError | None:
    """What is wrong with a parsed body, walked without recursion; its strings are scanned
    for lone surrogates only if `strings`."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, where = stack.pop()
        if len(where) > MAX_JSON_DEPTH:
            param = ".".join(where[:8]) + ".…"
            return APIError(
                400,
                f"the body nests deeper than {MAX_JSON_DEPTH} levels",
                param=param,
                code="json_too_deep",
            )
        if isinstance(item, str):
            if strings and _SURROGATE.search(item):
                return _bad("a string holds a lone UTF-16 surrogate", where, "invalid_unicode")
        elif isinstance(item, dict):
            for key, child in item.items():
                if strings and _SURROGATE.search(key):
                    return _bad("a key holds a lone UTF-16 surrogate", where, "invalid_unicode")
                stack.append((child, (*where, key)))
        elif isinstance(item, list):
            stack.extend((child, (*where, str(i))) for i, child in enumerate(item))
    return None


def _bad(message: str, where: tuple[str, ...], code: str) -> APIError:
    param = ".".join(where) or None
    at = f" (at '{param}')" if param else ""
    return APIError(400, message + at, param=param, code=code)


def check_json(body: bytes) -> tuple[APIError | None, Any]:
    """A 400 for a body that is not one this server can read as JSON (else None), and the
    body's value."""
    try:
        value = from_json(body)
    except ValueError:
        return _diagnosed(body)
    return _problem(value, strings=False), value


def _diagnosed(body: bytes) -> tuple[APIError | None, Any]:
    """What is wrong with a body pydantic-core's reader refused, read with Python's."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        error = f"the body is not valid UTF-8 (at byte {exc.start})"
        return APIError(400, error, code="invalid_utf8"), None
    try:
        value = json.loads(text)
    except RecursionError:
        error = f"the body nests deeper than {MAX_JSON_DEPTH} levels"
        return APIError(400, error, code="json_too_deep"), None
    except ValueError as exc:
        return APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json"), None
    return _problem(value, strings=_ESCAPED_SURROGATE.search(body) is not None), value


class JsonCheck:
    """ASGI middleware: read a JSON body whole, answer 400 if `check_json` finds it wrong, and
    hand the body on to the route otherwise. `envelope` shapes the error for the path's API."""

    def __init__(self, app: ASGIApp, envelope: Envelope) -> None:
        self.app = app
        self.envelope = envelope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _json_body(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                # The client left before its body was whole.
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        error, value = check_json(body) if body else (None, None)
        if error is not None and scope.get(GUESSED_JSON) and error.code in _UNREAD:
            # Labelled JSON only by guess (a form, or no type): the route reads it its way.
            error = None
        if error is not None:
            await json_error(send, error, self.envelope(scope["path"], error))
            return
        if body and value is not None:
            scope[PARSED_JSON] = value
            scope[READ_BODY] = body
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _json_body(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
        return False
    content_type = dict(scope["headers"]).get(b"content-type", b"")
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class _CheckedRequest(Request):
    """A request whose JSON body `JsonCheck` has read already."""

    async def body(self) -> bytes:
        # Starlette's own joins the replayed body with the stream's empty end: a copy of the
        # whole body (an image's 820 KB: 0.8 ms of the event loop, a fresh buffer faulted in).
        read: bytes | None = self.scope.get(READ_BODY)
        return read if read is not None else await super().body()

    async def json(self) -> Any:
        if PARSED_JSON in self.scope:
            return self.scope[PARSED_JSON]
        return await super().json()


class CheckedJsonRoute(APIRoute):
    """A route that takes its JSON body as `JsonCheck` read it, not parsing it again."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_CheckedRequest(request.scope, request.receive))

        return route
