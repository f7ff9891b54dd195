"""Where a prompt's images sit, for the scheduler: chunks never cut one, reuse never ends in one."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from mlxcel.engine.types import MediaSpan

# Embeddings kept for images seen recently (the same picture in the next turn is not embedded
# again); bounded by count and bytes.
CACHE_IMAGES = 32
CACHE_BYTES = 256 * 1024 * 1024


def chunk_end(spans: Sequence[MediaSpan], start: int, budget: int, length: int) -> int:
    """Where a prompt chunk from `start` of at most `budget` tokens ends: never inside an
    image (one that starts at `start` is taken whole, whatever the budget)."""
    end = min(start + budget, length)
    for span in spans:
        if span.start <= start < span.end:
            return span.end
        if span.start < end < span.end:
            return span.start
    return end


def rows_in(spans: Sequence[MediaSpan], start: int, end: int) -> tuple[tuple[int, np.ndarray], ...]:
    """The images among prompt tokens [start, end), as a Feed takes them."""
    return tuple((s.start - start, s.embeddings) for s in spans if start <= s.start < end)


def reusable(spans: Sequence[MediaSpan], cached: int) -> int:
    """`cached` prompt tokens, cut back to the start of an image they would end inside."""
    for span in spans:
        if span.start < cached < span.end:
            return span.start
    return cached


class ImageRows:
    """Recent images' embedding rows by key (digest and token count), least recent dropped
    first. Not thread-safe: its owner calls it from one thread, or under a lock."""

    def __init__(self, max_images: int = CACHE_IMAGES, max_bytes: int = CACHE_BYTES) -> None:
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._max_images = max_images
        self._max_bytes = max_bytes

    def get(self, key: str) -> np.ndarray | None:
        """The rows kept under `key`, or None."""
        rows = self._rows.get(key)
        if rows is not None:
            self._rows.move_to_end(key)
        return rows

    def put(self, key: str, rows: np.ndarray) -> None:
        """Keep `rows` under `key`, dropping the least recent past the bounds."""
        self._rows[key] = rows
        self._bytes += rows.nbytes
        while len(self._rows) > self._max_images or self._bytes > self._max_bytes:
            _, dropped = self._rows.popitem(last=False)
            self._bytes -= dropped.nbytes
