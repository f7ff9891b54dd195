"""Markers in a lark grammar: the special tokens they are in a model's vocabulary, else text.

A tool-call format's markers (`<tool_call>`, `[TOOL_CALLS]`, `<|python_tag|>`) are single
special tokens in the vocabularies of the models that use them, and llguidance matches a
special token only where the grammar names it as a token (`<[id]>`), never through its text:
a grammar that spells `<tool_call>` as text bans the one token Qwen2.5 writes it as. So a
forcing grammar refers to its markers as rules (`marker_0`, ...), and the engine that knows the
vocabulary defines them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

# The prefix of the rules a grammar uses for its markers, numbered from 0 in order.
MARKER_RULE = "marker_"


def marker_rule(index: int) -> str:
    """The name of the rule that stands for a grammar's marker number `index`."""
    return f"{MARKER_RULE}{index}"


def with_markers(
    grammar: str, markers: Sequence[str], special_token: Callable[[str], int | None]
) -> str:
    """`grammar` with its marker rules defined: the one special token `special_token` finds
    for a marker, else the marker's text."""
    rules = []
    for index, marker in enumerate(markers):
        token = special_token(marker)
        spelled = f"<[{token}]>" if token is not None else json.dumps(marker)
        rules.append(f"{marker_rule(index)}: {spelled}\n")
    return grammar + "".join(rules)


def as_text(marker: str) -> None:
    """No marker is a special token: for checking a grammar without a vocabulary."""
    return None
