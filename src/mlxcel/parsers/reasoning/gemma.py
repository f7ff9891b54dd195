"""Gemma 4 thinking: `<|channel>thought\\n...<channel|>` before (or between parts of) the answer.

Google's Gemma 4 prompt-formatting and thinking docs: with `<|think|>` in the system turn the
model writes `<|channel>thought\\n{reasoning}<channel|>{answer}`; with thinking off the larger
models' template ends the prompt with an empty `<|channel>thought\\n<channel|>`, so the output
is all answer. The template's `strip_thinking` drops every channel block from an answer, so a
block may open anywhere, not only first.
"""

from __future__ import annotations

from mlxcel.parsers.markup import held_prefix

OPEN, CLOSE = "<|channel>", "<channel|>"
# The channel's name, not part of the thought.
LABEL = "thought\n"


class GemmaParser:
    """Streams (reasoning, content) pairs; a marker split across chunks is held until whole."""

    def __init__(self) -> None:
        self._inside = False
        self._labelled = False
        self._buffer = ""

    def feed(self, text: str) -> tuple[str, str]:
        """Reasoning and content that `text` completes."""
        self._buffer += text
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            if self._inside and not self._labelled:
                if len(self._buffer) < len(LABEL) and LABEL.startswith(self._buffer):
                    break
                self._buffer = self._buffer.removeprefix(LABEL)
                self._labelled = True
            marker = CLOSE if self._inside else OPEN
            part = reasoning if self._inside else content
            at = self._buffer.find(marker)
            if at < 0:
                cut = len(self._buffer) - held_prefix(self._buffer, marker)
                part.append(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
                break
            part.append(self._buffer[:at])
            self._buffer = self._buffer[at + len(marker) :]
            self._inside, self._labelled = not self._inside, False
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back: an unfinished marker or label is text of the part it was in."""
        rest, self._buffer = self._buffer, ""
        return (rest, "") if self._inside else ("", rest)
