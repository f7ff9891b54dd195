"""Tool-call parsers behind a registry keyed by name."""

from __future__ import annotations

from collections.abc import Callable

from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolCallParser, ToolStart
from mlxcel.parsers.tools.hermes import HermesParser
from mlxcel.parsers.tools.json_calls import bare_json, llama3_json, mistral

PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3_json": llama3_json,
    "mistral": mistral,
    "json": bare_json,
}

# How each format writes calls, for the grammar that forces one: the key its arguments go
# under, and (opening, separator, closing) around the calls; separator None allows one call.
CALL_SHAPES: dict[str, tuple[str, tuple[str, str | None, str]]] = {
    "hermes": ("arguments", ("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>")),
    "llama3_json": ("parameters", ("", None, "")),
    "mistral": ("arguments", ("[", ", ", "]")),
    "json": ("arguments", ("", None, "")),
}

# Markup a chat template writes for tool calls, and the parser that reads it (first match).
_TEMPLATE_MARKERS = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
)
# For templates that show no call markup: the format the forcing grammar writes best.
DEFAULT_PARSER = "hermes"


def detect_parser(template_source: str | None) -> str:
    """The parser for the tool-call markup a chat template uses ('auto')."""
    for marker, name in _TEMPLATE_MARKERS:
        if template_source and marker in template_source:
            return name
    return DEFAULT_PARSER


__all__ = [
    "CALL_SHAPES",
    "DEFAULT_PARSER",
    "PARSERS",
    "Delta",
    "Text",
    "ToolArguments",
    "ToolCallParser",
    "ToolStart",
    "detect_parser",
]
