"""A response's output items, built as the model's text streams in: reasoning, message, calls.

The same builder serves streamed and whole responses, so both end with the same items.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from mlxcel.serving.answer import AnswerStream
from mlxcel.serving.responses_tools import function_call_item
from mlxcel.serving.tools import ToolPlan

Emit = Callable[..., dict[str, Any]]


def output_text(text: str) -> dict[str, Any]:
    """An output_text content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_text(text: str) -> dict[str, Any]:
    """A reasoning_text content part."""
    return {"type": "reasoning_text", "text": text}


class OutputItems:
    """Turns model text into Responses output items and the typed events that stream them.

    `emit(type, **fields)` numbers an event; `message_id` is the message item's id.
    """

    def __init__(
        self,
        tools: ToolPlan | None,
        reasoning_parser: str | None,
        emit: Emit,
        message_id: str,
        *,
        reasoning_in_clear: bool = False,
    ) -> None:
        self._answer = AnswerStream(reasoning_parser, tools)
        self._reasoning_in_clear = reasoning_in_clear
        self._emit = emit
        self._message_id = message_id
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._open_text: list[str] = []
        self._parts: dict[str, list[str]] = {"message": [], "reasoning": []}

    @property
    def text(self) -> str | None:
        """The message text (None: the answer has no message item)."""
        return "".join(self._parts["message"]) if self._message() else None

    @property
    def reasoning(self) -> str | None:
        """The reasoning text (None: the model did not think aloud)."""
        return "".join(self._parts["reasoning"]) if self._parts["reasoning"] else None

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The function_call items."""
        return [item for item in self.items if item["type"] == "function_call"]

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Events for new model output."""
        return self._events(self._answer.feed(text))

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Events that flush what parsers held back and close every item with `status`."""
        # An incomplete (cut off) or failed response's unfinished call is message text.
        out = self._events(self._answer.finish(truncated=status != "completed"))
        if self._message() is None and not self.calls:
            out += self._open_message()  # an answer always has a message or a call
        out += self._close(status)
        for item in self.items:
            item["status"] = status
        return out

    def _message(self) -> dict[str, Any] | None:
        return next((item for item in self.items if item["type"] == "message"), None)

    def _events(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                out += self._reasoning(delta["reasoning_content"])
            if delta.get("content"):
                out += self._content(delta["content"])
            for call in delta.get("tool_calls", []):
                out += self._call(call)
        return out

    def _start(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close("completed")
        self._open, self._open_text = item, []
        self.items.append(item)
        index = len(self.items) - 1
        out.append(self._emit("response.output_item.added", output_index=index, item=dict(item)))
        return out

    def _open_message(self) -> list[dict[str, Any]]:
        item = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        out = self._start(item)
        out.append(self._where("response.content_part.added", part=output_text("")))
        return out

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "reasoning":
            item = {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            out += self._start(item)
            out.append(self._where("response.content_part.added", part=reasoning_text("")))
        self._parts["reasoning"].append(text)
        self._open_text.append(text)
        out.append(self._where("response.reasoning_text.delta", delta=text))
        return out

    def _content(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "message":
            out += self._open_message()
        self._parts["message"].append(text)
        self._open_text.append(text)
        out.append(self._where("response.output_text.delta", delta=text, logprobs=[]))
        return out

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if "id" in call:
            function = call["function"]
            out += self._start(function_call_item(call["id"], function["name"], "", "in_progress"))
        fragment = call["function"].get("arguments", "")
        if fragment and self._open is not None:
            self._open["arguments"] += fragment
            out.append(self._where("response.function_call_arguments.delta", delta=fragment))
        return out

    def _where(self, type_: str, **fields: Any) -> dict[str, Any]:
        assert self._open is not None
        where: dict[str, Any] = {"item_id": self._open["id"], "output_index": len(self.items) - 1}
        if self._open["type"] != "function_call":
            where["content_index"] = 0
        return self._emit(type_, **where, **fields)

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, out = self._open, list[dict[str, Any]]()
        if item is None:
            return out
        if item["type"] == "function_call":
            item["status"] = status
            arguments = item["arguments"]
            out.append(self._where("response.function_call_arguments.done", arguments=arguments))
        else:
            text = "".join(self._open_text)
            part = output_text(text) if item["type"] == "message" else reasoning_text(text)
            item.update(status=status, content=[part])
            if item["type"] == "reasoning" and self._reasoning_in_clear:
                item["encrypted_content"] = text
            if item["type"] == "message":
                out.append(self._where("response.output_text.done", text=text, logprobs=[]))
            else:
                out.append(self._where("response.reasoning_text.done", text=text))
            out.append(self._where("response.content_part.done", part=part))
        index = len(self.items) - 1
        out.append(self._emit("response.output_item.done", output_index=index, item=dict(item)))
        self._open = None
        return out
