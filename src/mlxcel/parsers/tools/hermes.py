"""Hermes-style calls (Qwen2.5, Qwen3): <tool_call>{"name", "arguments"}</tool_call>."""

from __future__ import annotations

import json
import re
import uuid

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolStart

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class HermesParser:
    """Content outside <tool_call> tags; inside, the name first, then arguments as they come."""

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False
        self._calls = 0
        self._started = False
        self._sent = 0

    def feed(self, text: str) -> list[Delta]:
        self._buffer += text
        deltas: list[Delta] = []
        while True:
            progress = self._inside_call(deltas) if self._inside else self._outside_call(deltas)
            if not progress:
                return deltas

    def finish(self) -> list[Delta]:
        if not self._buffer:
            return []
        if self._inside and not self._started:
            rest, self._buffer = OPEN + self._buffer, ""
            return [Text(rest)]
        if self._inside:
            body, self._buffer = self._buffer, ""
            return self._close(body)
        rest, self._buffer = self._buffer, ""
        return [Text(rest)]

    def _outside_call(self, deltas: list[Delta]) -> bool:
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
            self._buffer = self._buffer[match.end() :]
        if self._sent == 0:  # whitespace before the arguments may arrive after the name
            self._buffer = self._buffer.lstrip()
        end = self._buffer.find(CLOSE)
        if end >= 0:
            body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
            deltas.extend(self._close(body))
            return True
        # Hold back what may be the outer object's "}" and the start of the closing tag.
        body = self._buffer[: len(self._buffer) - held_prefix(self._buffer, CLOSE)].rstrip()
        cut = len(body) - 1 if body.endswith("}") else len(body)
        if cut > self._sent:
            deltas.append(ToolArguments(self._calls, self._buffer[self._sent : cut]))
            self._sent = cut
        return False

    def _close(self, body: str) -> list[Delta]:
        """The rest of a started call's arguments: `body` minus the outer object's "}"."""
        arguments = body.rstrip()
        if arguments.endswith("}"):
            arguments = arguments[:-1].rstrip()
        rest = arguments[self._sent :]
        self._inside, self._calls = False, self._calls + 1
        return [ToolArguments(self._calls - 1, rest)] if rest else []

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
        ]
