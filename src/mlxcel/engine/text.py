"""Token bytes to text, and stop strings matched across token boundaries."""

from __future__ import annotations

import codecs


class IncrementalText:
    """Turns token bytes into text, holding back a UTF-8 character split across tokens."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        """Text completed by `data`."""
        return self._decoder.decode(data)

    def flush(self) -> str:
        """Whatever is left, with broken bytes replaced."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings in streamed text without emitting a stop string's beginning early."""

    def __init__(self, stops: tuple[str, ...], *, include_stop: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include_stop
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was reached (see `matched`)."""
        if not self._stops:
            return text, False
        buffer = self._held + text
        hits = [(i, s) for s in self._stops if (i := buffer.find(s)) >= 0]
        if hits:
            self._held = ""
            at, self.matched = min(hits)
            return buffer[: at + len(self.matched) if self._include else at], True
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """Held text, released when generation ends for another reason."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest
