"""Tool calls on the Responses API: function_call output items and their streamed events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from mlxcel.serving.tools import ToolStream, parse_message


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


def split_output(text: str, parser: str) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole answer as message text (None: no message) and function_call items."""
    content, calls = parse_message(text, parser)
    items = [
        function_call_item(c["id"], c["function"]["name"], c["function"]["arguments"], "completed")
        for c in calls
    ]
    return content, items


def assistant_turn(text: str | None, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The stored chat message for an answer, tool calls in the shape chat templates read."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
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


Emit = Callable[..., dict[str, Any]]


class ToolEvents:
    """Streams text and function calls as Responses output items, in the order they appear."""

    def __init__(self, parser: str, emit: Emit, message_item: Callable[..., dict[str, Any]]):
        self._stream = ToolStream(parser)
        self._emit = emit
        self._message_item = message_item
        self.items: list[dict[str, Any]] = []
        self._text: list[str] = []
        self._open: dict[str, Any] | None = None

    @property
    def text(self) -> str | None:
        """The message text so far (None: the answer has no message item)."""
        return "".join(self._text) if self._text else None

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Events for new model output."""
        return self._events(self._stream.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        """Events that close whatever is still open."""
        return [*self._events(self._stream.finish()), *self._close()]

    def _events(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.get("content"):
                out += self._content(delta["content"])
            for call in delta.get("tool_calls", []):
                out += self._call(call)
        return out

    def _content(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "message":
            out += self._close()
            self._open = self._message_item("in_progress", None)
            index = len(self.items)
            self.items.append(self._open)
            out.append(
                self._emit("response.output_item.added", output_index=index, item=self._open)
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._where("response.content_part.added", part=part))
        self._text.append(text)
        out.append(self._where("response.output_text.delta", delta=text, logprobs=[]))
        return out

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if "id" in call:
            out += self._close()
            function = call["function"]
            self._open = function_call_item(call["id"], function["name"], "", "in_progress")
            index = len(self.items)
            self.items.append(self._open)
            out.append(
                self._emit("response.output_item.added", output_index=index, item=self._open)
            )
        fragment = call["function"].get("arguments", "")
        if fragment and self._open is not None:
            self._open["arguments"] += fragment
            out.append(self._where("response.function_call_arguments.delta", delta=fragment))
        return out

    def _where(self, type_: str, **fields: Any) -> dict[str, Any]:
        assert self._open is not None
        where: dict[str, Any] = {"item_id": self._open["id"], "output_index": len(self.items) - 1}
        if self._open["type"] == "message":
            where["content_index"] = 0
        return self._emit(type_, **where, **fields)

    def _close(self) -> list[dict[str, Any]]:
        item, out = self._open, list[dict[str, Any]]()
        if item is None:
            return out
        if item["type"] == "message":
            text = "".join(self._text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item.update(status="completed", content=[part])
            out.append(self._where("response.output_text.done", text=text, logprobs=[]))
            out.append(self._where("response.content_part.done", part=part))
        else:
            item["status"] = "completed"
            arguments = item["arguments"]
            out.append(self._where("response.function_call_arguments.done", arguments=arguments))
        out.append(
            self._emit("response.output_item.done", output_index=len(self.items) - 1, item=item)
        )
        self._open = None
        return out
