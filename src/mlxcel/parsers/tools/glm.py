"""GLM 4.5-4.7's calls, and the grammar that forces them.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

(GLM 4.7 writes the same without the newlines). As in Qwen3-Coder's format, the template writes a
string value as it is and anything else as JSON, so the function's parameters schema says how to
read a value back. A call starts once its name is whole; its JSON arguments grow by one key as
each value closes.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolEnd, ToolStart
from mlxcel.parsers.tools.grammar import Tools, calls_rule, json_rules, literal
from mlxcel.parsers.tools.qwen3_coder import RAW_TEXT, convert, parameter_rules
from mlxcel.parsers.tools.tagged import TaggedCallsParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
MARKERS = (OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END)
# A name runs to its line's end or the first tag; a "{" or a quote means it was JSON (Hermes).
_NAME = re.compile(r"\s*([^\s<>{}\"]+)\s*(?=<|$)")
# A key and its value, whole.
_PAIR = re.compile(rf"\s*{KEY}(.*?){KEY_END}\s*{VALUE}(.*?){VALUE_END}", re.DOTALL)
_OUTSIDE, _NAMING, _BODY = range(3)


class GlmParser(TaggedCallsParser):
    """Content outside calls; a call starts at its name, its arguments grow per value, typed by
    the parameters schema of `tools`."""

    OPENINGS = (OPEN,)

    def __init__(self, tools: Tools | None = None) -> None:
        super().__init__()
        self._schemas = {
            t["function"]["name"]: t["function"].get("parameters") for t in tools or []
        }
        self._properties: dict[str, Any] = {}
        self._pairs = 0
        self._markup = ""  # the started call's text read so far

    def finish(self) -> list[Delta]:
        rest, state = self._buffer, self._state
        self._buffer, self._state = "", _OUTSIDE
        if state == _BODY:  # a started call the text ended inside
            return [ToolEnd(self._calls - 1, self._markup + rest, closed=False)]
        if state == _NAMING:  # a call cut before its name ended: markup that may be dropped
            return [ToolEnd(self._calls, self._raw + rest, closed=False)]
        rest, self._raw = self._raw + rest, ""
        return [Text(rest)] if rest else []

    def _step(self, deltas: list[Delta]) -> bool:
        return (self._outside, self._naming, self._body)[self._state](deltas)

    def _outside(self, deltas: list[Delta]) -> bool:
        if self._opening(deltas) is None:
            return False
        self._state = _NAMING
        return True

    def _naming(self, deltas: list[Delta]) -> bool:
        end = min((at for m in (KEY, CLOSE, "\n") if (at := self._buffer.find(m)) >= 0), default=-1)
        if end < 0:
            return False
        match = _NAME.fullmatch(self._buffer[:end])
        if match is None:
            return self._not_a_call(deltas)
        name = match.group(1)
        self._calls += 1
        deltas.append(ToolStart(self._calls - 1, f"call_{uuid.uuid4().hex[:24]}", name))
        self._properties = (self._schemas.get(name) or {}).get("properties") or {}
        self._markup, self._raw, self._pairs = self._raw + self._buffer[:end], "", 0
        self._buffer, self._state = self._buffer[end:], _BODY
        return True

    def _body(self, deltas: list[Delta]) -> bool:
        head = self._buffer.lstrip()
        pair = _PAIR.match(self._buffer)
        if pair is not None:
            key, raw = pair.group(1).strip(), pair.group(2)
            typed = convert(raw, self._properties.get(key))
            text = f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(typed, ensure_ascii=False)}"
            deltas.append(ToolArguments(self._calls - 1, (", " if self._pairs else "{") + text))
            self._pairs += 1
            self._markup += self._buffer[: pair.end()]
            self._buffer = self._buffer[pair.end() :]
            return True
        if head.startswith(CLOSE):
            deltas.append(ToolArguments(self._calls - 1, "}" if self._pairs else "{}"))
            self._markup += self._buffer[: len(self._buffer) - len(head) + len(CLOSE)]
            deltas.append(ToolEnd(self._calls - 1, self._markup))
            self._buffer, self._markup, self._state = head[len(CLOSE) :], "", _OUTSIDE
            return True
        if head.startswith(KEY) or KEY.startswith(head) or CLOSE.startswith(head):
            return False  # a pair or the call's end still arriving
        deltas.append(ToolEnd(self._calls - 1, self._markup, closed=False))
        self._markup, self._state = "", _OUTSIDE  # not markup: the rest is content
        return True


_PAIR_CLOSE = literal(VALUE_END + "\n")


def _pair_opening(name: str) -> str:
    return f"{KEY}{name}{KEY_END}\n{VALUE}"


def forced_grammar(tools: Tools, parallel: bool) -> str:
    """GBNF for calls to `tools` in GLM 4.6's shape; each required parameter must appear."""
    converter = json_rules()
    rules = [f"root ::= {calls_rule('fc-call', '', chr(10) if parallel else None, '')}"]
    for i, tool in enumerate(tools):
        parts = [literal(OPEN + tool["function"]["name"] + "\n")]
        parts += parameter_rules(converter, tool, i, _pair_opening, _PAIR_CLOSE)
        parts.append(literal(CLOSE))
        rules.append(f"fc-call-{i} ::= {' '.join(parts)}")
    rules.append(f"fc-call ::= {' | '.join(f'fc-call-{i}' for i in range(len(tools)))}")
    rules.append(f"fc-text ::= {RAW_TEXT}")
    return "\n".join([*rules, converter.format_grammar()])
