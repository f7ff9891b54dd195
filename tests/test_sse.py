"""SSE framing: an error after the first byte is an error event in the envelope, then [DONE]."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from mlxcel.api.errors import install_error_handlers
from mlxcel.api.sse import event_stream
from mlxcel.protocol.errors import APIError


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    async def fails_midway() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 1}
        raise APIError(500, "engine fell over", code="engine_error")

    async def fails_first() -> AsyncIterator[dict[str, Any]]:
        raise APIError(503, "busy", type="server_busy")
        yield {}

    @app.get("/midway")
    async def midway() -> StreamingResponse:
        return await event_stream(fails_midway())

    @app.get("/first")
    async def first() -> StreamingResponse:
        return await event_stream(fails_first())

    return app


def _get(path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path)

    return asyncio.run(go())


def test_error_after_first_byte_is_an_event_then_done() -> None:
    response = _get("/midway")
    assert response.status_code == 200
    events = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert json.loads(events[0]) == {"n": 1}
    error = json.loads(events[1])["error"]
    assert error == {
        "message": "engine fell over",
        "type": "server_error",
        "param": None,
        "code": "engine_error",
    }
    assert events[2] == "[DONE]"


def test_error_before_first_byte_keeps_its_status() -> None:
    response = _get("/first")
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_busy"
