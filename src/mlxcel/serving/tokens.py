"""A prompt's tokens and their checks: the vocabulary, and a size no context can hold."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel.engine.context import CONTEXT_LENGTH_EXCEEDED, longest_token, most_text_bytes
from mlxcel.engine.types import TextModel
from mlxcel.protocol.common import Prompt
from mlxcel.protocol.errors import invalid_request


def check_text_size(generator: TextModel, text: str, param: str) -> None:
    """A 400 for a text so long it cannot fit the context whatever its tokens, before it is
    tokenized (which takes seconds for megabytes): no token covers more than the longest."""
    limit = most_text_bytes(generator.n_ctx_seq, longest_token(generator))
    size = len(text.encode())
    if size > limit:
        raise invalid_request(
            f"the text is {size} bytes, far more than the context of {generator.n_ctx_seq} "
            "tokens can hold; shorten it or start the server with a larger -c",
            param,
            CONTEXT_LENGTH_EXCEEDED,
        )


def tokenize_prompt(
    generator: TextModel, prompt: Prompt, *, bos: bool = True, parse_special: bool = True
) -> list[int]:
    """A prompt's tokens: text as the model's tokenizer makes them (with BOS when `bos`, the
    model wants one and the prompt starts with text), token ids as they are."""
    pieces = [prompt] if isinstance(prompt, str) else prompt
    tokens: list[int] = []
    for position, piece in enumerate(pieces):
        if isinstance(piece, int):
            tokens.append(piece)
        else:
            check_text_size(generator, piece, "prompt")
            first = bos and generator.add_bos and position == 0
            tokens += generator.tokenize(piece, add_special=first, parse_special=parse_special)
    return tokens


def detokenize_ids(generator: TextModel, tokens: Sequence[int]) -> str:
    """The text of some token ids, with broken UTF-8 replaced."""
    data = b"".join(generator.token_pieces(tokens, special=True))
    return data.decode("utf-8", errors="replace")


def check_vocabulary(generator: TextModel, tokens: Sequence[int], param: str) -> None:
    """400 naming `param` unless every id is in the vocabulary (llama.cpp aborts on others)."""
    n_vocab = generator.n_vocab
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise invalid_request(
            f"token id {bad} is not in the vocabulary (ids run from 0 to {n_vocab - 1})", param
        )
