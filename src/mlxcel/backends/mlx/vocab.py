"""The tokenizer side of an MLX model: text <-> ids, the bytes of a token, special tokens."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import llguidance
import llguidance.hf

from mlxcel.engine.types import ChatTemplate, EngineError

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPM_SPACE = "\u2581"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable stand-in for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    stand_ins = dict(zip(printable, printable, strict=True))
    shift = 0
    for byte in range(256):
        if byte not in stand_ins:
            stand_ins[byte] = 256 + shift
            shift += 1
    return {chr(code): byte for byte, code in stand_ins.items()}


def _byte_level_piece(text: str) -> bytes:
    table = _byte_decoder()
    return b"".join(bytes([table[c]]) if c in table else c.encode() for c in text)


def _sentencepiece_piece(text: str) -> bytes:
    match = _BYTE_FALLBACK.fullmatch(text)
    if match:
        return bytes([int(match[1], 16)])
    return text.replace(_SPM_SPACE, " ").encode()


def _decoder_types(tokenizer: Any) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return set()
    spec = json.loads(decoder.__getstate__())
    parts = spec.get("decoders") or [spec]
    return {part.get("type", "") for part in parts}


class Vocabulary:
    """Token ids <-> text and bytes for an mlx-lm TokenizerWrapper, safe to use from any thread."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        # transformers flips a flag on the shared Rust tokenizer to encode without special
        # tokens, so two threads encoding at once must not interleave.
        self._lock = threading.Lock()
        self._added = {int(i): t for i, t in tokenizer.added_tokens_decoder.items()}
        self._pieces: dict[int, bytes] = {}
        self._bos: int | None = tokenizer.bos_token_id
        self._add_bos = self._bos is not None and self._encode("a", special=True)[:1] == [self._bos]
        self.end_of_generation = frozenset(int(t) for t in tokenizer.eos_token_ids)
        self._piece_of = self._piece_function()
        self._grammar_tokenizer: llguidance.LLTokenizer | None = None

    def _piece_function(self) -> Callable[[int], bytes]:
        types = _decoder_types(self._tokenizer)
        if "ByteLevel" in types:
            return lambda token: _byte_level_piece(self._token_text(token))
        if types & {"Metaspace", "ByteFallback", "Replace"}:
            return lambda token: _sentencepiece_piece(self._token_text(token))
        return lambda token: self._tokenizer.decode([token]).encode()

    def _token_text(self, token: int) -> str:
        return self._tokenizer.convert_ids_to_tokens(token) or ""

    def _encode(self, text: str, *, special: bool, split_special: bool = False) -> list[int]:
        with self._lock:
            return list(
                self._tokenizer.encode(
                    text, add_special_tokens=special, split_special_tokens=split_special
                )
            )

    @property
    def size(self) -> int:
        """Tokens the tokenizer knows (the model's output may be padded beyond)."""
        return len(self._tokenizer)

    @property
    def add_bos(self) -> bool:
        """Whether the tokenizer puts a BOS token in front of a prompt."""
        return self._add_bos

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids for `text`; BOS in front when asked and the text has none already."""
        ids = self._encode(text, special=False, split_special=not parse_special)
        # Chat templates often write the BOS themselves: do not double it.
        if add_special and self._add_bos and ids[:1] != [self._bos]:
            ids.insert(0, self._bos)  # type: ignore[arg-type]
        return ids

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes `token` stands for; special tokens are empty unless `special`."""
        added = self._added.get(token)
        if added is not None:
            return added.content.encode() if special or not added.special else b""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._piece_of(token) if 0 <= token < self.size else b""
            self._pieces[token] = piece
        return piece

    def tokens_containing(self, strings: tuple[str, ...]) -> frozenset[int]:
        """Ids of the tokens whose text contains one of `strings`."""
        return frozenset(
            token
            for token in range(self.size)
            if any(s in self.token_bytes(token).decode(errors="replace") for s in strings)
        )

    def grammar_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary, built on first use (about a second when large)."""
        if self._grammar_tokenizer is None:
            # llguidance reads the Hugging Face tokenizer itself, which mlx-lm's wrapper holds.
            hf_tokenizer = self._tokenizer._tokenizer
            try:
                with self._lock:
                    self._grammar_tokenizer = llguidance.hf.from_tokenizer(
                        hf_tokenizer, eos_token=sorted(self.end_of_generation) or None
                    )
            except ValueError as exc:
                raise EngineError(
                    f"structured outputs need a fast tokenizer on MLX: {exc}", "unsupported_field"
                ) from exc
        return self._grammar_tokenizer

    def chat_template(self) -> ChatTemplate | None:
        """The tokenizer's chat template with its BOS and EOS text, if it has one."""
        source = self._tokenizer.chat_template
        if isinstance(source, dict):
            source = source.get("default")
        if not source:
            return None
        return ChatTemplate(
            source=source,
            bos_token=self._tokenizer.bos_token or "",
            eos_token=self._tokenizer.eos_token or "",
        )
