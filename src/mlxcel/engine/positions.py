"""An image's M-RoPE positions, as a projector lays them out and a generator places them,
and where a sequence's positions stop being its token indices after such images."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class MropePositions:
    """Where an image's tokens sit for M-RoPE (Qwen2-VL style): four positions a token
    (temporal, row, column, unused), and how far the sequence's next position moves past the
    image (`n_pos`, its grid's longer side, not its token count)."""

    base: np.ndarray = field(compare=False, repr=False)
    """int32 (4, tokens): each section's position with the image's first token at 0."""
    moves: np.ndarray = field(compare=False, repr=False)
    """int32 (4, tokens): 1 where that position moves with the image's start, else 0."""
    n_pos: int

    def at(self, start: int) -> np.ndarray:
        """The positions, section-major, with the image's first token at position `start`."""
        return np.ascontiguousarray(self.base + start * self.moves, dtype=np.int32).ravel()


class Jumps:
    """One sequence's (token index, position) after every image that took fewer positions
    than tokens (M-RoPE: an image's grid advances the position by its longer side). Text,
    and images with one position a token, advance both alike, so these pairs map any token
    index outside an image to its position."""

    def __init__(self, pairs: list[tuple[int, int]] | None = None) -> None:
        self._pairs = pairs or []

    def position(self, index: int) -> int:
        """The KV position of token `index`."""
        shift = next((p - i for i, p in reversed(self._pairs) if i <= index), 0)
        return index + shift

    def keep(self, tokens: int) -> None:
        """Forget the images after the first `tokens` tokens (they leave the KV state)."""
        self._pairs = [(i, p) for i, p in self._pairs if i <= tokens]

    def advance(self, start: int, n_tokens: int, n_pos: int) -> None:
        """An image of `n_tokens` tokens taking `n_pos` positions from position `start`."""
        if n_pos != n_tokens:
            shift = self._pairs[-1][1] - self._pairs[-1][0] if self._pairs else 0
            self._pairs.append((start - shift + n_tokens, start + n_pos))

    def to_bytes(self) -> bytes:
        """A count, then the pairs: int64 little-endian."""
        return np.array([len(self._pairs), *np.ravel(self._pairs)], dtype="<i8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[Jumps, int]:
        """The jumps `to_bytes` wrote at the start of `data`, and the bytes they took."""
        count = int(np.frombuffer(data, "<i8", 1)[0])
        pairs = np.frombuffer(data, "<i8", 2 * count, offset=8).reshape(count, 2)
        return cls([(int(i), int(p)) for i, p in pairs]), 8 * (1 + 2 * count)
