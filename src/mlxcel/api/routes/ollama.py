"""Ollama's generation routes: POST /api/chat, /api/generate, /api/embed and /api/embeddings.

Every failure on Ollama's routes, the API key and body validation included, answers in
Ollama's error shape, {"error": "..."}, with its status; a stream that fails after its first
line ends with such a line. Streams are NDJSON: one JSON object a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.errors import validation_error
from mlxcel.api.routes.text import unless_disconnected
from mlxcel.api.state import encoder_for, entry_for, invalid_model, loaded_registry, model_for
from mlxcel.engine.types import EngineError
from mlxcel.models.encoders import EmbeddingModel
from mlxcel.models.entry import ModelBusy, ModelEntry
from mlxcel.models.loaded import Capability
from mlxcel.protocol.embeddings import EmbeddingRequest
from mlxcel.protocol.errors import APIError, unavailable_now
from mlxcel.protocol.ollama import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest
from mlxcel.serving.embeddings import embeddings
from mlxcel.serving.ollama import (
    OllamaJob,
    empty_answer,
    ollama_answer,
    ollama_lines,
    prepare_chat_job,
    prepare_generate_job,
)
from mlxcel.serving.ollama_input import chat_request, generate_chat
from mlxcel.serving.vision import chat_media, request_media

logger = logging.getLogger(__name__)

LATEST = ":latest"


def error_text(exc: APIError) -> str:
    """The message, naming the field it is about when it does not already (Ollama's shape
    has no `param`)."""
    if exc.param and exc.param not in exc.message:
        return f"'{exc.param}': {exc.message}"
    return exc.message


def ollama_error(exc: APIError) -> JSONResponse:
    """An error in Ollama's shape."""
    return JSONResponse({"error": error_text(exc)}, exc.status, headers=exc.headers)


class OllamaRoute(CheckedJsonRoute):
    """A route whose errors, from its dependencies and body validation on, are Ollama's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return ollama_error(validation_error(exc))
            except APIError as exc:
                return ollama_error(exc)
            except Exception:
                logger.exception("unhandled error on %s %s", request.method, request.url.path)
                return ollama_error(APIError(500, "internal server error"))

        return route


router = APIRouter(route_class=OllamaRoute, dependencies=[Depends(require_api_key)])


def served_name(request: Request, name: str) -> str:
    """The served name an Ollama name means: `name:latest` is `name` when only that is
    served (aliases and the one-model fallback apply after, as on every route)."""
    if not name.endswith(LATEST):
        return name
    entries = loaded_registry(request).entries()
    if any(entry.answers_to(name) for entry in entries):
        return name
    return name[: -len(LATEST)]


def ollama_entry(
    request: Request, name: str, keep_alive: float | None, capability: Capability
) -> ModelEntry:
    """The model a request names; its keep_alive (None: the configured idle timeout) holds
    from now until the next request sets another."""
    entry = entry_for(request, served_name(request, name), capability)
    entry.keep_alive = keep_alive
    return entry


def _line(item: dict[str, Any]) -> bytes:
    return json.dumps(item, ensure_ascii=False).encode() + b"\n"


def _failure(exc: Exception) -> str:
    """What the {"error"} line that ends a failed stream says."""
    known = unavailable_now(exc) if isinstance(exc, EngineError) else exc
    if isinstance(known, APIError):
        logger.warning("stream failed: %s", known.message)
        return error_text(known)
    logger.exception("stream failed")
    return "internal server error"


async def ndjson_stream(lines: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    """An NDJSON response; the first line comes before the headers, so an early failure still
    gets its status, and a later one ends the stream with an {"error"} line."""
    first = await anext(lines)

    async def body() -> AsyncIterator[bytes]:
        yield _line(first)
        try:
            async for item in lines:
                yield _line(item)
        except Exception as exc:
            yield _line({"error": _failure(exc)})

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="application/x-ndjson", headers=headers)


async def _load_or_unload(
    request: Request, entry: ModelEntry, name: str, chat: bool, keep_alive: float | None
) -> dict[str, Any]:
    """A request with nothing to generate: keep_alive 0 unloads the model now (or once its
    requests finish), anything else loads it."""
    registry = loaded_registry(request)
    if keep_alive == 0:
        # Busy: its idle timeout is now ~0, so it goes once its requests are done.
        with contextlib.suppress(ModelBusy):
            await registry.unload(entry, "keep_alive 0")
        return empty_answer(name, chat, "unload")
    await model_for(request, entry.name)
    return empty_answer(name, chat, "load")


async def _answer(request: Request, job: OllamaJob, stream: bool) -> Any:
    if stream:
        return await unless_disconnected(request, ndjson_stream(ollama_lines(job)))
    return await unless_disconnected(request, ollama_answer(job))


@router.post("/api/chat", response_model=None)
async def chat(body: ChatRequest, request: Request) -> Any:
    """A chat answer, streamed as NDJSON by default."""
    started = time.perf_counter()
    entry = ollama_entry(request, body.model, body.keep_alive, "text")
    if not body.messages:
        return await _load_or_unload(request, entry, body.model, True, body.keep_alive)
    loading = entry.state != "loaded"
    model = await model_for(request, entry.name)
    load_ns = int((time.perf_counter() - started) * 1e9) if loading else 0
    chat_body = chat_request(body)
    media = await request_media(chat_media(chat_body), model, request.app.state.media)
    job = await asyncio.to_thread(prepare_chat_job, model, body, chat_body, media, started)
    job.load_ns = load_ns
    return await _answer(request, job, body.stream)


@router.post("/api/generate", response_model=None)
async def generate(body: GenerateRequest, request: Request) -> Any:
    """A completion of the prompt (through the chat template unless raw), streamed as NDJSON
    by default."""
    started = time.perf_counter()
    entry = ollama_entry(request, body.model, body.keep_alive, "text")
    if not body.prompt and not body.suffix and not body.images:
        return await _load_or_unload(request, entry, body.model, False, body.keep_alive)
    loading = entry.state != "loaded"
    model = await model_for(request, entry.name)
    load_ns = int((time.perf_counter() - started) * 1e9) if loading else 0
    media = []
    if body.images and not body.raw and not body.suffix:
        media = await request_media(chat_media(generate_chat(body)), model, request.app.state.media)
    job = await asyncio.to_thread(prepare_generate_job, model, body, media, started)
    job.load_ns = load_ns
    return await _answer(request, job, body.stream)


async def _embedder(request: Request, name: str, keep_alive: float | None) -> EmbeddingModel:
    entry = ollama_entry(request, name, keep_alive, "embedding")
    loaded = await encoder_for(request, entry.name, "embedding")
    if not isinstance(loaded.encoder, EmbeddingModel):
        raise invalid_model(f"the model '{loaded.name}' does not embed")
    return loaded.encoder


@router.post("/api/embed")
async def embed(body: EmbedRequest, request: Request) -> dict[str, Any]:
    """Embeddings of a text or a list of texts: {"embeddings": [[...], ...]}."""
    started = time.perf_counter()
    model = await _embedder(request, body.model, body.keep_alive)
    texts: str | list[Any] = body.input if isinstance(body.input, str) else list(body.input)
    openai = EmbeddingRequest(input=texts, dimensions=body.dimensions, truncate=body.truncate)
    state = request.app.state
    answer = await embeddings(model, body.model, openai, state.encoder_limits, state.media)
    return {
        "model": body.model,
        "embeddings": [item["embedding"] for item in answer["data"]],
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": answer["usage"]["prompt_tokens"],
    }


@router.post("/api/embeddings")
async def embeddings_route(body: EmbeddingsRequest, request: Request) -> dict[str, Any]:
    """The older route: one prompt, {"embedding": [...]}."""
    model = await _embedder(request, body.model, body.keep_alive)
    if not body.prompt:
        return {"embedding": []}
    openai = EmbeddingRequest(input=body.prompt, truncate=True)
    state = request.app.state
    answer = await embeddings(model, body.model, openai, state.encoder_limits, state.media)
    return {"embedding": answer["data"][0]["embedding"]}
