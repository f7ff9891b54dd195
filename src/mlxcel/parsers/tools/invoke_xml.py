"""Calls as XML invokes inside a block: MiniMax-M2's and DeepSeek-V3.2's and V4's (DSML) formats,
and the grammar that forces them.

    <minimax:tool_call>
    <invoke name="get_weather"><parameter name="city">Paris</parameter></invoke>
    </minimax:tool_call>

DeepSeek-V3.2 writes the same with `|DSML|` before each tag name (`<|DSML|function_calls>`,
`<|DSML|invoke name=...>`; `|` the fullwidth bar U+FF5C in the real markup) and says of each
parameter whether it is a string (`string="true"`) or JSON. A string value is written as it is,
anything else as JSON, so where the tag does not say, the parameters schema does (as for
Qwen3-Coder's values). Each invoke goes out once it has closed.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolEnd, ToolStart
from mlxcel.parsers.tools.grammar import Tools, calls_rule, json_rules, literal
from mlxcel.parsers.tools.qwen3_coder import RAW_TEXT, convert, parameter_rules, schema_types
from mlxcel.parsers.tools.tagged import TaggedCallsParser


@dataclass(frozen=True)
class InvokeFormat:
    """A family's block markers and the prefix of its tag names."""

    begin: str
    end: str
    prefix: str

    def tag(self, name: str) -> str:
        """The start of a tag `name` (its attributes follow)."""
        return f"<{self.prefix}{name}"

    @property
    def markers(self) -> tuple[str, ...]:
        """The block's markers: special tokens in the family's vocabulary."""
        return (self.begin, self.end)


MINIMAX = InvokeFormat("<minimax:tool_call>", "</minimax:tool_call>", "")
DSML = "\uff5cDSML\uff5c"
DEEPSEEK_V32 = InvokeFormat(f"<{DSML}function_calls>", f"</{DSML}function_calls>", DSML)
# DeepSeek-V4 calls its block tool_calls.
DEEPSEEK_V4 = InvokeFormat(f"<{DSML}tool_calls>", f"</{DSML}tool_calls>", DSML)
_OUTSIDE, _BLOCK = range(2)


class InvokeCallsParser(TaggedCallsParser):
    """Content outside the block; inside, each invoke read whole once it closes."""

    def __init__(self, form: InvokeFormat, tools: Tools | None = None) -> None:
        super().__init__()
        self.OPENINGS = (form.begin,)
        self._form = form
        self._schemas = {
            t["function"]["name"]: t["function"].get("parameters") for t in tools or []
        }
        p = re.escape(form.prefix)
        self._invoke = re.compile(rf'\s*<{p}invoke name="([^"]+)">(.*?)</{p}invoke>', re.DOTALL)
        self._parameter = re.compile(
            rf'<{p}parameter name="([^"]+)"(?: string="(true|false)")?>(.*?)</{p}parameter>',
            re.DOTALL,
        )

    def finish(self) -> list[Delta]:
        rest, raw, state = self._buffer, self._raw, self._state
        self._buffer, self._raw, self._state = "", "", _OUTSIDE
        if state == _OUTSIDE:
            return [Text(rest)] if rest else []
        if not raw and self._form.end.startswith(rest.strip()):
            return []  # after an invoke, (the start of) the block's end
        # An invoke the text ended in: markup that may be dropped, else content.
        return [ToolEnd(self._calls, raw + rest, closed=False)]

    def _step(self, deltas: list[Delta]) -> bool:
        if self._state == _OUTSIDE:
            if self._opening(deltas) is None:
                return False
            self._state = _BLOCK
            return True
        head = self._buffer.lstrip()
        if head.startswith(self._form.end):
            self._buffer, self._raw, self._state = head[len(self._form.end) :], "", _OUTSIDE
            return True
        match = self._invoke.match(self._buffer)
        if match is not None:
            self._buffer = self._buffer[match.end() :]
            self._raw = ""
            self._call(match.group(1), match.group(2), match.group(0), deltas)
            return True
        opening = self._form.tag("invoke")
        if opening.startswith(head[: len(opening)]) or self._form.end.startswith(head):
            return False  # an invoke or the block's end still arriving
        return self._not_a_call(deltas)

    def _call(self, name: str, body: str, markup: str, deltas: list[Delta]) -> None:
        properties = (self._schemas.get(name) or {}).get("properties") or {}
        arguments: dict[str, Any] = {}
        for key, is_string, raw in self._parameter.findall(body):
            schema = {"type": "string"} if is_string == "true" else properties.get(key)
            arguments[key] = convert(raw, schema) if is_string != "false" else _json(raw)
        index, self._calls = self._calls, self._calls + 1
        deltas.append(ToolStart(index, f"call_{uuid.uuid4().hex[:24]}", name))
        deltas.append(ToolArguments(index, json.dumps(arguments, ensure_ascii=False)))
        deltas.append(ToolEnd(index, markup))


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def minimax_m2(tools: Tools | None = None) -> InvokeCallsParser:
    """MiniMax-M2: <minimax:tool_call> blocks of invokes."""
    return InvokeCallsParser(MINIMAX, tools)


def deepseek_v32(tools: Tools | None = None) -> InvokeCallsParser:
    """DeepSeek-V3.2: DSML function_calls blocks of invokes."""
    return InvokeCallsParser(DEEPSEEK_V32, tools)


def deepseek_v4(tools: Tools | None = None) -> InvokeCallsParser:
    """DeepSeek-V4: DSML tool_calls blocks of invokes."""
    return InvokeCallsParser(DEEPSEEK_V4, tools)


def forced_grammar(form: InvokeFormat) -> Callable[[Tools, bool], str]:
    """The GBNF builder for calls to `tools` in `form`'s block; required parameters appear."""

    def build(tools: Tools, parallel: bool) -> str:
        converter = json_rules()
        rules = [f"root ::= {calls_rule('fc-call', form.begin + chr(10), None, form.end)}"]
        for i, tool in enumerate(tools):
            properties = (tool["function"].get("parameters") or {}).get("properties") or {}

            def opening(key: str, properties: dict[str, Any] = properties) -> str:
                kind = "true" if schema_types(properties.get(key) or {}) == {"string"} else "false"
                typed = f' string="{kind}"' if form.prefix else ""
                return f'{form.tag("parameter")} name="{key}"{typed}>'

            closing = literal(f"</{form.prefix}parameter>")
            name = tool["function"]["name"]
            parts = [literal(f'{form.tag("invoke")} name="{name}">')]
            parts += parameter_rules(converter, tool, i, opening, closing)
            parts.append(literal(f"</{form.prefix}invoke>\n"))
            rules.append(f"fc-invoke-{i} ::= {' '.join(parts)}")
        invokes = " | ".join(f"fc-invoke-{i}" for i in range(len(tools)))
        rules.append(f"fc-call ::= ({invokes}){'+' if parallel else ''}")
        rules.append(f"fc-text ::= {RAW_TEXT}")
        return "\n".join([*rules, converter.format_grammar()])

    return build
