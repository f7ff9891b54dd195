"""Formats whose calls are plain JSON: Llama 3.x (`{"name", "parameters"}`, maybe after
<|python_tag|>), Mistral (`[TOOL_CALLS][{"name", "arguments"}, ...]`), Granite 3.x
(`<|tool_call|>[...]`), firefunction-v2 (` functools[...]`) and a bare-JSON fallback.

A call's JSON is only known once it closes, so these parsers hold it and emit each call whole
(its start, then its arguments in one fragment); text that is not a call streams as content.
A list of calls that the text's end cut off keeps the calls it completed; the call it cut is
dropped (the model's next call, not content).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolEnd, ToolStart


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
            if not head or (self._marker and self._marker.startswith(head)):
                return []  # nothing yet, or what may still become the marker
            self._decided = True
            if head[0] in "{[" and not (self._marker and head.startswith(self._marker)):
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
        calls, rest = self._parse(self._calls_text)
        if not calls:
            return [Text(self._prefix + self._calls_text)]
        deltas: list[Delta] = []
        for name, arguments, markup in calls:
            deltas.append(ToolStart(self._calls, f"call_{uuid.uuid4().hex[:24]}", name))
            deltas.append(ToolArguments(self._calls, json.dumps(arguments)))
            deltas.append(ToolEnd(self._calls, markup))
            self._calls += 1
        return [*deltas, Text(rest)] if rest else deltas

    def _parse(self, text: str) -> tuple[list[tuple[str, Any, str]], str]:
        """The calls in `text` (name, arguments, markup), and what follows the last whole one:
        all of a JSON value, or the calls a list completed before the text ended."""
        try:
            value = json.loads(text)
        except ValueError:
            return self._completed(text)
        items = value if isinstance(value, list) else [value]
        calls = [self._call(item, json.dumps(item)) for item in items]
        if not calls or None in calls:
            return [], text
        return [c for c in calls if c is not None], ""

    def _completed(self, text: str) -> tuple[list[tuple[str, Any, str]], str]:
        """The calls a list completed before the text's end cut it off; all of `text` when
        there were none."""
        head = text.lstrip()
        if not head.startswith("["):
            return [], text
        decoder = json.JSONDecoder()
        calls: list[tuple[str, Any, str]] = []
        at = len(text) - len(head) + 1
        while True:
            at += len(text[at:]) - len(text[at:].lstrip(" \t\r\n,"))
            try:
                item, end = decoder.raw_decode(text, at)
            except ValueError:
                return calls, "" if calls else text
            call = self._call(item, text[at:end])
            if call is None:
                return [], text
            calls.append(call)
            at = end

    def _call(self, item: Any, markup: str) -> tuple[str, Any, str] | None:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments: Any = next((item[k] for k in self._keys if k in item), {})
        return item["name"], arguments, markup


def llama3_json() -> JsonCallsParser:
    """Llama 3.1-3.3: a JSON object with "parameters", maybe after <|python_tag|>."""
    return JsonCallsParser("<|python_tag|>", arguments_keys=("parameters", "arguments"))


def mistral() -> JsonCallsParser:
    """Mistral: [TOOL_CALLS] then a JSON array of {"name", "arguments"}."""
    return JsonCallsParser("[TOOL_CALLS]", arguments_keys=("arguments",))


def bare_json() -> JsonCallsParser:
    """Fallback: an answer that is a JSON object {"name", "arguments"} is a call."""
    return JsonCallsParser("", arguments_keys=("arguments", "parameters"))


GRANITE = "<|tool_call|>"
FIREFUNCTION = "functools"


def granite() -> JsonCallsParser:
    """Granite 3.x: <|tool_call|> then a JSON array of {"name", "arguments"}."""
    return JsonCallsParser(GRANITE, arguments_keys=("arguments",))


def firefunction() -> JsonCallsParser:
    """firefunction-v2: functools then a JSON array of {"name", "arguments"}."""
    return JsonCallsParser(FIREFUNCTION, arguments_keys=("arguments",))
