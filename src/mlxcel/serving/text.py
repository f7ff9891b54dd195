"""Running one text generation through a model's engine, from the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

from mlxcel.engine.context import CONTEXT_LENGTH_EXCEEDED, context_overflow
from mlxcel.engine.handle import RequestHandle
from mlxcel.engine.types import EngineError, SamplingParams, TokenEvent, TokenLogprob
from mlxcel.logs import current_request
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.common import SamplingFields
from mlxcel.protocol.errors import (
    APIError,
    invalid_request,
    model_unavailable,
    refused,
    server_busy,
    shutting_down,
)
from mlxcel.serving.adapters import request_adapters
from mlxcel.serving.sampling import logit_bias, sampling_params
from mlxcel.serving.tokens import check_vocabulary, detokenize_ids
from mlxcel.wire.facts import MEDIA_PROMPT_REFUSED, MODEL_UNAVAILABLE, MediaPrompt

logger = logging.getLogger(__name__)


# The package whose version names each backend's engine in the fingerprint.
_ENGINE_PACKAGES = {"llama.cpp": "llama-cpp-python", "mlx": "mlx", "transformers": "transformers"}


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


@lru_cache(maxsize=4)
def system_fingerprint(backend: str) -> str:
    """OpenAI's `system_fingerprint`: this server's version and its engine's, which together
    decide what a seed reproduces."""
    engine = _installed(_ENGINE_PACKAGES[backend])
    return f"mlxcel-{_installed('mlxcel')}-{backend}-{engine}"


def new_id(prefix: str) -> str:
    """An OpenAI-style object id."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@dataclass
class Generation:
    """One prompt on one model with resolved sampling: what a route asks the engine for.

    `index` is the choice's index in the answer; `prompt_index` which prompt it continues.
    A prompt with images or audio is a `media_prompt`, and `prompt` is empty: the model's
    worker lays it out into tokens when the generation starts.
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
    media_prompt: MediaPrompt | None = None
    prompt_param: str = "prompt"
    """The request field the prompt came from, named if the worker refuses its layout."""


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
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    slot: int = -1
    draft_tokens: int = 0
    draft_accepted: int = 0


def prepare(
    model: LoadedModel,
    request_id: str,
    prompt: list[int] | MediaPrompt,
    request: SamplingFields,
    token_limit: int | None,
    n_predict: int,
    prompt_param: str = "prompt",
) -> Generation:
    """Check the prompt fits the context and resolve sampling. A media prompt's tokens are
    not known here: its worker checks them, and holds the answer to the room they leave."""
    unsupported = request.unsupported()
    if unsupported is not None:
        raise invalid_request(
            f"'{unsupported}' is not supported by this server yet",
            unsupported,
            "unsupported_field",
        )
    generator = model.generator
    n_ctx = generator.n_ctx_seq
    media, tokens = (prompt, []) if isinstance(prompt, MediaPrompt) else (None, prompt)
    if media is None:
        if not tokens:
            raise invalid_request("the prompt is empty", "prompt")
        overflow = context_overflow(len(tokens), n_ctx)
        if overflow is not None:
            raise invalid_request(overflow, prompt_param, CONTEXT_LENGTH_EXCEEDED)
        check_vocabulary(generator, tokens, "prompt")
    bias = logit_bias(request, generator)
    check_vocabulary(generator, [token for token, _ in bias], "logit_bias")
    check_vocabulary(generator, request.stop_token_ids or [], "stop_token_ids")
    if request.id_slot >= generator.n_slots:
        raise invalid_request(
            f"id_slot {request.id_slot} does not exist: the server has {generator.n_slots} "
            "slot(s), numbered from 0 (-1: any)",
            "id_slot",
        )
    params = sampling_params(
        request,
        token_limit,
        defaults=model.defaults,
        n_predict=n_predict,
        room=n_ctx - len(tokens) if media is None else n_ctx - 1,
        n_ctx=n_ctx,
        bias=bias,
    )
    adapters = request_adapters(model.adapters, request.lora, request.model, model.names)
    params = replace(params, adapters=adapters)
    constraint = _constraint_param(request, params)
    if request.user or request.safety_identifier:
        logger.info("%s: user=%s", request_id, request.safety_identifier or request.user)
    if logger.isEnabledFor(logging.DEBUG):
        # Prompts may be private: only an operator who asked for debug lines sees them.
        text = detokenize_ids(generator, tokens) if media is None else media.text
        logger.debug("%s: prompt %r", request_id, text)
    return Generation(
        model,
        request_id,
        tokens,
        params,
        constraint_param=constraint,
        media_prompt=media,
        prompt_param=prompt_param,
    )


def _constraint_param(request: SamplingFields, params: SamplingParams) -> str | None:
    """The field a request's grammar or schema came from."""
    if params.grammar is not None:
        return "grammar"
    return request.output_format()[1] if params.json_schema is not None else None


def prepare_choices(
    model: LoadedModel,
    request_id: str,
    prompts: Sequence[list[int] | MediaPrompt],
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


def _engine_error(error: EngineError, generation: Generation) -> APIError:
    if error.param is not None or error.code == MEDIA_PROMPT_REFUSED:
        return refused(error, generation.prompt_param)
    if error.code == CONTEXT_LENGTH_EXCEEDED:
        return invalid_request(str(error), generation.prompt_param, error.code)
    if error.code == MODEL_UNAVAILABLE:
        return model_unavailable(str(error))
    if error.code == "server_busy":
        return server_busy(str(error))
    if error.code == "shutting_down":
        return shutting_down(str(error))
    if error.code == "invalid_grammar":
        return invalid_request(str(error), generation.constraint_param, error.code)
    if error.code == "unsupported_field":
        return invalid_request(str(error), code=error.code)
    return APIError(500, str(error), code=error.code)


def start(generation: Generation) -> RequestHandle:
    """Queue a generation in its model's engine; a full queue is a 503 right away."""
    return start_all([generation])[0]


def start_all(generations: Sequence[Generation]) -> list[RequestHandle]:
    """Queue the generations of one request (all on one model, and all of one media prompt
    if any has one) whole, or refuse them whole with a 503: a request is never partly
    admitted."""
    first = generations[0]
    # The engine's lines about it carry the HTTP request's id, as every other line does.
    record = current_request()
    log_id = record.request_id if record is not None else first.request_id
    engine = first.model.scheduler
    try:
        if first.media_prompt is not None:
            params = [g.params for g in generations]
            return engine.submit_with_media(log_id, first.media_prompt, params)
        return engine.submit(log_id, [(g.prompt, g.params) for g in generations])
    except EngineError as exc:
        raise _engine_error(exc, first) from exc


async def events(handle: RequestHandle, generation: Generation) -> AsyncIterator[TokenEvent]:
    """A started generation's events; leaving early cancels it in the engine."""
    record = current_request()
    try:
        async for event in handle.events():
            if event.error is not None:
                raise _engine_error(event.error, generation)
            if record is not None:
                record.token()
                if event.finish_reason is not None:
                    record.finished(
                        generation.prompt_index,
                        event.prompt_tokens,
                        event.completion_tokens,
                        event.cached_tokens,
                    )
            yield event
    finally:
        handle.cancel()


def finished(
    text: str,
    event: TokenEvent,
    logprobs: Sequence[TokenLogprob] = (),
    token_ids: Sequence[int] = (),
) -> Outcome:
    """What a generation came to: everything it generated, and its final event."""
    return Outcome(
        text,
        event.finish_reason or "",
        event.prompt_tokens,
        event.completion_tokens,
        list(logprobs),
        event.stop_reason,
        event.stop_word,
        event.cached_tokens,
        event.prompt_ms,
        event.predicted_ms,
        list(token_ids),
        event.slot,
        event.draft_tokens,
        event.draft_accepted,
    )


async def _collect(handle: RequestHandle, generation: Generation) -> Outcome:
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    token_ids: list[int] = []
    async for event in events(handle, generation):
        parts.append(event.text)
        logprobs.extend(event.logprobs)
        token_ids.extend(event.token_ids)
        if event.finish_reason is not None:
            return finished("".join(parts), event, logprobs, token_ids)
    raise APIError(500, "generation ended without a finish reason")


async def collect(generation: Generation) -> Outcome:
    """Run a generation to its end."""
    return await _collect(start(generation), generation)


async def collect_all(generations: list[Generation]) -> list[Outcome]:
    """Run every choice at once (the engine batches them when it has slots); when one fails,
    or the caller goes away, the others stop too."""
    handles = start_all(generations)
    tasks = [
        asyncio.ensure_future(_collect(h, g)) for h, g in zip(handles, generations, strict=True)
    ]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        for handle in handles:
            handle.cancel()


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
    """Every choice's events as they come, tagged with the choice's position in the list;
    when one fails, or the caller stops reading, the others stop too."""
    handles = start_all(generations)
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
        for handle in handles:
            handle.cancel()
