"""Chat completions: messages -> prompt -> engine -> OpenAI chat objects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlxcel.api.schemas.chat import ChatCompletionRequest
from mlxcel.engine.registry import LoadedModel
from mlxcel.serving.chat_template import render_chat
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


def prepare_chat(model: LoadedModel, request: ChatCompletionRequest, n_predict: int) -> Generation:
    """Render the chat template, tokenize as the GGUF says, and resolve sampling."""
    generator = model.generator
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    prompt_text = render_chat(generator.chat_template, messages)
    prompt = generator.tokenize(prompt_text, add_special=generator.add_bos, parse_special=True)
    return prepare(model, new_id("chatcmpl"), prompt, request, request.token_limit(), n_predict)


async def chat_completion(generation: Generation) -> dict[str, Any]:
    """The whole answer as one chat.completion object."""
    outcome = await collect(generation)
    return {
        "id": generation.request_id,
        "object": "chat.completion",
        "created": generation.created,
        "model": generation.model.name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outcome.text},
                "logprobs": None,
                "finish_reason": outcome.finish_reason,
            }
        ],
        "usage": usage(outcome.prompt_tokens, outcome.completion_tokens),
    }


def _chunk(generation: Generation, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": generation.request_id,
        "object": "chat.completion.chunk",
        "created": generation.created,
        "model": generation.model.name,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


async def chat_chunks(generation: Generation, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    """chat.completion.chunk objects: the role first, then text, then the finish reason."""
    handle = start(generation)
    yield _chunk(generation, {"role": "assistant", "content": ""}, None)
    async for event in events(handle):
        if event.text:
            yield _chunk(generation, {"content": event.text}, None)
        if event.finish_reason is not None:
            yield _chunk(generation, {}, event.finish_reason)
            if include_usage:
                yield usage_chunk(_chunk(generation, {}, None), event)
