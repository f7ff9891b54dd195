"""Functionary v3.2's answers, and the grammar that forces its calls.

The template's generation prompt ends with `>>>`, so an answer opens with a recipient's name and
a newline, then what it receives: `all` is the user (text), anything else a function (its JSON
arguments); `>>>` begins the next one.

    get_weather
    {"city": "Paris"}>>>all
    Let me check.
"""

from __future__ import annotations

import json
import re
import uuid

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolEnd, ToolStart
from mlxcel.parsers.tools.grammar import ForcedGrammar, Tools, arguments_schema

NEXT = ">>>"
TEXT_RECIPIENT = "all"
# A recipient's name: what a function's name may be; a longer first line is no recipient.
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_NAMING, _TEXT, _ARGUMENTS = range(3)


class FunctionaryV32Parser:
    """Recipients in turn: text for `all`, a call's arguments for a function."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = _NAMING
        self._calls = 0
        self._markup = ""  # the started call's text read so far
        self._arguments_text = ""
        self._sent = 0

    def feed(self, text: str) -> list[Delta]:
        self._buffer += text
        deltas: list[Delta] = []
        while (self._naming, self._text, self._arguments)[self._state](deltas):
            pass
        return deltas

    def finish(self) -> list[Delta]:
        rest, state = self._buffer, self._state
        self._buffer, self._state = "", _NAMING
        if state == _ARGUMENTS:  # the answer's end ends its last call
            ready = (self._arguments_text + rest).rstrip()[self._sent :]
            end = ToolEnd(self._calls - 1, self._markup + rest, closed=False)
            return [ToolArguments(self._calls - 1, ready), end] if ready else [end]
        return [Text(rest)] if rest else []

    def _naming(self, deltas: list[Delta]) -> bool:
        if NEXT.startswith(self._buffer):
            return False  # nothing yet, or what may be the next `>>>`
        head = self._buffer.removeprefix(NEXT)
        line, newline, rest = head.partition("\n")
        if not _NAME.fullmatch(line):
            return False if not newline and not line else self._as_text()
        if not newline:
            return False  # a name still arriving (one longer than a name is text)
        if line == TEXT_RECIPIENT:
            self._buffer, self._state = rest, _TEXT
            return True
        self._calls += 1
        deltas.append(ToolStart(self._calls - 1, f"call_{uuid.uuid4().hex[:24]}", line))
        self._markup = self._buffer[: len(self._buffer) - len(rest)]
        self._buffer, self._state, self._arguments_text, self._sent = rest, _ARGUMENTS, "", 0
        return True

    def _as_text(self) -> bool:
        """Not a recipient's line: the answer is text from here on, up to the next `>>>`."""
        self._state = _TEXT
        return True

    def _text(self, deltas: list[Delta]) -> bool:
        at = self._buffer.find(NEXT)
        end = at if at >= 0 else len(self._buffer) - held_prefix(self._buffer, NEXT)
        if end:
            deltas.append(Text(self._buffer[:end]))
        self._buffer = self._buffer[end:]
        if at < 0:
            return False
        self._state = _NAMING
        return True

    def _arguments(self, deltas: list[Delta]) -> bool:
        at = self._buffer.find(NEXT)
        end = at if at >= 0 else len(self._buffer) - held_prefix(self._buffer, NEXT)
        self._arguments_text += self._buffer[:end]
        self._markup += self._buffer[:end]
        self._buffer = self._buffer[end:]
        # Whitespace after the JSON (before `>>>`) is held, and dropped at the call's end.
        ready = self._arguments_text.rstrip()
        if len(ready) > self._sent:
            deltas.append(ToolArguments(self._calls - 1, ready[self._sent :]))
            self._sent = len(ready)
        if at < 0:
            return False
        deltas.append(ToolEnd(self._calls - 1, self._markup))
        self._markup, self._state = "", _NAMING
        return True


def forced_grammar(tools: Tools, parallel: bool) -> ForcedGrammar:
    """Lark for calls to `tools` after the prompt's `>>>`, their arguments held to the
    parameters schema."""
    rules = [f"start: call ({json.dumps(NEXT)} call)*" if parallel else "start: call"]
    names = []
    for i, tool in enumerate(tools):
        names.append(f"{json.dumps(tool['function']['name'] + chr(10))} arguments_{i}")
        rules.append(f"arguments_{i}: %json {arguments_schema(tool)}")
    rules.append(f"call: {' | '.join(names)}")
    return ForcedGrammar("\n".join(rules) + "\n", "lark")
