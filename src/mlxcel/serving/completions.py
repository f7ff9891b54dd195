"""Text completions: prompt(s) -> engine -> OpenAI text_completion objects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mlxcel.engine.types import TokenEvent
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.completions import CompletionRequest
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.echo import ScoredPrompt, echoed_logprobs, score_prompts
from mlxcel.serving.infill import answer_limit, fim_layout, infill_prompt
from mlxcel.serving.text import (
    Generation,
    collect_all,
    new_id,
    prepare_choices,
    stream_all,
    system_fingerprint,
)
from mlxcel.serving.timings import answer_timings, progress_chunk, with_timings
from mlxcel.serving.tokens import tokenize_prompt
from mlxcel.serving.usage import total_usage, usage_chunk


@dataclass
class CompletionJob:
    """A completion request's generations, the prompt text `echo` repeats and, with
    `logprobs`, each prompt's scores (echo.py)."""

    generations: list[Generation]
    echoes: list[str]
    wants_logprobs: bool
    timings_per_token: bool = False
    scored: list[ScoredPrompt] | None = None

    def prompt_scores(self, generation: Generation) -> ScoredPrompt | None:
        """The scores of the prompt a generation continues, where it is echoed with them."""
        return None if self.scored is None else self.scored[generation.prompt_index]


def prepare_completion(
    model: LoadedModel, request: CompletionRequest, n_predict: int
) -> CompletionJob:
    """Tokenize each prompt as the GGUF says (token-id prompts pass through) and plan choices;
    with a `suffix`, each prompt is the code before a gap the model fills in (FIM)."""
    generator = model.generator
    texts = request.prompts()
    if request.suffix:
        prompts = _fill_in_the_middle(model, request, n_predict)
    else:
        prompts = [tokenize_prompt(generator, p) for p in texts]
    if not prompts:
        raise invalid_request("the prompt is empty", "prompt")
    generations = prepare_choices(
        model, new_id("cmpl"), prompts, request, request.token_limit(), n_predict
    )
    echoes = [""] * len(prompts)
    if request.echo:
        echoes = [
            text
            if isinstance(text, str)
            else b"".join(generator.token_pieces(tokenize_prompt(generator, text))).decode(
                errors="replace"
            )
            for text in texts
        ]
    top_n = generations[0].params.logprobs
    scored = None
    if request.echo and top_n is not None:
        if request.suffix:
            raise invalid_request("echo with logprobs cannot score a suffix's prompt", "suffix")
        scored = score_prompts(model, prompts, top_n, generations[0].params.adapters)
    return CompletionJob(generations, echoes, top_n is not None, request.timings_per_token, scored)


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
            tokenize_prompt(generator, p, bos=False, parse_special=False),
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
        "system_fingerprint": system_fingerprint(generation.model.backend),
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
        logprobs = None
        if job.wants_logprobs:
            logprobs = echoed_logprobs(job.prompt_scores(generation), outcome.logprobs, len(echo))
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
        total_usage(job.generations, dict(enumerate(outcomes))),
    )
    body["choices"] = choices
    body["timings"] = answer_timings(job.generations, outcomes)
    return body


async def completion_chunks(
    job: CompletionJob, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """text_completion chunks: echo first, then text as it comes, then each finish reason."""
    offsets = {i: 0 for i in range(len(job.generations))}
    finals: dict[int, TokenEvent] = {}
    async for position, event in stream_all(job.generations):
        generation = job.generations[position]
        if event.progress is not None:
            yield progress_chunk(_object(generation, {}), event.progress)
            continue
        text = event.text
        first = offsets[position] == 0
        if first:
            text = job.echoes[generation.prompt_index] + text
        logprobs = None
        if job.wants_logprobs:
            start = offsets[position] + len(text) - len(event.text)
            prompt = job.prompt_scores(generation) if first else None
            logprobs = echoed_logprobs(prompt, event.logprobs, start)
        offsets[position] += len(text)
        if text or event.logprobs:
            chunk = _object(generation, {"text": text, "logprobs": logprobs, "finish_reason": None})
            yield with_timings(chunk, job.timings_per_token, event)
        if event.finish_reason is None:
            continue
        finals[position] = event
        last = _object(generation, {"text": "", "finish_reason": event.finish_reason})
        if len(finals) == len(job.generations):
            last["timings"] = answer_timings(job.generations, [finals[i] for i in sorted(finals)])
        yield last
    if include_usage:
        usage_ = total_usage(job.generations, finals)
        chunk = usage_chunk(_object(job.generations[0], {}), usage_)
        ordered = [finals[i] for i in sorted(finals)]
        yield {**chunk, "timings": answer_timings(job.generations, ordered)}
