"""Chat messages and tools as real templates read them, whatever shape an agent sent.

Agent frameworks send back assistant turns that made calls with content "" or null, tool results
with or without a name, system and developer messages; templates were written for one shape each
(Qwen3's tests `'</think>' in content`, DeepSeek-R1's adds the arguments to a string, Gemma 2
refuses a system message, Phi-3.5 drops tool results). As llama.cpp's template polyfills do, the
messages are given in the shape every template reads: content always a string, arguments a
mapping that also reads as its JSON text, a developer message as a system one where the template
knows no developer, tool results as user turns where it knows no tool role, call ids of 9
characters where Mistral's templates demand them, and (`without_system`, for a template that
refuses one) the system text in the first user turn.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

# A template that handles tool results compares a role with 'tool' (or ipython, Llama's); one
# that knows the developer role names it so.
_TOOL_ROLE = re.compile(r"""['"](tool|ipython)['"]""")
_DEVELOPER_ROLE = re.compile(r"""['"]developer['"]""")
# Mistral's templates refuse call ids that are not 9 characters (their own tokenizer's ids).
_NINE_CHARACTER_IDS = re.compile(r"id\s*\|\s*length\s*!=\s*9")


class Arguments(dict[str, Any]):
    """A call's arguments: a mapping (`| tojson`, `.items()`), and its JSON text where a
    template adds it to a string or prints it."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other: object) -> Any:
        return str(self) + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other: object) -> Any:
        return other + str(self) if isinstance(other, str) else NotImplemented


def template_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools with the fields templates read of each function, empty where the client left
    them out (a description is optional in OpenAI's API, and templates print it)."""
    return [
        {
            **tool,
            "function": {
                "description": "",
                "parameters": {"type": "object", "properties": {}},
                **tool["function"],
            },
        }
        for tool in tools
    ]


def shaped_messages(source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` in the shape every template reads (see the module's docstring)."""
    developer = _DEVELOPER_ROLE.search(source) is not None
    tool_role = _TOOL_ROLE.search(source) is not None
    short_ids = _NINE_CHARACTER_IDS.search(source) is not None
    shaped: list[dict[str, Any]] = []
    for message in messages:
        message = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            message["tool_calls"] = [
                _with_mapping(call, short_ids) for call in message["tool_calls"]
            ]
        if short_ids and isinstance(message.get("tool_call_id"), str):
            message["tool_call_id"] = _nine(message["tool_call_id"])
        if message["role"] == "developer" and not developer:
            message["role"] = "system"
        if message["role"] == "tool" and not tool_role:
            message = {"role": "user", "content": _tool_result(message)}
        if shaped and message["role"] == "system" == shaped[-1]["role"]:
            joined = f"{shaped[-1]['content']}\n\n{message['content']}"
            shaped[-1] = {**shaped[-1], "content": joined}
            continue
        shaped.append(message)
    return shaped


def without_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The system message's text at the head of the first user turn, for a template that
    refuses system messages; None when there is none to move."""
    if not messages or messages[0]["role"] != "system" or len(messages) < 2:
        return None
    system, first, *rest = messages
    if first["role"] != "user":
        return None
    return [{**first, "content": f"{system['content']}\n\n{first['content']}"}, *rest]


def _nine(call_id: str) -> str:
    """A call id as 9 alphanumeric characters, the same for the call and its result."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _with_mapping(call: dict[str, Any], short_ids: bool) -> dict[str, Any]:
    if short_ids and isinstance(call.get("id"), str):
        call = {**call, "id": _nine(call["id"])}
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": Arguments(arguments)}}


def _tool_result(message: dict[str, Any]) -> str:
    result = {"tool_response": {"content": message["content"]}}
    if message.get("name"):
        result["tool_response"]["tool"] = message["name"]
    return json.dumps(result, ensure_ascii=False)
