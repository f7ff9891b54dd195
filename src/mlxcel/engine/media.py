"""Where a prompt's media sit, for the scheduler: chunks never cut one, reuse never ends in
one; and the protocol of a generator whose prompts may hold images or audio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from mlxcel.engine.positions import MropePositions
from mlxcel.engine.types import MediaSpan
from mlxcel.media.audio import Media
from mlxcel.media.recent import Recent


@runtime_checkable
class TakesMedia(Protocol):
    """A generator with a projector: a prompt may hold images or audio clips where its marker
    is (which of them: `input_modalities`)."""

    @property
    def media_marker(self) -> str:
        """The text that stands for one image or clip in a rendered prompt."""
        ...

    @property
    def audio_rate(self) -> int | None:
        """Samples per second a clip is given at; None when the model takes no audio."""
        ...

    def tokenize_with_media(
        self, text: str, media: Sequence[Media]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """Tokens for `text` with each marker replaced by its medium's placeholders, and where
        each sits (an audio clip may be several spans, one per window of its encoder). Any
        thread may call it (it embeds the media there)."""
        ...


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


def mrope_in(spans: Sequence[MediaSpan], start: int, end: int) -> tuple[MropePositions | None, ...]:
    """The M-RoPE positions of the images `rows_in` gives (empty when none has any)."""
    inside = tuple(s.mrope for s in spans if start <= s.start < end)
    return inside if any(inside) else ()


def reusable(spans: Sequence[MediaSpan], cached: int) -> int:
    """`cached` prompt tokens, cut back to the start of an image they would end inside."""
    for span in spans:
        if span.start < cached < span.end:
            return span.start
    return cached


def _nbytes(key: str, rows: np.ndarray) -> int:
    return int(rows.nbytes)


def rows_key(digest: str, n_tokens: int) -> str:
    """What `ImageRows` keeps an image's (or an audio window's) rows by: its digest and its
    token count (a model may lay the same picture out at another size)."""
    return f"{digest}:{n_tokens}"


class ImageRows(Recent[str, np.ndarray]):
    """Recent images' embedding rows by key (digest and token count), least recent dropped
    first."""

    def __init__(self, max_images: int = CACHE_IMAGES, max_bytes: int = CACHE_BYTES) -> None:
        super().__init__(max_images, max_bytes, _nbytes)
