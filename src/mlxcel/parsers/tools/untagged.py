"""Calls a model wrote without their markers: a JSON object (or a list of them) naming a
declared tool, at the start of the answer.

Small models drop the tags their template shows (Qwen2.5-Coder-0.5B answers "What's the weather
in Paris?" with a bare `{"name": "get_weather", "arguments": {"city": "Paris"}}`), as llama.cpp's
Hermes parser allows for. Only a declared tool's name makes such JSON a call, so a JSON answer
that names no tool stays the content it is. The first key and the name decide early, so a JSON
answer that is no call streams without waiting for its end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

# A call's JSON: the name, then its arguments under either key models use.
ARGUMENTS_KEYS = ("arguments", "parameters")
# The first key of an object (after a list's "["), whole or still arriving, and a name's value.
_FIRST_KEY = re.compile(r'\[?\s*\{\s*"((?:[^"\\]|\\.)*)("?)')
_NAME_VALUE = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)("?)')
_OPENING = re.compile(r"\[?\s*\{?\s*")
# Keys a call's object may open with.
_FIRST_KEYS = ("name", "type")
_DECODER = json.JSONDecoder()

# One call read: its name, its arguments, and its text.
Call = tuple[str, Any, str]


def may_be_calls(head: str, names: Collection[str]) -> bool:
    """Whether `head`, the start of an answer that opens with "{" or "[", can still become
    calls to `names` (False once its first key or its name rules that out)."""
    first = _FIRST_KEY.match(head)
    if first is None:
        # Nothing but "[", "{" and spaces yet, or a value that is no object with keys.
        return _OPENING.fullmatch(head) is not None
    key, whole = first.groups()
    if not any(k == key if whole else k.startswith(key) for k in _FIRST_KEYS):
        return False
    name = _NAME_VALUE.search(head)
    if name is None:
        return True
    value, whole = _unescaped(name.group(1)), name.group(2)
    return any(n == value if whole else n.startswith(value) for n in names)


def read_calls(head: str, names: Collection[str]) -> tuple[list[Call], int] | None:
    """The calls a whole JSON value at the start of `head` makes, and where it ends; None
    while the value is not whole, no calls (and 0) when it is not calls to `names`."""
    try:
        value, end = _DECODER.raw_decode(head)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names) for item in items]
    if not items or None in calls:
        return [], 0
    return [call for call in calls if call is not None], end


def _call(item: Any, names: Collection[str]) -> Call | None:
    if not isinstance(item, dict) or item.get("name") not in names:
        return None
    arguments: Any = next((item[key] for key in ARGUMENTS_KEYS if key in item), {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return item["name"], arguments, json.dumps(item)


def _unescaped(text: str) -> str:
    try:
        value = json.loads(f'"{text}"')
    except ValueError:
        return text
    return value if isinstance(value, str) else text
