"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API.

Every failure on these routes, the API key and the body's validation included, answers in
Anthropic's error shape, {"type": "error", "error": {"type", "message"}}, with its status.
The `anthropic-version` header is accepted whatever it says: there is one version here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.errors import validation_error
from mlxcel.api.routes.text import unless_disconnected
from mlxcel.api.sse import typed_event_stream
from mlxcel.api.state import model_for
from mlxcel.protocol.anthropic import CountTokensRequest, MessagesRequest
from mlxcel.protocol.errors import APIError
from mlxcel.serving.anthropic import count_tokens, create_message, prepare_message
from mlxcel.serving.anthropic_input import chat_request
from mlxcel.serving.anthropic_stream import message_events
from mlxcel.serving.vision import chat_media, request_media

logger = logging.getLogger(__name__)

# Anthropic's error types by HTTP status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(exc: APIError) -> dict[str, Any]:
    """An error in Anthropic's shape, streamed or as a body."""
    kind = _TYPES.get(exc.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def stream_error(exc: Exception, _: dict[str, Any]) -> dict[str, Any]:
    """The error event that ends a stream that failed after its headers."""
    if not isinstance(exc, APIError):
        exc = APIError(500, "internal server error")
    return anthropic_error(exc)


class AnthropicRoute(CheckedJsonRoute):
    """A route whose errors, from its dependencies and body validation on, are Anthropic's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                error = validation_error(exc)
            except APIError as exc:
                error = exc
            except Exception:
                logger.exception("unhandled error on %s %s", request.method, request.url.path)
                error = APIError(500, "internal server error")
            return JSONResponse(anthropic_error(error), error.status, headers=error.headers)

        return route


router = APIRouter(route_class=AnthropicRoute, dependencies=[Depends(require_api_key)])


@router.post("/v1/messages", response_model=None)
async def messages(body: MessagesRequest, request: Request) -> dict[str, Any] | StreamingResponse:
    """A message, streamed as Anthropic's events or whole."""
    model = await model_for(request, body.model)
    media = await request_media(chat_media(chat_request(body)), model, request.app.state.media)
    job = await asyncio.to_thread(
        prepare_message,
        model,
        body,
        model.n_predict,
        model.tool_call_parser,
        model.reasoning_parser,
        media,
    )
    if body.stream:
        stream = typed_event_stream(message_events(job), job.message_id, stream_error)
        return await unless_disconnected(request, stream)
    return await unless_disconnected(request, create_message(job))


@router.post("/v1/messages/count_tokens")
async def count(body: CountTokensRequest, request: Request) -> dict[str, int]:
    """How many input tokens a message request would take."""
    model = await model_for(request, body.model)
    media = await request_media(chat_media(chat_request(body)), model, request.app.state.media)
    return await asyncio.to_thread(count_tokens, model, body, model.tool_call_parser, media)
