"""Formats whose calls are plain JSON: Llama 3.x (`{"name", "parameters"}`, maybe after
<|python_tag|>), Mistral (`[TOOL_CALLS][{"name", "arguments"}, ...]`) and a bare-JSON fallback.

A call's JSON is only known once it closes, so these parsers hold it and emit each call whole
(its start, then its arguments in one fragment); text that is not a call streams as content.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolStart


class JsonCallsParser:
    """Content until `marker` (or a leading JSON object when `marker` is empty), then calls."""

    def __init__(self, marker: str, *, arguments_keys: tuple[str, ...]) -> None:
        self._marker = marker
        self._keys = arguments_keys
        self._buffer = ""
        self._calls_text: str | None = None
        self._decided = False
        self._prefix = ""
        self._calls = 0

    def feed(self, text: str) -> list[Delta]:
        if self._calls_text is not None:
            self._calls_text += text
            return []
        self._buffer += text
        if not self._decided:
            # Markers are often control tokens that detokenize to nothing: an answer that
            # opens with JSON is read as calls too.
            head = self._buffer.lstrip()
            if not head:
                return []
            self._decided = True
            if head[0] in "{[":
                self._calls_text, self._buffer = head, ""
                return []
        if not self._marker:
            ready, self._buffer = self._buffer, ""
            return [Text(ready)] if ready else []
        at = self._buffer.find(self._marker)
        if at >= 0:
            before, self._calls_text = self._buffer[:at], self._buffer[at + len(self._marker) :]
            self._prefix = self._marker
            self._buffer = ""
            return [Text(before)] if before else []
        ready = self._buffer[: len(self._buffer) - held_prefix(self._buffer, self._marker)]
        self._buffer = self._buffer[len(ready) :]
        return [Text(ready)] if ready else []

    def finish(self) -> list[Delta]:
        if self._calls_text is None:
            rest, self._buffer = self._buffer, ""
            return [Text(rest)] if rest else []
        calls = self._parse(self._calls_text)
        if calls is None:
            return [Text(self._prefix + self._calls_text)]
        deltas: list[Delta] = []
        for name, arguments in calls:
            deltas.append(ToolStart(self._calls, f"call_{uuid.uuid4().hex[:24]}", name))
            deltas.append(ToolArguments(self._calls, json.dumps(arguments)))
            self._calls += 1
        return deltas

    def _parse(self, text: str) -> list[tuple[str, Any]] | None:
        try:
            value = json.loads(text)
        except ValueError:
            return None
        items = value if isinstance(value, list) else [value]
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            arguments: Any = next((item[k] for k in self._keys if k in item), {})
            calls.append((item["name"], arguments))
        return calls or None


def llama3_json() -> JsonCallsParser:
    """Llama 3.1-3.3: a JSON object with "parameters", maybe after <|python_tag|>."""
    return JsonCallsParser("<|python_tag|>", arguments_keys=("parameters", "arguments"))


def mistral() -> JsonCallsParser:
    """Mistral: [TOOL_CALLS] then a JSON array of {"name", "arguments"}."""
    return JsonCallsParser("[TOOL_CALLS]", arguments_keys=("arguments",))


def bare_json() -> JsonCallsParser:
    """Fallback: an answer that is a JSON object {"name", "arguments"} is a call."""
    return JsonCallsParser("", arguments_keys=("arguments", "parameters"))
