"""What a tool-call parser emits while text streams in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Text:
    """Ordinary content for the client."""

    text: str


@dataclass(frozen=True)
class ToolStart:
    """A tool call begins: its position in the message, id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArguments:
    """A fragment of a tool call's JSON arguments."""

    index: int
    fragment: str


@dataclass(frozen=True)
class ToolEnd:
    """A started tool call is over: `closed` when its closing markup came, not when the text
    ended (or went on) inside it. `markup` is all its text, the content it is if not used.
    One may come without a ToolStart: a call's opening markup that the text ended in."""

    index: int
    markup: str
    closed: bool = True


@dataclass(frozen=True)
class Reasoning:
    """Chain of thought, for the client's reasoning field (formats with channels, like harmony)."""

    text: str


Delta = Text | ToolStart | ToolArguments | ToolEnd | Reasoning


class ToolCallParser(Protocol):
    """A streaming state machine: text in, content and tool-call deltas out.

    Every ToolStart is followed, after its arguments, by a ToolEnd of the same index.
    """

    def feed(self, text: str) -> list[Delta]:
        """Deltas that `text` completes; markup that may still continue is held back."""
        ...

    def finish(self) -> list[Delta]:
        """Whatever is held back at the end; markup that never became a call is content, and
        a call that started ends with a ToolEnd (not closed, if the text ended inside it)."""
        ...
