"""POST /responses, and GET/DELETE of stored responses (under /v1 and without it)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.routes.text import unless_disconnected
from mlxcel.api.sse import typed_event_stream
from mlxcel.api.state import model_for
from mlxcel.protocol.errors import APIError
from mlxcel.protocol.responses import ResponsesRequest
from mlxcel.serving.response_store import ResponseStore, StoredResponse
from mlxcel.serving.responses import create_response, prepare_response
from mlxcel.serving.responses_stream import response_events
from mlxcel.serving.vision import history_media, media_urls, request_media, responses_media

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])


def _store(request: Request) -> ResponseStore:
    store: ResponseStore | None = getattr(request.app.state, "response_store", None)
    if store is None:
        store = request.app.state.response_store = ResponseStore()
    return store


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(
        404,
        f"no stored response with id '{response_id}' (never stored, expired or deleted)",
        param=param,
        code="response_not_found",
    )


def _stored(request: Request, response_id: str, param: str) -> StoredResponse:
    entry = _store(request).get(response_id)
    if entry is None:
        raise _not_found(response_id, param)
    return entry


def _stream_error(_: Exception, last: dict[str, Any]) -> dict[str, Any]:
    # response_events reports its own failures as response.failed; this is the last resort.
    error = {"code": "server_error", "message": "internal server error", "param": None}
    return {"type": "error", "sequence_number": last["sequence_number"] + 1, **error}


@router.post("/responses", response_model=None)
async def create(body: ResponsesRequest, request: Request) -> dict[str, Any] | StreamingResponse:
    """OpenAI Responses, streamed as typed events or whole."""
    model = await model_for(request, body.model)
    history: list[dict[str, Any]] = []
    earlier: tuple[str, ...] = ()
    if body.previous_response_id:
        entry = _stored(request, body.previous_response_id, "previous_response_id")
        history, earlier = entry.messages, entry.images
    # The conversation's images come first: their markers sit in the history's text.
    parts = [*history_media(earlier, "previous_response_id"), *responses_media(body)]
    images = await request_media(iter(parts), model, request.app.state.media)
    run = await asyncio.to_thread(
        prepare_response,
        model,
        body,
        history,
        model.n_predict,
        model.tool_call_parser,
        model.reasoning_parser,
        images,
        media_urls(iter(parts)),
    )
    if body.stream:
        events = response_events(run, _store(request))
        stream = typed_event_stream(events, run.generation.request_id, _stream_error)
        return await unless_disconnected(request, stream)
    return await unless_disconnected(request, create_response(run, _store(request)))


@router.get("/responses/{response_id}")
async def retrieve(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response."""
    return _stored(request, response_id, "response_id").response


@router.delete("/responses/{response_id}")
async def delete(response_id: str, request: Request) -> dict[str, Any]:
    """Forget a stored response."""
    if not _store(request).delete(response_id):
        raise _not_found(response_id, "response_id")
    return {"id": response_id, "object": "response", "deleted": True}
