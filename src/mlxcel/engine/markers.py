"""Markers in a grammar: the special tokens they are in a model's vocabulary, else text.

A tool-call format's markers (`<tool_call>`, `[TOOL_CALLS]`, `<|python_tag|>`) are single
special tokens in the vocabularies of the models that use them, and llguidance matches a
special token only where the grammar names it as a token (`<[id]>`), never through its text:
a grammar that spells `<tool_call>` as text bans the one token Qwen2.5 writes it as. So a
forcing grammar in lark refers to its markers as rules (`marker_0`, ...), and the engine that
knows the vocabulary defines them. A GBNF grammar writes them as text (llama.cpp's grammar
sampler matches a special token by its text); where llguidance runs it, its string literals are
split at the markers, which become those rules too (`marked_literals`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

# The prefix of the rules a grammar uses for its markers, numbered from 0 in order.
MARKER_RULE = "marker_"


def marker_rule(index: int) -> str:
    """The name of the rule that stands for a grammar's marker number `index`."""
    return f"{MARKER_RULE}{index}"


# A lark string literal, as llguidance's GBNF conversion writes them (JSON-escaped), and the
# start of a definition (a terminal's name is upper case, a rule's lower case).
# A regular expression (`/.../`) is matched first, so that a quote inside one is no literal's.
_LITERAL = re.compile(r'/(?:[^/\\\n]|\\.)+/|"(?:[^"\\\n]|\\.)*"')
_DEFINITION = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):", re.MULTILINE)


def spelled(text: str, markers: Sequence[str]) -> str:
    """`text` as a lark sequence: string literals, with each of `markers` as its rule."""
    found = [(at, i) for i, m in enumerate(markers) if (at := text.find(m)) >= 0]
    if not found:
        return json.dumps(text) if text else ""
    at, index = min(found)
    rest = text[at + len(markers[index]) :]
    parts = [spelled(text[:at], markers), marker_rule(index), spelled(rest, markers)]
    return " ".join(part for part in parts if part)


def marked_literals(lark: str, markers: Sequence[str]) -> str:
    """`lark` with every string literal that holds a marker split around its rule, and each
    terminal that then holds one (or a terminal that does) made a rule: a special token may
    stand in a rule only."""

    def split(match: re.Match[str]) -> str:
        if match.group(0).startswith("/"):
            return match.group(0)
        text = json.loads(match.group(0))
        if not any(marker in text for marker in markers):
            return match.group(0)
        return f"({spelled(text, markers)})"

    lark = _LITERAL.sub(split, lark)
    starts = list(_DEFINITION.finditer(lark))
    bodies = {
        match.group(1): lark[match.end() : starts[i + 1].start() if i + 1 < len(starts) else None]
        for i, match in enumerate(starts)
    }
    promoted: set[str] = set()
    held = {MARKER_RULE}
    while True:
        more = {
            name
            for name, body in bodies.items()
            if name.isupper() and name not in promoted and any(h in body for h in held)
        }
        if not more:
            break
        promoted |= more
        held |= {re.escape(name) for name in more}
        held = {h for h in held if h}
    for name in promoted:
        lark = re.sub(rf"\b{name}\b", name.lower(), lark)
    return lark


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
