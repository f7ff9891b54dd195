"""<think>...</think> reasoning, as DeepSeek-R1, Qwen3 and their kin write it."""

from __future__ import annotations

from mlxcel.parsers.markup import held_prefix

OPEN, CLOSE = "<think>", "</think>"


class ThinkParser:
    """Streams (reasoning, content) pairs; a tag split across chunks is held until it is whole."""

    def __init__(self, *, start_inside: bool) -> None:
        self._inside = start_inside
        self._seen_text = False
        self._fresh = True
        self._buffer = ""

    def feed(self, text: str) -> tuple[str, str]:
        """Reasoning and content that `text` completes."""
        self._buffer += text
        if self._fresh and self._inside:
            # A model may still write the <think> its template already opened.
            head = self._buffer.lstrip()
            if len(head) < len(OPEN) and OPEN.startswith(head):
                return "", ""
            if head.startswith(OPEN):
                self._buffer = head[len(OPEN) :]
        self._fresh = False
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            marker = CLOSE if self._inside else OPEN
            at = self._buffer.find(marker)
            # Only an opening tag before any answer text starts reasoning.
            if at >= 0 and (self._inside or not (self._seen_text or self._buffer[:at].strip())):
                (reasoning if self._inside else content).append(self._buffer[:at])
                self._seen_text = self._seen_text or bool(self._buffer[:at].strip())
                self._buffer = self._buffer[at + len(marker) :]
                self._inside = not self._inside
                continue
            keep = held_prefix(self._buffer, marker) if (self._inside or not self._seen_text) else 0
            ready, self._buffer = (
                self._buffer[: len(self._buffer) - keep],
                self._buffer[len(self._buffer) - keep :],
            )
            (reasoning if self._inside else content).append(ready)
            self._seen_text = self._seen_text or (not self._inside and bool(ready.strip()))
            return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back: an unfinished tag is text of the part it was in."""
        rest, self._buffer = self._buffer, ""
        return (rest, "") if self._inside else ("", rest)
