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

# What "auto" means until more formats (and detection from the chat template) exist.
DEFAULT_PARSER = "hermes"


__all__ = [
    "CALL_SHAPES",
    "DEFAULT_PARSER",
    "PARSERS",
    "Delta",
    "Text",
    "ToolArguments",
    "ToolCallParser",
    "ToolStart",
]
