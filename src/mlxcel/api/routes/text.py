"""POST /chat/completions, its token count /chat/completions/input_tokens, and /completions
(served under /v1 and without it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.sse import event_stream
from mlxcel.api.state import model_for
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.completions import CompletionRequest
from mlxcel.protocol.errors import APIError
from mlxcel.serving.chat import chat_chunks, chat_completion, prepare_chat
from mlxcel.serving.completions import completion, completion_chunks, prepare_completion
from mlxcel.serving.native import count_input_tokens
from mlxcel.serving.vision import chat_media, request_media

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])

T = TypeVar("T")


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so its generation) if the client goes away: a
    streamed answer is awaited up to its first event, so a client that leaves while its
    request waits for a slot frees its place in the queue at once."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise APIError(499, "client closed the request", code="client_closed")
    return task.result()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, request: Request
) -> dict[str, Any] | StreamingResponse:
    """OpenAI chat completions, streamed or whole."""
    model = await model_for(request, body.model)
    media = await request_media(chat_media(body), model, request.app.state.media)
    job = await asyncio.to_thread(
        prepare_chat,
        model,
        body,
        model.n_predict,
        model.tool_call_parser,
        model.reasoning_parser,
        media,
    )
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await unless_disconnected(request, event_stream(chat_chunks(job, include_usage)))
    return await unless_disconnected(request, chat_completion(job))


@router.post("/chat/completions/input_tokens")
async def input_tokens(body: ChatCompletionRequest, request: Request) -> dict[str, Any]:
    """How many prompt tokens a chat request would take."""
    model = await model_for(request, body.model)
    return await asyncio.to_thread(count_input_tokens, model, body, model.tool_call_parser)


@router.post("/completions", response_model=None)
async def completions(
    body: CompletionRequest, request: Request
) -> dict[str, Any] | StreamingResponse:
    """OpenAI text completions, streamed or whole."""
    model = await model_for(request, body.model)
    job = await asyncio.to_thread(prepare_completion, model, body, model.n_predict)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await unless_disconnected(
            request, event_stream(completion_chunks(job, include_usage))
        )
    return await unless_disconnected(request, completion(job))
