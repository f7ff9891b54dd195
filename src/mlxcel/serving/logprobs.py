"""Engine log-probabilities in the two OpenAI shapes: chat's and legacy completions'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.engine.types import TokenLogprob


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """choices[].logprobs of a chat completion: content[] with token, logprob, bytes, top."""
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
