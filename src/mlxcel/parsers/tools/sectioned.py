"""What DeepSeek's and Kimi K2's parsers share: calls inside a section's markers, each a head
(its name) between CALL_BEGIN and its arguments, the arguments streamed up to CALL_END."""

from __future__ import annotations

from abc import abstractmethod

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolEnd
from mlxcel.parsers.tools.tagged import TaggedCallsParser

OUTSIDE, SECTION, HEAD, ARGUMENTS = range(4)


class SectionedCallsParser(TaggedCallsParser):
    """Content outside the calls section; inside, each call's head, then its arguments. A call
    may also open without the section (OPENINGS: the section's and the call's beginnings)."""

    SECTION_BEGIN = ""
    SECTION_END = ""
    CALL_BEGIN = ""
    CALL_END = ""
    TRAILING = ""
    """Characters that may close the arguments without being JSON (a code fence's)."""

    def __init__(self) -> None:
        super().__init__()
        self._in_section = False  # the calls began with SECTION_BEGIN
        self._start: int | None = None  # where the arguments begin
        self._sent = 0
        self._markup = ""  # the started call's text up to its arguments

    def finish(self) -> list[Delta]:
        if self._state == ARGUMENTS:
            # Unfinished: the arguments get the rest as written.
            rest = self._buffer[self._start or 0 :][self._sent :]
            end = ToolEnd(self._calls - 1, self._markup + self._buffer, closed=False)
            deltas: list[Delta] = [ToolArguments(self._calls - 1, rest), end] if rest else [end]
        elif (
            self._state == SECTION
            and not self._raw
            and self.SECTION_END.startswith(self._buffer.strip())
        ):
            deltas = []  # after a call, (the start of) the section's end
        elif self._state == HEAD:  # a call cut before its arguments: markup that may be dropped
            deltas = [ToolEnd(self._calls, self._raw + self._buffer, closed=False)]
        else:
            rest = self._raw + self._buffer
            deltas = [Text(rest)] if rest else []
        self._buffer, self._raw, self._state = "", "", OUTSIDE
        return deltas

    def _step(self, deltas: list[Delta]) -> bool:
        return (self._outside, self._section, self._head, self._arguments)[self._state](deltas)

    @abstractmethod
    def _head(self, deltas: list[Delta]) -> bool:
        """Read a call's head: on a ToolStart, `_start_arguments` at its end."""

    def _arguments_start(self, body: str, whole: bool) -> int | None:
        """Where the JSON begins in the arguments' `body`; None while not known yet."""
        return 0

    def _start_arguments(self, rest: str) -> None:
        """The call has started; `rest` of the buffer is its arguments, the rest its head."""
        self._markup = self._raw + self._buffer[: len(self._buffer) - len(rest)]
        self._buffer, self._raw, self._start, self._sent = rest, "", None, 0
        self._state = ARGUMENTS

    def _outside(self, deltas: list[Delta]) -> bool:
        marker = self._opening(deltas)
        if marker is None:
            return False
        self._in_section = marker == self.SECTION_BEGIN
        self._state = SECTION if self._in_section else HEAD
        return True

    def _section(self, deltas: list[Delta]) -> bool:
        head = self._buffer.lstrip()
        read = len(self._buffer) - len(head)
        if head.startswith(self.CALL_BEGIN):
            self._raw += self._buffer[: read + len(self.CALL_BEGIN)]
            self._buffer, self._state = head[len(self.CALL_BEGIN) :], HEAD
            return True
        if head.startswith(self.SECTION_END):
            if self._raw:  # a section without calls is content
                self._raw += self._buffer[: read + len(self.SECTION_END)]
            self._buffer = head[len(self.SECTION_END) :]
            return self._not_a_call(deltas)
        if self.CALL_BEGIN.startswith(head) or self.SECTION_END.startswith(head):
            return False
        return self._not_a_call(deltas)

    def _arguments(self, deltas: list[Delta]) -> bool:
        end = self._buffer.find(self.CALL_END)
        body = self._buffer if end < 0 else self._buffer[:end]
        if end < 0:
            body = body[: len(body) - held_prefix(body, self.CALL_END)]
        if self._start is None:
            self._start = self._arguments_start(body, end >= 0)
        if self._start is not None:
            arguments = body[self._start :].rstrip(self.TRAILING)
            if len(arguments) > self._sent:
                deltas.append(ToolArguments(self._calls - 1, arguments[self._sent :]))
                self._sent = len(arguments)
        if end < 0:
            return False
        markup = self._markup + self._buffer[: end + len(self.CALL_END)]
        deltas.append(ToolEnd(self._calls - 1, markup))
        self._buffer = self._buffer[end + len(self.CALL_END) :]
        self._state = SECTION if self._in_section else OUTSIDE
        return True
