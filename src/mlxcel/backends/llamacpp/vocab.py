"""A GGUF's text side: tokenizing, and the bytes of each token.

`Vocabulary` is it over a loaded model's vocabulary (the engine's, in a model's worker);
`VocabularyOnly` loads a GGUF's vocabulary alone, without its weights, so the HTTP process
tokenizes a prompt as the worker would, without a round trip to it for every request.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from mlxcel.backends.llamacpp import native


class Vocabulary:
    """Text <-> token ids over a llama.cpp vocabulary, from any thread."""

    def __init__(self, vocab: Any) -> None:
        self._vocab = vocab
        self._pieces: dict[int, bytes] = {}

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text`."""
        return native.tokenize(
            self._vocab, text.encode(), add_special=add_special, parse_special=parse_special
        )

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token stands for (special tokens' text only when `special`)."""
        if special:
            return native.token_piece(self._vocab, token, special=True)
        piece = self._pieces.get(token)
        if piece is None:
            piece = native.token_piece(self._vocab, token, special=False)
            self._pieces[token] = piece
        return piece

    def token_pieces(self, tokens: Sequence[int], *, special: bool = False) -> list[bytes]:
        """The bytes each token stands for."""
        return [self.token_bytes(t, special=special) for t in tokens]


class VocabularyOnly(Vocabulary):
    """A GGUF's vocabulary loaded without its weights (a few MB), freed with the object: no
    call can reach it after that, whichever thread made the last one."""

    def __init__(self, path: Path, *, verbose: bool = False) -> None:
        native.route_native_logs(verbose)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        llama_cpp.llama_backend_init()
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if model is None:
            raise ValueError(f"llama.cpp could not read the vocabulary of {path}")
        super().__init__(llama_cpp.llama_model_get_vocab(model))
        weakref.finalize(self, llama_cpp.llama_model_free, model)
