"""DeepSeek-V3 / R1-0528 calls (and V3.1's shorter shape), and the grammar that forces them.

    <|tool_calls_begin|><|tool_call_begin|>function<|tool_sep|>get_weather
    ```json
    {"city": "Paris"}
    ```<|tool_call_end|><|tool_calls_end|>

(here `|` stands for the fullwidth bar U+FF5C and `_` inside a tag for U+2581, as in the real
markup). V3.1 writes `<|tool_call_begin|>get_weather<|tool_sep|>{"city": "Paris"}<|tool_call_end|>`.
Calls follow one another inside the calls block (V3 puts a newline between them). A call starts
once its name is whole; its JSON arguments stream as they come, the code fence left out.
"""

from __future__ import annotations

import re
import uuid

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, ToolStart
from mlxcel.parsers.tools.grammar import Tools, calls_rule, json_rules, literal, parameters
from mlxcel.parsers.tools.sectioned import SectionedCallsParser


def _markup(words: str) -> str:
    """A DeepSeek tag: "tool sep" is <|tool_sep|> with its fullwidth bars and U+2581 joiners."""
    return "<\uff5c" + "\u2581".join(words.split()) + "\uff5c>"


CALLS_BEGIN, CALLS_END = _markup("tool calls begin"), _markup("tool calls end")
CALL_BEGIN, CALL_END = _markup("tool call begin"), _markup("tool call end")
SEP = _markup("tool sep")
MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
# The part before SEP (V3's type or V3.1's name), and V3's name after it.
_NAME = re.compile(r"[^\s<>{}`\"]*")
# Held at the end of the arguments: they may be the closing code fence.
_FENCE_TAIL = " \t\r\n`"


class DeepSeekV3Parser(SectionedCallsParser):
    """Content outside the calls block; inside, each call's name, then its arguments."""

    OPENINGS = (CALLS_BEGIN, CALL_BEGIN)
    SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END = CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END
    TRAILING = _FENCE_TAIL

    def _head(self, deltas: list[Delta]) -> bool:
        sep = self._buffer.find(SEP)
        before = self._buffer if sep < 0 else self._buffer[:sep]
        if sep < 0:
            before = before[: len(before) - held_prefix(before, SEP)]
        if not _NAME.fullmatch(before.strip()):
            return self._not_a_call(deltas)
        after = self._buffer[sep + len(SEP) :].lstrip() if sep >= 0 else ""
        if not after:
            return False
        if after[0] in "{`":  # V3.1: the name came before the separator
            name, rest = before.strip(), after
        else:  # V3: a type before the separator, the name after it up to its line's end
            match = _NAME.match(after)
            end = match.end() if match else 0
            if end == len(after):
                return False
            if after[end] not in "\n`{":
                return self._not_a_call(deltas)
            name, rest = after[:end], after[end:]
        if not name:
            return self._not_a_call(deltas)
        self._calls += 1
        deltas.append(ToolStart(self._calls - 1, f"call_{uuid.uuid4().hex[:24]}", name))
        self._start_arguments(rest)
        return True

    def _arguments_start(self, body: str, whole: bool) -> int | None:
        """Past the whitespace and a "```json" line."""
        lead = len(body) - len(body.lstrip())
        if not body[lead:].startswith("`"):
            return lead if lead < len(body) or whole else None
        newline = body.find("\n", lead)
        if newline >= 0:
            return newline + 1
        return lead if whole else None


_CALL_OPEN = literal(CALL_BEGIN + "function" + SEP)
_FENCE_OPEN = "\n```json\n"
_CALL_CLOSE = literal("\n```" + CALL_END)


def forced_grammar(tools: Tools, parallel: bool) -> str:
    """GBNF for calls to `tools` in V3's shape, with the parameters schema's JSON arguments."""
    converter = json_rules()
    functions = []
    for i, tool in enumerate(tools):
        arguments = converter.visit(parameters(converter, tool, i), f"arg-{i}")
        functions.append(f"{literal(tool['function']['name'] + _FENCE_OPEN)} {arguments}")
    root = calls_rule("fc-call", CALLS_BEGIN, "\n" if parallel else None, CALLS_END)
    call = f"{_CALL_OPEN} ({' | '.join(functions)}) {_CALL_CLOSE}"
    return f"root ::= {root}\nfc-call ::= {call}\n{converter.format_grammar()}"
