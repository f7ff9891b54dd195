"""Hermes-style calls (Qwen2.5, Qwen3): <tool_call>{"name", "arguments"}</tool_call>.

The answer may also open with calls whose tags the model left out (parsers/tools/untagged.py),
and a call whose JSON is whole is one even when max_tokens cut its closing tag.
"""

from __future__ import annotations

import json
import re
import uuid

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools import untagged
from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolEnd, ToolStart
from mlxcel.parsers.tools.grammar import Tools

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class HermesParser:
    """Content outside <tool_call> tags; inside, the name first, then arguments as they come."""

    def __init__(self, tools: Tools | None = None) -> None:
        self._names = frozenset(t["function"]["name"] for t in tools or [])
        self._at_start = bool(self._names)  # untagged calls may still open the answer
        self._buffer = ""
        self._inside = False
        self._calls = 0
        self._started = False
        self._sent = 0
        self._markup = ""  # the started call's text read so far, from its <tool_call>

    def feed(self, text: str) -> list[Delta]:
        self._buffer += text
        deltas: list[Delta] = []
        while True:
            progress = self._inside_call(deltas) if self._inside else self._outside_call(deltas)
            if not progress:
                return deltas

    def finish(self) -> list[Delta]:
        rest, self._buffer = self._buffer, ""
        if self._inside and self._started:
            body = rest[: len(rest) - held_prefix(rest, CLOSE)]
            # Whole JSON whose closing tag did not come (max_tokens) is a whole call.
            whole = _is_object(self._markup[len(OPEN) :] + body)
            return self._close(body, closed=whole, tail=rest[len(body) :])
        if self._inside:  # a call cut before its name: markup that may yet be dropped
            return [ToolEnd(self._calls, OPEN + rest, closed=False)]
        head = rest.lstrip()
        if self._at_start and head[:1] in ("{", "[") and untagged.may_be_calls(head, self._names):
            return [ToolEnd(self._calls, rest, closed=False)]  # an untagged call cut, likewise
        return [Text(rest)] if rest else []

    def _untagged(self, deltas: list[Delta]) -> bool | None:
        """Calls without tags at the start of the answer: True when some were read, None
        while the text may still become some, False when it will not."""
        head = self._buffer.lstrip()
        if not head:
            return None
        if head[0] not in "{[" or not untagged.may_be_calls(head, self._names):
            return False
        read = untagged.read_calls(head, self._names)
        if read is None:
            return None
        calls, end = read
        if not calls:
            return False
        for name, arguments, markup in calls:
            index, self._calls = self._calls, self._calls + 1
            deltas.append(ToolStart(index, f"call_{uuid.uuid4().hex[:24]}", name))
            deltas.append(ToolArguments(index, json.dumps(arguments)))
            deltas.append(ToolEnd(index, markup))
        self._buffer = head[end:]
        return True

    def _outside_call(self, deltas: list[Delta]) -> bool:
        if self._at_start:
            read = self._untagged(deltas)
            if read is None:
                return False
            self._at_start = read  # after untagged calls, another may follow
            if read:
                return True
        at = self._buffer.find(OPEN)
        if at < 0:
            keep = held_prefix(self._buffer, OPEN)
            ready = self._buffer[: len(self._buffer) - keep]
            if ready:
                deltas.append(Text(ready))
            self._buffer = self._buffer[len(ready) :]
            return False
        if at:
            deltas.append(Text(self._buffer[:at]))
        self._buffer = self._buffer[at + len(OPEN) :]
        self._inside, self._started, self._sent = True, False, 0
        return True

    def _inside_call(self, deltas: list[Delta]) -> bool:
        if not self._started:
            match = _NAME.match(self._buffer)
            if match is None:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    return False
                # Not the name-first shape: parse the whole call once it is closed.
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
                deltas.extend(self._whole(body))
                self._inside = False
                return True
            name = json.loads(f'"{match.group(1)}"')
            deltas.append(ToolStart(self._calls, f"call_{uuid.uuid4().hex[:24]}", name))
            self._started = True
            self._markup = OPEN + self._buffer[: match.end()]
            self._buffer = self._buffer[match.end() :]
        if self._sent == 0:  # whitespace before the arguments may arrive after the name
            arguments = self._buffer.lstrip()
            self._markup += self._buffer[: len(self._buffer) - len(arguments)]
            self._buffer = arguments
        end = self._buffer.find(CLOSE)
        if end >= 0:
            body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
            deltas.extend(self._close(body, closed=True, tail=CLOSE))
            return True
        # Hold back what may be the outer object's "}" and the start of the closing tag.
        body = self._buffer[: len(self._buffer) - held_prefix(self._buffer, CLOSE)].rstrip()
        cut = len(body) - 1 if body.endswith("}") else len(body)
        if cut > self._sent:
            deltas.append(ToolArguments(self._calls, self._buffer[self._sent : cut]))
            self._sent = cut
        return False

    def _close(self, body: str, *, closed: bool, tail: str) -> list[Delta]:
        """The rest of a started call's arguments, `body` minus the outer object's "}", then
        its end; `tail` is the markup after `body` (its closing tag, or the start of one)."""
        markup = self._markup + body + tail
        arguments = body.rstrip()
        if arguments.endswith("}"):
            arguments = arguments[:-1].rstrip()
        rest = arguments[self._sent :]
        index = self._calls
        self._inside, self._calls, self._markup = False, index + 1, ""
        end = ToolEnd(index, markup, closed)
        return [ToolArguments(index, rest), end] if rest else [end]

    def _whole(self, body: str) -> list[Delta]:
        try:
            call = json.loads(body)
            name, arguments = call["name"], call.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            return [Text(OPEN + body + CLOSE)]
        index, self._calls = self._calls, self._calls + 1
        return [
            ToolStart(index, f"call_{uuid.uuid4().hex[:24]}", str(name)),
            ToolArguments(index, json.dumps(arguments)),
            ToolEnd(index, OPEN + body + CLOSE),
        ]


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
