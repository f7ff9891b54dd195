"""An image's M-RoPE positions, as a projector lays them out and a generator places them."""

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
