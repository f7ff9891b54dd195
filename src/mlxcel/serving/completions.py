"""Text completions: prompt(s) -> engine -> OpenAI text_completion objects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.completions import CompletionRequest
from mlxcel.serving.infill import answer_limit, fim_layout, infill_prompt
from mlxcel.serving.logprobs import completion_logprobs
from mlxcel.serving.text import (
    Generation,
    collect_all,
    new_id,
    prepare_choices,
    stream_all,
    total_usage,
    usage_chunk,
)


@dataclass
class CompletionJob:
    """A completion request's generations, and the prompt text `echo` repeats."""

    generations: list[Generation]
    echoes: list[str]
    wants_logprobs: bool


def prepare_completion(
    model: LoadedModel, request: CompletionRequest, n_predict: int
) -> CompletionJob:
    """Tokenize each prompt as the GGUF says (token-id prompts pass through) and plan choices;
    with a `suffix`, each prompt is the code before a gap the model fills in (FIM)."""
    generator = model.generator
    if request.suffix:
        prompts = _fill_in_the_middle(model, request, n_predict)
    else:
        prompts = [
            generator.tokenize(p, add_special=generator.add_bos, parse_special=True)
            if isinstance(p, str)
            else list(p)
            for p in request.prompts()
        ]
    generations = prepare_choices(
        model, new_id("cmpl"), prompts, request, request.token_limit(), n_predict
    )
    echoes = [""] * len(prompts)
    if request.echo:
        echoes = [
            p
            if isinstance(p, str)
            else b"".join(map(generator.token_bytes, p)).decode(errors="replace")
            for p in request.prompts()
        ]
    return CompletionJob(generations, echoes, request.logprobs is not None)


def _fill_in_the_middle(
    model: LoadedModel, request: CompletionRequest, n_predict: int
) -> list[list[int]]:
    """Each prompt as the prefix of a FIM prompt whose suffix is the request's."""
    generator = model.generator
    fim = fim_layout(model, "suffix")
    suffix = generator.tokenize(request.suffix or "", add_special=False, parse_special=False)
    return [
        infill_prompt(
            generator,
            fim,
            generator.tokenize(p, add_special=False, parse_special=False)
            if isinstance(p, str)
            else list(p),
            suffix,
            limit=answer_limit(request.token_limit(), n_predict),
        )
        for p in request.prompts()
    ]


def _object(
    generation: Generation, choice: dict[str, Any], usage_: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": generation.request_id,
        "object": "text_completion",
        "created": generation.created,
        "model": generation.model.name,
        "choices": [{"index": generation.index, "logprobs": None, **choice}],
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


async def completion(job: CompletionJob) -> dict[str, Any]:
    """The whole answer as one text_completion object."""
    outcomes = await collect_all(job.generations)
    choices = []
    for generation, outcome in zip(job.generations, outcomes, strict=True):
        echo = job.echoes[generation.prompt_index]
        logprobs = completion_logprobs(outcome.logprobs, len(echo)) if job.wants_logprobs else None
        choices.append(
            {
                "index": generation.index,
                "text": echo + outcome.text,
                "logprobs": logprobs,
                "finish_reason": outcome.finish_reason,
            }
        )
    first = job.generations[0]
    body = _object(
        first,
        {},
        total_usage(
            job.generations,
            sum(o.completion_tokens for o in outcomes),
            {i: o.cached_tokens for i, o in enumerate(outcomes)},
        ),
    )
    body["choices"] = choices
    return body


async def completion_chunks(
    job: CompletionJob, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """text_completion chunks: echo first, then text as it comes, then each finish reason."""
    offsets = {i: 0 for i in range(len(job.generations))}
    completion_tokens = 0
    cached: dict[int, int] = {}
    async for position, event in stream_all(job.generations):
        generation = job.generations[position]
        text = event.text
        if offsets[position] == 0:
            text = job.echoes[generation.prompt_index] + text
        logprobs = None
        if job.wants_logprobs:
            start = offsets[position] + len(text) - len(event.text)
            logprobs = completion_logprobs(event.logprobs, start)
        offsets[position] += len(text)
        if text or event.logprobs:
            yield _object(generation, {"text": text, "logprobs": logprobs, "finish_reason": None})
        if event.finish_reason is not None:
            completion_tokens += event.completion_tokens
            cached[position] = event.cached_tokens
            yield _object(generation, {"text": "", "finish_reason": event.finish_reason})
    if include_usage:
        usage_ = total_usage(job.generations, completion_tokens, cached)
        yield usage_chunk(_object(job.generations[0], {}), usage_)
