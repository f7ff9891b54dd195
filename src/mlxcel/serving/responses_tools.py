"""Tool calls on the Responses API: function_call items and the turn stored for follow-ups."""

from __future__ import annotations

import json
import uuid
from typing import Any


def function_call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """A function_call output item."""
    return {
        "id": f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def assistant_turn(
    text: str | None, items: list[dict[str, Any]], reasoning: str | None = None
) -> dict[str, Any]:
    """The stored chat message for an answer, tool calls in the shape chat templates read."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if items:
        message["tool_calls"] = [
            {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": json.loads(item["arguments"])},
            }
            for item in items
        ]
    return message
