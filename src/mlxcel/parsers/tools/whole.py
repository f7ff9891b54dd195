"""Only whole calls go out: each call is held until it ends, then sent as a call or as content.

A client cannot take back a tool call it was sent, so a call's deltas wait for its ToolEnd:
with arguments that are JSON it goes out as a call (renumbered, so the calls sent count up
from 0); otherwise its markup goes out as content. At the end of the text, a call that had not
closed is content when the text was cut off (max_tokens), and a call when it was not (a stop
token, such as gpt-oss's <|call|>, ends many calls); after whole calls, a call cut off is
dropped: it is the model's next call that max_tokens stopped, not content (a forced call that
repeats ran on until max_tokens, and its last repeat came back as markup).
"""

from __future__ import annotations

import json
from dataclasses import replace

from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolCallParser, ToolEnd, ToolStart


class WholeCalls:
    """A parser's deltas with every call held until it is known to be whole."""

    def __init__(self, parser: ToolCallParser, limit: int | None = None) -> None:
        self._parser = parser
        self._limit = limit
        """The most calls to send (`parallel_tool_calls: false`: 1); later ones are dropped."""
        self._held: list[ToolStart | ToolArguments] = []
        self.calls = 0
        """Calls sent so far."""

    def feed(self, text: str) -> list[Delta]:
        """Deltas for new text; a call's come once it has ended."""
        return self._settle(self._parser.feed(text), truncated=False)

    def finish(self, truncated: bool = False) -> list[Delta]:
        """Deltas for what was held back; `truncated`: the text was cut off, not ended."""
        return self._settle(self._parser.finish(), truncated=truncated)

    def _settle(self, deltas: list[Delta], *, truncated: bool) -> list[Delta]:
        out: list[Delta] = []
        for delta in deltas:
            if isinstance(delta, ToolEnd):
                out += self._release(delta, truncated)
            elif isinstance(delta, (ToolStart, ToolArguments)):
                self._held.append(delta)
            else:
                out.append(delta)
        return out

    def _release(self, end: ToolEnd, truncated: bool) -> list[Delta]:
        held, self._held = self._held, []
        arguments = "".join(d.fragment for d in held if isinstance(d, ToolArguments))
        if truncated and not end.closed and self.calls:
            return []
        if (truncated and not end.closed) or not _is_json(arguments):
            return [Text(end.markup)]
        if self._limit is not None and self.calls >= self._limit:
            return []
        index, self.calls = self.calls, self.calls + 1
        return [replace(d, index=index) for d in held]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
