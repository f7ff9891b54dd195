"""Tool-call parsers behind a registry keyed by name."""

from __future__ import annotations

from collections.abc import Callable

from mlxcel.parsers.tools.base import Delta, Text, ToolArguments, ToolCallParser, ToolStart
from mlxcel.parsers.tools.hermes import HermesParser

PARSERS: dict[str, Callable[[], ToolCallParser]] = {"hermes": HermesParser}

# What "auto" means until more formats (and detection from the chat template) exist.
DEFAULT_PARSER = "hermes"


__all__ = [
    "DEFAULT_PARSER",
    "PARSERS",
    "Delta",
    "Text",
    "ToolArguments",
    "ToolCallParser",
    "ToolStart",
]
