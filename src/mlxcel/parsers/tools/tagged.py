"""What the parsers of tag-delimited calls share: content up to an opening tag, and the markup
of a call that never starts going back out as content."""

from __future__ import annotations

from abc import ABC, abstractmethod

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, Text


class TaggedCallsParser(ABC):
    """A state machine over a text buffer; `_step` does one state's work."""

    OPENINGS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._buffer = ""
        self._state = 0  # 0: outside calls; a subclass numbers its other states
        self._raw = ""  # markup read for a call that has not started: content if it never does
        self._calls = 0

    def feed(self, text: str) -> list[Delta]:
        self._buffer += text
        deltas: list[Delta] = []
        while self._step(deltas):
            pass
        return deltas

    @abstractmethod
    def _step(self, deltas: list[Delta]) -> bool:
        """Advance from the current state; False when the buffer needs more text first."""

    def _opening(self, deltas: list[Delta]) -> str | None:
        """Content up to the first of `OPENINGS`, which is read as markup and returned; None
        (and the end that may begin one held back) when none has arrived."""
        found = [(at, m) for m in self.OPENINGS if (at := self._buffer.find(m)) >= 0]
        if not found:
            keep = max(held_prefix(self._buffer, m) for m in self.OPENINGS)
            self._text(deltas, len(self._buffer) - keep)
            return None
        at, marker = min(found)
        self._text(deltas, at)
        self._buffer, self._raw = self._buffer[len(marker) :], marker
        return marker

    def _not_a_call(self, deltas: list[Delta]) -> bool:
        """The markup read so far was not a call: it is content, and so is what follows."""
        if self._raw:
            deltas.append(Text(self._raw))
        self._raw, self._state = "", 0
        return True

    def _text(self, deltas: list[Delta], end: int) -> None:
        if end:
            deltas.append(Text(self._buffer[:end]))
        self._buffer = self._buffer[end:]
