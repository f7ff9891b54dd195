"""A realtime conversation's items: checked as `conversation.item.create` sends them, kept in
OpenAI's item shape, and turned into the chat messages the text model answers."""

from __future__ import annotations

import json
import secrets
from typing import Any

from mlxcel.protocol.realtime import RealtimeError, fail, object_of, refuse_unknown, string_of

_CONTENT_TEXT = {"input_text", "text", "output_text"}
_CONTENT_AUDIO = {"input_audio", "output_audio", "audio"}


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: a prefix and 22 random characters."""
    return f"{prefix}_{secrets.token_urlsafe(16)[:22]}"


def user_audio_item(item_id: str, transcript: str | None) -> dict[str, Any]:
    """The user message an input audio buffer becomes."""
    content = {"type": "input_audio", "transcript": transcript}
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [content],
    }


def checked_item(body: Any) -> dict[str, Any]:
    """A client's item, with an id, in the shape the server reports it."""
    item = object_of(body, "item")
    kind = item.get("type", "message")
    item_id = string_of(item.get("id"), "item.id") or new_id("item")
    common = {"id": item_id, "object": "realtime.item", "status": "completed"}
    if kind == "message":
        refuse_unknown(item, {"type", "id", "role", "content", "status", "object"}, "item")
        role = item.get("role")
        if role not in ("user", "assistant", "system"):
            raise fail("item.role", "must be user, assistant or system")
        content = item.get("content")
        if not isinstance(content, list) or not content:
            raise fail("item.content", "must be a non-empty list of parts")
        parts = [_part(p, f"item.content[{i}]") for i, p in enumerate(content)]
        return {**common, "type": "message", "role": role, "content": parts}
    if kind == "function_call_output":
        refuse_unknown(item, {"type", "id", "call_id", "output", "status", "object"}, "item")
        call_id = string_of(item.get("call_id"), "item.call_id", optional=False)
        output = string_of(item.get("output"), "item.output", optional=False)
        return {**common, "type": kind, "call_id": call_id, "output": output}
    if kind == "function_call":
        known = {"type", "id", "call_id", "name", "arguments", "status", "object"}
        refuse_unknown(item, known, "item")
        name = string_of(item.get("name"), "item.name", optional=False)
        arguments = string_of(item.get("arguments"), "item.arguments", optional=False)
        call_id = string_of(item.get("call_id"), "item.call_id") or new_id("call")
        return {**common, "type": kind, "name": name, "arguments": arguments, "call_id": call_id}
    raise fail("item.type", "must be message, function_call or function_call_output")


def _part(body: Any, param: str) -> dict[str, Any]:
    part = object_of(body, param)
    kind = part.get("type")
    if kind in _CONTENT_TEXT:
        refuse_unknown(part, {"type", "text"}, param)
        return {"type": kind, "text": string_of(part.get("text"), f"{param}.text", optional=False)}
    if kind in _CONTENT_AUDIO:
        refuse_unknown(part, {"type", "audio", "transcript", "format"}, param)
        transcript = string_of(part.get("transcript"), f"{param}.transcript")
        if transcript is None:
            raise RealtimeError(
                f"'{param}.transcript' is required: audio in a created item is read by its "
                "transcript; send audio to be heard with input_audio_buffer.append",
                code="missing_required_parameter",
                param=f"{param}.transcript",
            )
        return {"type": kind, "transcript": transcript}
    raise fail(f"{param}.type", "must be input_text, text, output_text or input_audio")


def _text(item: dict[str, Any]) -> str:
    return "\n".join(
        str(part.get("text") if "text" in part else part.get("transcript") or "")
        for part in item["content"]
    ).strip()


def chat_messages(instructions: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as chat messages: instructions as the system message, tool calls and
    their outputs as the chat API has them."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        if item["type"] == "message":
            text = _text(item)
            if text:
                messages.append({"role": item["role"], "content": text})
        elif item["type"] == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            output = {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            messages.append(output)
    return messages


def chat_tools(tools: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """Realtime function tools in the chat API's shape."""
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["parameters"],
            },
        }
        for t in tools
    ]


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """A realtime tool_choice in the chat API's shape."""
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice["name"]}}


def arguments_text(arguments: Any) -> str:
    """A call's arguments as the JSON text the events carry."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
