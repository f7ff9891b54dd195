"""Legacy completions' `echo` with `logprobs`: the prompt's own tokens scored by the model and
listed before the answer's, as OpenAI's completions API gives them.

The first prompt token has no log-probability (nothing comes before it to predict it): its
`token_logprobs` and `top_logprobs` entries are null. Each later one has the model's
log-probability of it after the tokens before it, and its top alternatives, as a generated
token's are reported (the raw distribution, before any sampler). The prompt is scored once
however many choices continue it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.capabilities import GivesPromptScores
from mlxcel.engine.types import TokenLogprob
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.logprobs import completion_logprobs


@dataclass(frozen=True)
class ScoredPrompt:
    """A prompt's first token's bytes and the scores of the tokens after it."""

    first: bytes
    scores: list[TokenLogprob]


def score_prompts(
    model: LoadedModel, prompts: Sequence[list[int]], top_n: int, adapters: AdapterSet
) -> list[ScoredPrompt]:
    """Each prompt scored by the model's engine; a 400 naming `echo` where it cannot."""
    generator = model.generator
    if not isinstance(generator, GivesPromptScores) or not generator.scores_prompts:
        raise invalid_request(
            f"echo with logprobs needs the log-probabilities of the prompt's tokens, which "
            f"the {model.backend} engine serving '{model.name}' does not give",
            "echo",
            "unsupported_field",
        )
    return [
        ScoredPrompt(
            generator.token_pieces(tokens[:1])[0],
            generator.score_prompt(tokens, top_n, adapters),
        )
        for tokens in prompts
    ]


def echoed_logprobs(
    prompt: ScoredPrompt | None, answer: Sequence[TokenLogprob], offset: int
) -> dict[str, Any]:
    """choices[].logprobs of a text completion: the scored prompt's tokens (when echoed)
    from text offset 0, then the answer's from `offset`."""
    answered = completion_logprobs(answer, offset)
    if prompt is None:
        return answered
    echoed = completion_logprobs(prompt.scores, 0)
    first = prompt.first.decode("utf-8", errors="replace")
    return {
        "tokens": [first, *echoed["tokens"], *answered["tokens"]],
        "token_logprobs": [None, *echoed["token_logprobs"], *answered["token_logprobs"]],
        "top_logprobs": [None, *echoed["top_logprobs"], *answered["top_logprobs"]],
        "text_offset": [
            0,
            *(len(first) + at for at in echoed["text_offset"]),
            *answered["text_offset"],
        ],
    }
