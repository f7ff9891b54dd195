"""Running one text generation through a model's engine, from the event loop."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from mlxcel.api.schemas.common import SamplingFields
from mlxcel.engine.registry import LoadedModel
from mlxcel.engine.scheduler import RequestHandle
from mlxcel.engine.types import EngineError, SamplingParams, TokenEvent
from mlxcel.serving.errors import APIError, invalid_request
from mlxcel.serving.sampling import sampling_params

logger = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    """An OpenAI-style object id."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@dataclass
class Generation:
    """One prompt on one model with resolved sampling: what a route asks the engine for."""

    model: LoadedModel
    request_id: str
    prompt: list[int]
    params: SamplingParams
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Outcome:
    """A finished generation, collected."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def prepare(
    model: LoadedModel,
    request_id: str,
    prompt: list[int],
    request: SamplingFields,
    token_limit: int | None,
    n_predict: int,
) -> Generation:
    """Check the prompt fits the context and resolve sampling."""
    unsupported = request.unsupported()
    if unsupported is not None:
        raise invalid_request(
            f"'{unsupported}' is not supported by this server yet",
            unsupported,
            "unsupported_field",
        )
    n_ctx = model.generator.n_ctx_seq
    if not prompt:
        raise invalid_request("the prompt is empty", "prompt")
    if len(prompt) >= n_ctx:
        raise invalid_request(
            f"the prompt has {len(prompt)} tokens but the context holds {n_ctx} "
            "(including the answer); shorten it or start the server with a larger -c",
            "messages",
            "context_length_exceeded",
        )
    params = sampling_params(
        request, token_limit, n_predict=n_predict, room=n_ctx - len(prompt), n_ctx=n_ctx
    )
    if request.user:
        logger.info("[%s] user=%s", request_id, request.user)
    return Generation(model, request_id, prompt, params)


def _engine_error(error: EngineError) -> APIError:
    if error.code == "server_busy":
        return APIError(
            503, str(error), type="server_busy", code="server_busy", headers={"Retry-After": "1"}
        )
    return APIError(500, str(error), code=error.code)


def start(generation: Generation) -> RequestHandle:
    """Queue a generation in its model's engine; a full queue is a 503 right away."""
    try:
        return generation.model.scheduler.submit(
            generation.request_id, generation.prompt, generation.params
        )
    except EngineError as exc:
        raise _engine_error(exc) from exc


async def events(handle: RequestHandle) -> AsyncIterator[TokenEvent]:
    """A started generation's events; leaving early cancels it in the engine."""
    try:
        async for event in handle.events():
            if event.error is not None:
                raise _engine_error(event.error)
            yield event
    finally:
        handle.cancel()


async def collect(generation: Generation) -> Outcome:
    """Run a generation to its end."""
    parts: list[str] = []
    async for event in events(start(generation)):
        parts.append(event.text)
        if event.finish_reason is not None:
            logger.info(
                "[%s] done: %d prompt + %d completion tokens, %s",
                generation.request_id,
                event.prompt_tokens,
                event.completion_tokens,
                event.finish_reason,
            )
            return Outcome(
                "".join(parts), event.finish_reason, event.prompt_tokens, event.completion_tokens
            )
    raise APIError(500, "generation ended without a finish reason")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The OpenAI usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def usage_chunk(chunk: dict[str, Any], event: TokenEvent) -> dict[str, Any]:
    """A stream's last chunk when the client asked for usage: no choices, just usage."""
    return {**chunk, "choices": [], "usage": usage(event.prompt_tokens, event.completion_tokens)}
