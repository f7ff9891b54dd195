"""Engine log-probabilities in the two OpenAI shapes, chat's and legacy completions', and in
llama-server's post-sampling shape (`prob` and `top_probs`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mlxcel.engine.types import TokenLogprob


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def post_sampling(tokens: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's entries with post_sampling_probs: probabilities, not their logarithms,
    of what the sampler chain left."""

    def entry(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
        return {"id": token, "token": _text(piece), "bytes": list(piece), "prob": math.exp(logprob)}

    return [
        {**entry(t.token, t.piece, t.logprob), "top_probs": [entry(*top) for top in t.top]}
        for t in tokens
    ]


def chat_logprobs(tokens: Sequence[TokenLogprob], post: bool = False) -> dict[str, Any]:
    """choices[].logprobs of a chat completion: content[] with token, logprob, bytes, top
    (llama-server's `prob` entries with `post`, post_sampling_probs)."""
    if post:
        return {"content": post_sampling(tokens), "refusal": None}
    return {
        "content": [
            {
                "token": _text(t.piece),
                "logprob": t.logprob,
                "bytes": list(t.piece),
                "top_logprobs": [
                    {"token": _text(piece), "logprob": lp, "bytes": list(piece)}
                    for _, piece, lp in t.top
                ],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """choices[].logprobs of a text completion; `offset` is where the first token's text starts."""
    text_offset = []
    for t in tokens:
        text_offset.append(offset)
        offset += len(_text(t.piece))
    return {
        "tokens": [_text(t.piece) for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{_text(piece): lp for _, piece, lp in t.top} for t in tokens],
        "text_offset": text_offset,
    }
