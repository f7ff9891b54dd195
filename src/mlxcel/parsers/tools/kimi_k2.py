"""Kimi K2's calls, and the grammar that forces them.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(one line in the real markup). A call's id is `functions.NAME:INDEX`; its JSON arguments stream
as they come. The markers are special tokens in Kimi's vocabulary: the grammar names them so.
"""

from __future__ import annotations

import json
import re
import uuid

from mlxcel.engine.markers import marker_rule
from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, ToolStart
from mlxcel.parsers.tools.grammar import ForcedGrammar, Tools, arguments_schema
from mlxcel.parsers.tools.sectioned import SectionedCallsParser

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENTS_BEGIN, CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENTS_BEGIN, CALL_END)
# A call's id: the function's name (after an optional "functions.") and its index.
_ID = re.compile(r"\s*(?:functions\.)?([^\s:<>]+)(?::\d+)?\s*")


class KimiK2Parser(SectionedCallsParser):
    """Content outside the calls section; inside, each call's name, then its arguments."""

    OPENINGS = (SECTION_BEGIN, CALL_BEGIN)
    SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END = (
        SECTION_BEGIN,
        SECTION_END,
        CALL_BEGIN,
        CALL_END,
    )

    def _head(self, deltas: list[Delta]) -> bool:
        at = self._buffer.find(ARGUMENTS_BEGIN)
        if at < 0:
            if held_prefix(self._buffer, ARGUMENTS_BEGIN) or "<" not in self._buffer:
                return False
            return self._not_a_call(deltas)
        match = _ID.fullmatch(self._buffer[:at])
        if match is None:
            return self._not_a_call(deltas)
        self._calls += 1
        deltas.append(ToolStart(self._calls - 1, f"call_{uuid.uuid4().hex[:24]}", match.group(1)))
        self._start_arguments(self._buffer[at + len(ARGUMENTS_BEGIN) :])
        return True


def forced_grammar(tools: Tools, parallel: bool) -> ForcedGrammar:
    """Lark for calls to `tools` in a calls section, their arguments held to the parameters
    schema, the markers named as the special tokens they are."""
    section_begin, section_end, call_begin, arguments_begin, call_end = (
        marker_rule(i) for i in range(len(MARKERS))
    )
    calls = "call+" if parallel else "call"
    rules = [f"start: {section_begin} {calls} {section_end}"]
    names = []
    for i, tool in enumerate(tools):
        name = json.dumps(f"functions.{tool['function']['name']}:")
        names.append(f"{name} INDEX {arguments_begin} arguments_{i}")
        rules.append(f"arguments_{i}: %json {arguments_schema(tool)}")
    rules.append(f"call: {call_begin} ({' | '.join(names)}) {call_end}")
    # The call's number in the conversation: bounded, or a model may write digits to the end.
    rules.append("INDEX: /[0-9]{1,4}/")
    return ForcedGrammar("\n".join(rules) + "\n", "lark", MARKERS)
