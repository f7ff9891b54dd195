"""Running one text generation through a model's engine, from the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mlxcel.engine.scheduler import RequestHandle
from mlxcel.engine.types import (
    EngineError,
    SamplingParams,
    TextGenerator,
    TokenEvent,
    TokenLogprob,
)
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.common import SamplingFields
from mlxcel.serving.errors import APIError, invalid_request
from mlxcel.serving.sampling import sampling_params

logger = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    """An OpenAI-style object id."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@dataclass
class Generation:
    """One prompt on one model with resolved sampling: what a route asks the engine for.

    `index` is the choice's index in the answer; `prompt_index` which prompt it continues.
    """

    model: LoadedModel
    request_id: str
    prompt: list[int]
    params: SamplingParams
    created: int = field(default_factory=lambda: int(time.time()))
    index: int = 0
    prompt_index: int = 0
    constraint_param: str | None = None
    """The request field a grammar or schema came from, named if the engine refuses it."""


@dataclass
class Outcome:
    """A finished generation, collected."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_reason: str | None = None
    stop_word: str | None = None
    cached_tokens: int = 0


def check_vocabulary(generator: TextGenerator, tokens: Sequence[int], param: str) -> None:
    """400 naming `param` unless every id is in the vocabulary (llama.cpp aborts on others)."""
    n_vocab = generator.n_vocab
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise invalid_request(
            f"token id {bad} is not in the vocabulary (ids run from 0 to {n_vocab - 1})", param
        )


def prepare(
    model: LoadedModel,
    request_id: str,
    prompt: list[int],
    request: SamplingFields,
    token_limit: int | None,
    n_predict: int,
    prompt_param: str = "prompt",
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
            prompt_param,
            "context_length_exceeded",
        )
    check_vocabulary(model.generator, prompt, "prompt")
    check_vocabulary(model.generator, request.token_ids_in(), "logit_bias")
    params = sampling_params(
        request,
        token_limit,
        defaults=model.defaults,
        n_predict=n_predict,
        room=n_ctx - len(prompt),
        n_ctx=n_ctx,
    )
    constraint = _constraint_param(request, params)
    if request.user or request.safety_identifier:
        who = request.safety_identifier or request.user
        logger.info("[%s] user=%s", request_id, who)
    return Generation(model, request_id, prompt, params, constraint_param=constraint)


def _constraint_param(request: SamplingFields, params: SamplingParams) -> str | None:
    """The field a request's grammar or schema came from."""
    if params.grammar is not None:
        return "grammar"
    return request.output_format()[1] if params.json_schema is not None else None


def prepare_choices(
    model: LoadedModel,
    request_id: str,
    prompts: list[list[int]],
    request: SamplingFields,
    token_limit: int | None,
    n_predict: int,
    prompt_param: str = "prompt",
) -> list[Generation]:
    """`n` generations per prompt, indexed as OpenAI does; a set seed gives each its own."""
    generations = []
    for prompt_index, prompt in enumerate(prompts):
        base = prepare(model, request_id, prompt, request, token_limit, n_predict, prompt_param)
        for i in range(request.n):
            seed = None if base.params.seed is None else base.params.seed + i
            generations.append(
                replace(
                    base,
                    params=replace(base.params, seed=seed),
                    index=prompt_index * request.n + i,
                    prompt_index=prompt_index,
                )
            )
    return generations


def _engine_error(error: EngineError, constraint_param: str | None) -> APIError:
    if error.code == "server_busy":
        return APIError(
            503, str(error), type="server_busy", code="server_busy", headers={"Retry-After": "1"}
        )
    if error.code == "invalid_grammar":
        return invalid_request(str(error), constraint_param, error.code)
    if error.code == "unsupported_field":
        return invalid_request(str(error), code=error.code)
    return APIError(500, str(error), code=error.code)


def start(generation: Generation) -> RequestHandle:
    """Queue a generation in its model's engine; a full queue is a 503 right away."""
    try:
        return generation.model.scheduler.submit(
            generation.request_id, generation.prompt, generation.params
        )
    except EngineError as exc:
        raise _engine_error(exc, generation.constraint_param) from exc


async def events(handle: RequestHandle, generation: Generation) -> AsyncIterator[TokenEvent]:
    """A started generation's events; leaving early cancels it in the engine."""
    try:
        async for event in handle.events():
            if event.error is not None:
                raise _engine_error(event.error, generation.constraint_param)
            yield event
    finally:
        handle.cancel()


async def collect(generation: Generation) -> Outcome:
    """Run a generation to its end."""
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    async for event in events(start(generation), generation):
        parts.append(event.text)
        logprobs.extend(event.logprobs)
        if event.finish_reason is not None:
            logger.info(
                "[%s] choice %d done: %d prompt + %d completion tokens, %s",
                generation.request_id,
                generation.index,
                event.prompt_tokens,
                event.completion_tokens,
                event.stop_reason,
            )
            return Outcome(
                "".join(parts),
                event.finish_reason,
                event.prompt_tokens,
                event.completion_tokens,
                logprobs,
                event.stop_reason,
                event.stop_word,
                event.cached_tokens,
            )
    raise APIError(500, "generation ended without a finish reason")


async def collect_all(generations: list[Generation]) -> list[Outcome]:
    """Run every choice at once; the engine batches them when it has slots."""
    return list(await asyncio.gather(*(collect(g) for g in generations)))


async def _pump(
    index: int,
    handle: RequestHandle,
    generation: Generation,
    queue: asyncio.Queue[tuple[int, TokenEvent | BaseException]],
) -> None:
    try:
        async for event in events(handle, generation):
            queue.put_nowait((index, event))
    except BaseException as exc:
        queue.put_nowait((index, exc))
        raise


async def stream_all(generations: list[Generation]) -> AsyncIterator[tuple[int, TokenEvent]]:
    """Every choice's events as they come, tagged with the choice's position in the list."""
    handles: list[RequestHandle] = []
    try:
        for generation in generations:
            handles.append(start(generation))
    except APIError:
        for handle in handles:
            handle.cancel()
        raise
    if len(handles) == 1:
        # One choice (the common case) needs no merging: no task and no extra queue hop.
        async for event in events(handles[0], generations[0]):
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, TokenEvent | BaseException]] = asyncio.Queue()
    tasks = [
        asyncio.ensure_future(_pump(i, h, g, queue))
        for i, (h, g) in enumerate(zip(handles, generations, strict=True))
    ]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield index, item
            running -= item.finish_reason is not None
    finally:
        for task in tasks:
            task.cancel()


def total_usage(
    generations: list[Generation], completion_tokens: int, cached: dict[int, int]
) -> dict[str, Any]:
    """Usage for a whole answer: each prompt counted once, every choice's output summed.

    `cached` maps a choice's position to the prompt tokens it found in the prefix cache.
    """
    prompts = {g.prompt_index: len(g.prompt) for g in generations}
    per_prompt = {generations[i].prompt_index: n for i, n in cached.items()}
    return usage(sum(prompts.values()), completion_tokens, sum(per_prompt.values()))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """The OpenAI usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_chunk(chunk: dict[str, Any], usage_: dict[str, Any]) -> dict[str, Any]:
    """A stream's last chunk when the client asked for usage: no choices, just usage."""
    return {**chunk, "choices": [], "usage": usage_}
