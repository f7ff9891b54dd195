"""llama-server's own routes: /tokenize, /detokenize, /apply-template, /props, /completion."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.routes.text import unless_disconnected
from mlxcel.api.sse import DONE, event_stream
from mlxcel.api.state import model_for
from mlxcel.backends.group import describe
from mlxcel.media.audio import SentMedia
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.infill import InfillRequest
from mlxcel.protocol.native import (
    DetokenizeRequest,
    MultimodalPrompt,
    NativeCompletionRequest,
    TokenizeRequest,
)
from mlxcel.serving import native
from mlxcel.serving.infill import prepare_infill
from mlxcel.serving.vision import native_media, request_media

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    """Text to token ids, optionally with each token's piece."""
    model = await model_for(request, body.model)
    return await asyncio.to_thread(native.tokenize, model, body)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, str]:
    """Token ids to text."""
    model = await model_for(request, body.model)
    return await asyncio.to_thread(native.detokenize, model, body)


@router.post("/apply-template")
async def apply_template(body: ChatCompletionRequest, request: Request) -> dict[str, str]:
    """A chat request to the prompt the model would see, without generating."""
    model = await model_for(request, body.model)
    return await asyncio.to_thread(native.apply_template, model, body, model.tool_call_parser)


@router.get("/props")
async def props(request: Request, model: str | None = None) -> dict[str, Any]:
    """Server properties and the generation defaults, in llama-server's shape."""
    loaded = await model_for(request, model)
    answer = native.props(loaded, loaded.n_predict)
    cache = answer["prompt_cache"] = await asyncio.to_thread(loaded.scheduler.prompt_cache)
    if loaded.config.distributed is not None:
        answer["distributed"] = describe(loaded.config.distributed)
    if not request.app.state.api_keys:
        # Only the file's name on an open server (docs/security.md): not where it lives.
        answer["model_path"] = Path(answer["model_path"]).name
        if "disk" in cache:
            cache["disk"]["path"] = Path(cache["disk"]["path"]).name
    return answer


def _without_done(response: StreamingResponse) -> StreamingResponse:
    """llama-server ends a /completion stream with its final object, not `data: [DONE]`."""
    frames = response.body_iterator

    async def kept() -> AsyncIterator[str | bytes | memoryview]:
        async for frame in frames:
            if frame != DONE:
                yield frame

    response.body_iterator = kept()
    return response


@router.post("/completion", response_model=None)
async def completion(
    body: NativeCompletionRequest, request: Request
) -> dict[str, Any] | list[dict[str, Any]] | StreamingResponse:
    """llama-server's native completion, streamed or whole.

    llama-server also answers natively at /completions; here that path is OpenAI's, so that an
    OpenAI client whose base URL lacks /v1 works (see text.py).
    """
    model = await model_for(request, body.model)
    media: list[SentMedia] = []
    if isinstance(body.prompt, MultimodalPrompt):
        parts = native_media(body.prompt, model)
        media = await request_media(parts, model, request.app.state.media)
    prepared = await asyncio.to_thread(native.prepare_native, model, body, model.n_predict, media)
    return await _native_answer(request, prepared)


@router.post("/infill", response_model=None)
async def infill(
    body: InfillRequest, request: Request
) -> dict[str, Any] | list[dict[str, Any]] | StreamingResponse:
    """llama-server's code infill: the gap between input_prefix and input_suffix, filled."""
    model = await model_for(request, body.model)
    prepared = await asyncio.to_thread(prepare_infill, model, body, model.n_predict)
    return await _native_answer(request, prepared)


async def _native_answer(
    request: Request, prepared: native.NativeJob
) -> dict[str, Any] | list[dict[str, Any]] | StreamingResponse:
    if prepared.request.stream:
        stream = event_stream(native.native_chunks(prepared))
        return _without_done(await unless_disconnected(request, stream))
    return await unless_disconnected(request, native.native_completion(prepared))
