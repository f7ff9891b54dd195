"""Server-sent events, with errors after the first byte sent as an event in the envelope.

Two framings: OpenAI's chat and completions streams (`data: {...}`, then `data: [DONE]`), and
typed events (`event: TYPE` + `data: {...}`, no `[DONE]`) for Responses and Anthropic Messages.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from mlxcel.engine.types import EngineError
from mlxcel.protocol.errors import APIError, unavailable_now

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def _known(exc: Exception) -> APIError | None:
    """The answer a stream's failure has when it is no fault: an APIError, or the engine
    saying the work cannot go on now (the shutdown timeout); None for anything else."""
    if isinstance(exc, APIError):
        return exc
    return unavailable_now(exc) if isinstance(exc, EngineError) else None


async def _frames(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield _event(chunk)
    except Exception as exc:
        known = _known(exc)
        if known is None:
            logger.exception("stream failed")
            known = APIError(500, "internal server error")
        yield _event(known.body())
    yield DONE


async def event_stream(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    """An SSE response; the first chunk comes before the headers, so early errors keep a status."""
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        first = None

    async def frames() -> AsyncIterator[bytes]:
        if first is not None:
            yield _event(first)
            async for frame in _frames(chunks):
                yield frame
        else:
            yield DONE

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)


def typed_frame(event: dict[str, Any]) -> bytes:
    """One typed event: its `type` names it on the `event:` line."""
    data = json.dumps(event, ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


ErrorEvent = Callable[[Exception, dict[str, Any]], dict[str, Any]]
"""The event that reports a failure after the headers went out, given the last event sent."""


async def typed_event_stream(
    events: AsyncIterator[dict[str, Any]], request_id: str, error_event: ErrorEvent
) -> StreamingResponse:
    """Typed SSE events; the first comes before the headers, so early errors keep a status."""
    first = await anext(events)

    async def frames() -> AsyncIterator[bytes]:
        last = first
        yield typed_frame(first)
        try:
            async for event in events:
                last = event
                yield typed_frame(event)
        except Exception as exc:
            known = _known(exc)
            if known is not None:
                logger.warning("%s: stream failed: %s", request_id, known.message)
            else:
                logger.exception("%s: stream failed", request_id)
            yield typed_frame(error_event(exc, last))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)
