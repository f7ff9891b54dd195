"""Text completions: prompt -> engine -> OpenAI text_completion objects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlxcel.api.schemas.completions import CompletionRequest
from mlxcel.engine.registry import LoadedModel
from mlxcel.serving.text import (
    Generation,
    collect,
    events,
    new_id,
    prepare,
    start,
    usage,
    usage_chunk,
)


def prepare_completion(
    model: LoadedModel, request: CompletionRequest, n_predict: int
) -> Generation:
    """Tokenize the prompt as the GGUF says and resolve sampling."""
    generator = model.generator
    prompt = generator.tokenize(request.prompt, add_special=generator.add_bos, parse_special=True)
    return prepare(model, new_id("cmpl"), prompt, request, request.token_limit(), n_predict)


def _object(
    generation: Generation, text: str, finish: str | None, usage_: dict[str, int] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": generation.request_id,
        "object": "text_completion",
        "created": generation.created,
        "model": generation.model.name,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


async def completion(generation: Generation) -> dict[str, Any]:
    """The whole answer as one text_completion object."""
    outcome = await collect(generation)
    return _object(
        generation,
        outcome.text,
        outcome.finish_reason,
        usage(outcome.prompt_tokens, outcome.completion_tokens),
    )


async def completion_chunks(
    generation: Generation, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """text_completion chunks: text as it comes, then the finish reason."""
    async for event in events(start(generation)):
        if event.text:
            yield _object(generation, event.text, None, None)
        if event.finish_reason is not None:
            yield _object(generation, "", event.finish_reason, None)
            if include_usage:
                yield usage_chunk(_object(generation, "", None, None), event)
