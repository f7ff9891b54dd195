"""One choice's output split three ways as it streams: reasoning, content and tool calls.

Most models think in <think> tags (a reasoning parser) and call tools in their own markup (a
tool-call parser), read one after the other. gpt-oss writes all three as harmony channels, so
one harmony parser reads the whole answer instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxcel.parsers.reasoning import PARSERS as REASONING
from mlxcel.serving.tools import ToolPlan, ToolStream

CHANNELS = "harmony"
# Formats whose markers are control tokens: their text must reach the parser.
_SPECIAL_MARKUP = frozenset({CHANNELS, "gemma"})


def _channels(reasoning: str | None, tools: ToolPlan | None) -> bool:
    return reasoning == CHANNELS or (tools is not None and tools.parser == CHANNELS)


def renders_special_tokens(reasoning: str | None, tools: ToolPlan | None) -> bool:
    """Whether the parsers read markers that are control tokens: harmony's and Gemma's
    channels, and every tool-call format's markers, which are control tokens in some of the
    vocabularies that write them (as llama-server keeps a format's markers as text)."""
    return tools is not None or _channels(reasoning, tools) or reasoning in _SPECIAL_MARKUP


class AnswerStream:
    """Chat deltas for one choice: `reasoning_content`, `content` and `tool_calls` pieces."""

    def __init__(self, reasoning: str | None, tools: ToolPlan | None) -> None:
        channels = _channels(reasoning, tools)
        self._think = REASONING[reasoning]() if reasoning and not channels else None
        parser = CHANNELS if channels else (tools.parser if tools else None)
        self._calls = None
        if parser:
            self._calls = ToolStream(
                parser, tools.tools if tools else None, tools.parallel if tools else True
            )

    @property
    def calls(self) -> int:
        """Tool calls sent so far."""
        return self._calls.calls if self._calls else 0

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas for new model output; markup that may continue is held back."""
        return self._split(text, final=False)

    def finish(self, truncated: bool = False) -> list[dict[str, Any]]:
        """Deltas for whatever was held back; `truncated`: max_tokens cut the answer off, so a
        tool call it was writing is content."""
        return self._split("", final=True, truncated=truncated)

    def _split(self, text: str, *, final: bool, truncated: bool = False) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._think is not None:
            thought, text = self._think.feed(text) if text else ("", "")
            if final:
                more_thought, more_text = self._think.finish()
                thought, text = thought + more_thought, text + more_text
            if thought:
                out.append({"reasoning_content": thought})
        if self._calls is None:
            return [*out, {"content": text}] if text else out
        out += self._calls.feed(text) if text else []
        if final:
            out += self._calls.finish(truncated)
        return out


@dataclass
class Answer:
    """A whole answer, split."""

    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]]


def parse_answer(
    text: str, reasoning: str | None, tools: ToolPlan | None, truncated: bool = False
) -> Answer:
    """A whole answer, split as a stream of it is; `truncated`: max_tokens cut it off."""
    stream = AnswerStream(reasoning, tools)
    content: list[str] = []
    thoughts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for delta in stream.feed(text) + stream.finish(truncated):
        content.append(delta.get("content", ""))
        thoughts.append(delta.get("reasoning_content", ""))
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], {**call, "function": {"arguments": ""}})
            function = call["function"]
            entry["function"]["name"] = function.get("name", entry["function"].get("name"))
            entry["function"]["arguments"] += function.get("arguments", "")
    thought = "".join(thoughts) or None
    tool_calls = [{k: v for k, v in c.items() if k != "index"} for _, c in sorted(calls.items())]
    joined = "".join(content)
    if tool_calls:
        return Answer(joined.strip() or None, thought, tool_calls)
    return Answer(joined, thought, [])
