"""Server-sent events, with errors after the first byte sent as an event in the envelope."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from mlxcel.serving.errors import APIError

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


async def _frames(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield _event(chunk)
    except APIError as exc:
        yield _event(exc.body())
    except Exception:
        logger.exception("stream failed")
        yield _event(APIError(500, "internal server error").body())
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
