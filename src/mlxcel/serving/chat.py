"""Chat completions: messages -> prompt -> engine -> OpenAI chat objects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlxcel.api.schemas.chat import ChatCompletionRequest
from mlxcel.engine.registry import LoadedModel
from mlxcel.serving.chat_template import render_chat
from mlxcel.serving.logprobs import chat_logprobs
from mlxcel.serving.text import (
    Generation,
    collect_all,
    new_id,
    prepare_choices,
    stream_all,
    total_usage,
    usage_chunk,
)


def chat_prompt(model: LoadedModel, request: ChatCompletionRequest) -> list[int]:
    """The prompt tokens for a chat request, through the model's own template."""
    generator = model.generator
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    text = render_chat(
        generator.chat_template,
        messages,
        add_generation_prompt=request.add_generation_prompt,
        extra=request.chat_template_kwargs,
    )
    if request.continue_final_message:
        # Cut the template's end-of-turn after the last message so the model carries on it.
        last = messages[-1]["content"]
        text = text[: text.rindex(last) + len(last)] if last in text else text
    return generator.tokenize(text, add_special=generator.add_bos, parse_special=True)


def prepare_chat(
    model: LoadedModel, request: ChatCompletionRequest, n_predict: int
) -> list[Generation]:
    """One generation per requested choice, sampling resolved."""
    prompt = chat_prompt(model, request)
    return prepare_choices(
        model, new_id("chatcmpl"), [prompt], request, request.token_limit(), n_predict, "messages"
    )


async def chat_completion(generations: list[Generation]) -> dict[str, Any]:
    """The whole answer as one chat.completion object."""
    outcomes = await collect_all(generations)
    first = generations[0]
    wants_logprobs = first.params.logprobs is not None
    return {
        "id": first.request_id,
        "object": "chat.completion",
        "created": first.created,
        "model": first.model.name,
        "choices": [
            {
                "index": g.index,
                "message": {"role": "assistant", "content": o.text},
                "logprobs": chat_logprobs(o.logprobs) if wants_logprobs else None,
                "finish_reason": o.finish_reason,
            }
            for g, o in zip(generations, outcomes, strict=True)
        ],
        "usage": total_usage(
            generations,
            sum(o.completion_tokens for o in outcomes),
            {i: o.cached_tokens for i, o in enumerate(outcomes)},
        ),
    }


def _chunk(
    generation: Generation,
    delta: dict[str, Any],
    finish: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": generation.request_id,
        "object": "chat.completion.chunk",
        "created": generation.created,
        "model": generation.model.name,
        "choices": [
            {
                "index": generation.index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        ],
    }


async def chat_chunks(
    generations: list[Generation], include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """chat.completion.chunk objects: each choice's role first, then text, then its finish."""
    stream = stream_all(generations)
    role_sent: set[int] = set()
    completion_tokens = 0
    cached: dict[int, int] = {}
    async for position, event in stream:
        generation = generations[position]
        if position not in role_sent:
            role_sent.add(position)
            yield _chunk(generation, {"role": "assistant", "content": ""}, None)
        logprobs = chat_logprobs(event.logprobs) if event.logprobs else None
        if event.text or logprobs:
            yield _chunk(generation, {"content": event.text}, None, logprobs)
        if event.finish_reason is not None:
            completion_tokens += event.completion_tokens
            cached[position] = event.cached_tokens
            yield _chunk(generation, {}, event.finish_reason)
    if include_usage:
        yield usage_chunk(
            _chunk(generations[0], {}, None), total_usage(generations, completion_tokens, cached)
        )
