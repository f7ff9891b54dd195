"""llama-server's `timings` object: how long an answer's prompt and generation took."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mlxcel.engine.types import PromptProgress
from mlxcel.serving.text import Generation
from mlxcel.serving.usage import Counted


def timings(
    prompt_tokens: int,
    cached: int,
    predicted: int,
    prompt_ms: float,
    predicted_ms: float,
    drafts: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """The object: `prompt_n` counts the prompt tokens evaluated, `cache_n` those reused; with
    speculative decoding (`drafts`: tokens drafted, accepted) `draft_n` and
    `draft_n_accepted`, as llama-server adds them."""
    prompt_n = prompt_tokens - cached
    drafted, accepted = drafts
    speculated = {"draft_n": drafted, "draft_n_accepted": accepted} if drafted else {}
    return {
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
        "predicted_per_second": 1e3 * predicted / predicted_ms if predicted_ms else 0.0,
        **speculated,
    }


def timings_of(counted: Counted) -> dict[str, Any]:
    """One generation's timings, so far or in all."""
    return timings(
        counted.prompt_tokens,
        counted.cached_tokens,
        counted.completion_tokens,
        counted.prompt_ms,
        counted.predicted_ms,
        (counted.draft_tokens, counted.draft_accepted),
    )


def answer_timings(generations: Sequence[Generation], finals: Sequence[Counted]) -> dict[str, Any]:
    """A whole answer's timings: each prompt once, every choice's tokens, the slowest times."""
    prompts = {
        g.prompt_index: (f.prompt_tokens, f.cached_tokens)
        for g, f in zip(generations, finals, strict=True)
    }
    return timings(
        sum(tokens for tokens, _ in prompts.values()),
        sum(cached for _, cached in prompts.values()),
        sum(f.completion_tokens for f in finals),
        max(f.prompt_ms for f in finals),
        max(f.predicted_ms for f in finals),
        (sum(f.draft_tokens for f in finals), sum(f.draft_accepted for f in finals)),
    )


def with_timings(chunk: dict[str, Any], wanted: bool, event: Counted) -> dict[str, Any]:
    """A stream chunk with the timings so far, when the request asked for timings_per_token."""
    if wanted:
        chunk["timings"] = timings_of(event)
    return chunk


def progress_chunk(chunk: dict[str, Any], progress: PromptProgress) -> dict[str, Any]:
    """An OpenAI stream chunk that only reports prompt progress (llama-server's
    return_progress): no choices, and `prompt_progress`."""
    return {**chunk, "choices": [], "prompt_progress": dataclasses.asdict(progress)}
