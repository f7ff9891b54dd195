"""Streamed responses: the typed Responses events, from response.created to a final state."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

from mlxcel.engine.types import TokenEvent
from mlxcel.protocol.errors import APIError
from mlxcel.serving.response_store import ResponseStore
from mlxcel.serving.responses import (
    ResponseRun,
    finish,
    item_status,
    response_object,
    status_for,
    usage_object,
)
from mlxcel.serving.text import events, start
from mlxcel.serving.timings import timings_of

logger = logging.getLogger(__name__)


async def response_events(run: ResponseRun, store: ResponseStore) -> AsyncIterator[dict[str, Any]]:
    """The events of one streamed response; an engine failure ends it with response.failed.

    response.created waits for the engine's first event, so a request it refuses (a full
    queue, a wait past --queue-timeout) still gets its HTTP status, as chat does."""
    tokens = events(start(run.generation), run.generation)
    first = await anext(tokens)
    numbers = itertools.count()

    def event(type_: str, **fields: Any) -> dict[str, Any]:
        return {"type": type_, "sequence_number": next(numbers), **fields}

    in_progress = response_object(run, "in_progress", [])
    yield event("response.created", response=in_progress)
    yield event("response.in_progress", response=in_progress)
    output = run.output(event)
    per_token = run.request.timings_per_token
    try:
        async for token in _prepend(first, tokens):
            if token.progress is not None:
                # llama-server's return_progress, as it sends it on this API.
                progress = dataclasses.asdict(token.progress)
                yield event("response.in_progress", response=in_progress, prompt_progress=progress)
            for item in output.feed(token.text):
                if per_token and item["type"] == "response.output_text.delta":
                    item["timings"] = timings_of(token)
                yield item
            if token.finish_reason is None:
                continue
            status = status_for(token.finish_reason)
            for item in output.finish(item_status(status)):
                yield item
            usage = usage_object(
                run,
                token.prompt_tokens,
                token.completion_tokens,
                token.cached_tokens,
                output.reasoning or "",
            )
            final = finish(run, store, status, output, usage)
            # llama-server's timings beside the response, as every other answer has them.
            yield event(f"response.{status}", response=final, timings=timings_of(token))
    except Exception as exc:
        if isinstance(exc, APIError):
            message = exc.message
            logger.warning("%s failed mid-stream: %s", run.generation.request_id, message)
        else:
            message = "internal server error"
            logger.exception("%s failed mid-stream", run.generation.request_id)
        error = {"code": "server_error", "message": message}
        for item in output.finish("incomplete"):
            yield item
        response = finish(run, store, "failed", output, None, error)
        yield event("response.failed", response=response)


async def _prepend(first: TokenEvent, rest: AsyncIterator[TokenEvent]) -> AsyncIterator[TokenEvent]:
    yield first
    async for token in rest:
        yield token
