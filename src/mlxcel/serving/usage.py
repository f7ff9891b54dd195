"""Token accounting of an answer: the OpenAI usage object, summed over a request's choices."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from mlxcel.serving.text import Generation


class Counted(Protocol):
    """A finished (or running) generation's token counts and times: an event or an outcome."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def prompt_ms(self) -> float: ...

    @property
    def predicted_ms(self) -> float: ...

    @property
    def draft_tokens(self) -> int: ...

    @property
    def draft_accepted(self) -> int: ...


def total_usage(generations: list[Generation], finals: Mapping[int, Counted]) -> dict[str, Any]:
    """Usage for a whole answer from each choice's last event (or outcome) by its position:
    each prompt counted once (as the engine laid it out, media included), every choice's
    output summed."""
    prompts = {
        generations[i].prompt_index: (f.prompt_tokens, f.cached_tokens) for i, f in finals.items()
    }
    return usage(
        sum(tokens for tokens, _ in prompts.values()),
        sum(f.completion_tokens for f in finals.values()),
        sum(cached for _, cached in prompts.values()),
    )


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
