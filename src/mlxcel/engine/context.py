"""A prompt against its context, as both processes check it: whether it leaves room for an
answer, and the most text one token can stand for (the size check before tokenizing)."""

from __future__ import annotations

import weakref
from typing import Protocol, runtime_checkable

from mlxcel.engine.types import TextModel

_longest_tokens: weakref.WeakKeyDictionary[TextModel, int] = weakref.WeakKeyDictionary()


@runtime_checkable
class KnowsLongestToken(Protocol):
    """A model that was told its longest token (a worker's model: its worker measured it at
    load, so no request asks the worker for the whole vocabulary)."""

    @property
    def longest_token(self) -> int: ...


def longest_token(generator: TextModel) -> int:
    """The most bytes of text one of the model's tokens stands for (computed once a model)."""
    if isinstance(generator, KnowsLongestToken):
        return generator.longest_token
    longest = _longest_tokens.get(generator)
    if longest is None:
        pieces = generator.token_pieces(range(generator.n_vocab), special=True)
        longest = _longest_tokens[generator] = max(1, *(len(piece) for piece in pieces))
    return longest


# Slack over the longest token's length before a text is called too long from its size alone:
# a tokenizer that normalizes (drops or merges characters) makes fewer tokens than its bytes.
SIZE_SLACK = 4


def most_text_bytes(tokens: int, longest: int) -> int:
    """The most bytes of text worth tokenizing for at most `tokens` tokens of at most `longest`
    bytes each: anything longer cannot fit whatever its tokens, and is refused (or cut, where
    the request asks for truncation) before the tokenizer spends seconds on megabytes."""
    return tokens * longest * SIZE_SLACK


# The error code of a prompt longer than the context.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def context_overflow(n_prompt: int, n_ctx: int) -> str | None:
    """What is wrong with a prompt of `n_prompt` tokens in a context of `n_ctx` (None: it
    leaves room for an answer)."""
    if n_prompt < n_ctx:
        return None
    return (
        f"the prompt has {n_prompt} tokens but the context holds {n_ctx} (including the "
        "answer); shorten it or start the server with a larger -c"
    )
