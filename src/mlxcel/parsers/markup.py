"""Helpers shared by the streaming parsers."""

from __future__ import annotations


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could be the beginning of `marker`.

    A streaming parser holds that much back: the next chunk may complete the marker.
    """
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
