"""Streamed responses: the typed Responses events, from response.created to a final state."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

from mlxcel.engine.scheduler import RequestHandle
from mlxcel.engine.types import TokenEvent
from mlxcel.serving.errors import APIError
from mlxcel.serving.response_store import ResponseStore
from mlxcel.serving.responses import (
    ResponseRun,
    finish,
    message_item,
    output_text,
    response_object,
    status_for,
    usage_object,
)
from mlxcel.serving.responses_tools import ToolEvents
from mlxcel.serving.text import events, start

logger = logging.getLogger(__name__)


class _Events:
    """Builds one response's events, numbering them in the order they are sent."""

    def __init__(self, run: ResponseRun) -> None:
        self.run = run
        self._numbers = itertools.count()

    def event(self, type_: str, **fields: Any) -> dict[str, Any]:
        return {"type": type_, "sequence_number": next(self._numbers), **fields}

    def text(self, type_: str, **fields: Any) -> dict[str, Any]:
        """An event about the one output_text part of the one message."""
        where = {"item_id": self.run.message_id, "output_index": 0, "content_index": 0}
        return self.event(type_, **where, **fields)


async def response_events(run: ResponseRun, store: ResponseStore) -> AsyncIterator[dict[str, Any]]:
    """The events of one streamed response; an engine failure ends it with response.failed."""
    handle = start(run.generation)
    out = _Events(run)
    in_progress = response_object(run, "in_progress", [])
    yield out.event("response.created", response=in_progress)
    yield out.event("response.in_progress", response=in_progress)
    stream = _tool_events if run.tools is not None else _text_events
    async for event in stream(out, store, handle):
        yield event


async def _text_events(
    out: _Events, store: ResponseStore, handle: RequestHandle
) -> AsyncIterator[dict[str, Any]]:
    run = out.run
    yield out.event(
        "response.output_item.added", output_index=0, item=message_item(run, "in_progress", None)
    )
    yield out.text("response.content_part.added", part=output_text(""))
    parts: list[str] = []
    try:
        async for event in events(handle):
            if event.text:
                parts.append(event.text)
                yield out.text("response.output_text.delta", delta=event.text, logprobs=[])
            if event.finish_reason is not None:
                for done in _done(out, store, "".join(parts), event):
                    yield done
    except Exception as exc:
        yield _failed(out, store, "".join(parts), exc)


async def _tool_events(
    out: _Events, store: ResponseStore, handle: RequestHandle
) -> AsyncIterator[dict[str, Any]]:
    run = out.run
    assert run.tools is not None
    tools = ToolEvents(
        run.tools.parser, out.event, lambda status, text: message_item(run, status, text)
    )
    try:
        async for event in events(handle):
            for item in tools.feed(event.text):
                yield item
            if event.finish_reason is not None:
                for item in tools.finish():
                    yield item
                status = status_for(event.finish_reason)
                usage = usage_object(
                    event.prompt_tokens, event.completion_tokens, event.cached_tokens
                )
                calls = [i for i in tools.items if i["type"] == "function_call"]
                response = finish(run, store, status, tools.text or "", usage, calls=calls)
                yield out.event(f"response.{status}", response=response)
    except Exception as exc:
        yield _failed(out, store, tools.text or "", exc)


def _done(out: _Events, store: ResponseStore, text: str, last: TokenEvent) -> list[dict[str, Any]]:
    run = out.run
    status = status_for(last.finish_reason or "stop")
    usage = usage_object(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
    response = finish(run, store, status, text, usage)
    return [
        out.text("response.output_text.done", text=text, logprobs=[]),
        out.text("response.content_part.done", part=output_text(text)),
        out.event("response.output_item.done", output_index=0, item=response["output"][0]),
        out.event(f"response.{status}", response=response),
    ]


def _failed(out: _Events, store: ResponseStore, text: str, exc: Exception) -> dict[str, Any]:
    if isinstance(exc, APIError):
        message = exc.message
        logger.warning("[%s] failed mid-stream: %s", out.run.generation.request_id, message)
    else:
        message = "internal server error"
        logger.exception("[%s] failed mid-stream", out.run.generation.request_id)
    error = {"code": "server_error", "message": message}
    return out.event(
        "response.failed", response=finish(out.run, store, "failed", text, None, error)
    )
