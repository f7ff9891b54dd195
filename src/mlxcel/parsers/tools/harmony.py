"""gpt-oss "harmony" output: analysis, commentary and final channels, and function calls.

The format (openai/harmony, docs/format.md): after the prompt's `<|start|>assistant` the model
writes messages `{header}<|message|>{body}` ended by `<|end|>` (another message follows with
`<|start|>assistant`), `<|call|>` (a tool call) or `<|return|>` (done). The header holds
`<|channel|>NAME`, optionally a recipient `to=functions.NAME` (before or after the channel) and
a content type (`json` or `<|constrain|>json`).

openai-harmony's StreamableParser is not used: it parses token ids of the o200k_harmony
vocabulary, which `load_harmony_encoding` downloads on first use (the wheel ships none), so
offline it fails with "error downloading or loading vocab file". Our engines hand parsers text
in which the special tokens arrive rendered ("<|channel|>"), so this is a text-level state
machine instead.
"""

from __future__ import annotations

import re
import uuid

from mlxcel.parsers.markup import held_prefix
from mlxcel.parsers.tools.base import Delta, Reasoning, Text, ToolArguments, ToolEnd, ToolStart
from mlxcel.parsers.tools.grammar import Tools, json_rules, literal, parameters

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CALL, RETURN, CHANNEL = "<|call|>", "<|return|>", "<|channel|>"
MARKERS = (START, END, MESSAGE, CALL, RETURN, CHANNEL, "<|constrain|>")
# `<|start|>` ends a body too, so a message whose `<|end|>` is missing loses nothing after it.
_BODY_ENDS = (END, CALL, RETURN, START)
_HEADER_STARTS = (CHANNEL, "to=", "assistant")
# A header longer than this with no <|message|> is not a header: the text is content.
_HEADER_LIMIT = 256
_HEADER = re.compile(
    r"\s*(?:assistant)?\s*(?:to=(?P<early>[^\s<]+))?\s*"
    r"(?:<\|channel\|>\s*(?P<channel>\w+)\s*(?:to=(?P<late>[^\s<]+))?)?\s*"
    r"(?:(?:<\|constrain\|>)?\s*[\w./+-]+)?\s*"
)
_FUNCTIONS = "functions."


def _earliest(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """Where the first of `markers` in `text` is, and which; (-1, "") when none is."""
    found = [(at, marker) for marker in markers if (at := text.find(marker)) >= 0]
    return min(found) if found else (-1, "")


class HarmonyParser:
    """Reasoning for analysis, content for final and preambles, calls for `to=functions.*`."""

    def __init__(self) -> None:
        self._buffer = ""
        self._in_body = False
        self._opened = ""  # the <|start|> of the header being read, echoed if it is malformed
        self._kind = "content"
        self._calls = 0
        self._markup = ""  # the call being read, from its header

    def feed(self, text: str) -> list[Delta]:
        """Deltas that `text` completes; a marker that may still be arriving is held back."""
        self._buffer += text
        deltas: list[Delta] = []
        while self._body(deltas) if self._in_body else self._header(deltas):
            pass
        return deltas

    def finish(self) -> list[Delta]:
        """What is held back: an unfinished header is content, an unfinished body its kind's."""
        rest, self._buffer = self._buffer, ""
        if self._in_body and self._kind == "call":
            # <|call|> is a stop token: the text often ends without it.
            return [*self._emit(rest), self._end_call(closed=False)]
        if self._in_body:
            return self._emit(rest)
        rest, self._opened = self._opened + rest, ""
        return [Text(rest)] if rest.strip() else []

    def _header(self, deltas: list[Delta]) -> bool:
        if not self._opened:
            head = self._buffer.lstrip()
            if head.startswith(START):
                self._opened, self._buffer = START, head[len(START) :]
            elif START.startswith(head):
                return False
        at, marker = _earliest(self._buffer, (MESSAGE, *_BODY_ENDS))
        if self._plausible(self._buffer[:at] if at >= 0 else self._buffer):
            if marker == MESSAGE:
                header, self._buffer = self._buffer[:at], self._buffer[at + len(MESSAGE) :]
                deltas.extend(self._open(header))
                return True
            if at < 0:
                return False
        # Not a header: what was read is content, up to any marker that ends a message.
        if self._opened:
            deltas.append(Text(self._opened))
        self._opened, self._in_body, self._kind = "", True, "content"
        return True

    def _body(self, deltas: list[Delta]) -> bool:
        at, marker = _earliest(self._buffer, _BODY_ENDS)
        if at < 0:
            cut = len(self._buffer) - max(held_prefix(self._buffer, end) for end in _BODY_ENDS)
            ready, self._buffer = self._buffer[:cut], self._buffer[cut:]
            deltas.extend(self._emit(ready))
            return False
        deltas.extend(self._emit(self._buffer[:at]))
        # A <|start|> stays for the next header to read.
        self._buffer = self._buffer[at if marker == START else at + len(marker) :]
        if self._kind == "call":
            self._markup += "" if marker == START else marker
            deltas.append(self._end_call(closed=True))
        self._in_body = False
        return True

    def _end_call(self, *, closed: bool) -> ToolEnd:
        end = ToolEnd(self._calls, self._markup, closed)
        self._calls, self._markup = self._calls + 1, ""
        return end

    def _open(self, header: str) -> list[Delta]:
        """Start a message's body; the deltas its header gives (a call's start, or echo)."""
        opened, self._opened, self._in_body = self._opened, "", True
        match = _HEADER.fullmatch(header)
        recipient = (match["early"] or match["late"] or "") if match else ""
        # Every message names its channel or its recipient (the guide's "Valid channels").
        if match is None or not (recipient or match["channel"]):
            self._kind = "content"
            return [Text(opened + header + MESSAGE)]
        name = recipient.removeprefix(_FUNCTIONS) if recipient.startswith(_FUNCTIONS) else ""
        if name:
            self._kind, self._markup = "call", opened + header + MESSAGE
            return [ToolStart(self._calls, f"call_{uuid.uuid4().hex[:24]}", name)]
        # Built-in tools (browser, python) are addressed from the chain of thought.
        self._kind = "reasoning" if recipient or match["channel"] == "analysis" else "content"
        return []

    def _emit(self, text: str) -> list[Delta]:
        if not text:
            return []
        if self._kind == "call":
            self._markup += text
            return [ToolArguments(self._calls, text)]
        return [Reasoning(text) if self._kind == "reasoning" else Text(text)]

    @staticmethod
    def _plausible(header: str) -> bool:
        """Whether `header` may still become a message header."""
        head = header.lstrip()
        starts = any(s.startswith(head) or head.startswith(s) for s in _HEADER_STARTS)
        return starts and len(header) <= _HEADER_LIMIT


def forced_grammar(tools: Tools, parallel: bool) -> str:
    """GBNF for one call to `tools` as gpt-oss writes it, JSON arguments by the schema.

    A harmony turn holds one call (`<|call|>` ends generation), so `parallel` has no effect.
    """
    converter = json_rules()
    calls = []
    for i, tool in enumerate(tools):
        arguments = converter.visit(parameters(converter, tool, i), f"arg-{i}")
        header = f"{CHANNEL}commentary to={_FUNCTIONS}{tool['function']['name']} "
        calls.append(f"{literal(header + '<|constrain|>json' + MESSAGE)} {arguments}")
    return f"root ::= {' | '.join(calls)}\n{converter.format_grammar()}"
