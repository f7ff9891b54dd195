"""Streamed messages: Anthropic's event sequence, from message_start to message_stop.

message_start, ping, then per content block content_block_start, its deltas (text_delta,
thinking_delta, input_json_delta) and content_block_stop, then message_delta (stop_reason,
final usage) and message_stop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlxcel.serving.answer import AnswerStream
from mlxcel.serving.anthropic import (
    MessageJob,
    message_object,
    stop_reason,
    text_block,
    thinking_block,
    tool_use_block,
    usage,
)
from mlxcel.serving.text import stream_all


class ContentBlocks:
    """Chat deltas (reasoning, content, tool calls) -> content block events, one block open."""

    def __init__(self, answer: AnswerStream) -> None:
        self._answer = answer
        self._open: str | None = None
        self._count = 0

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Events for new model output."""
        return self._events(self._answer.feed(text))

    def finish(self, truncated: bool = False) -> list[dict[str, Any]]:
        """Events for what the parsers held back; every block closed, at least one sent.
        `truncated`: max_tokens cut the answer off, so a tool call it was writing is text."""
        out = self._events(self._answer.finish(truncated))
        if not self._count:
            out += self._start("text", text_block(""))
        return out + self._close()

    def _events(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                if self._open != "thinking":
                    out += self._start("thinking", thinking_block(""))
                thought = {"type": "thinking_delta", "thinking": delta["reasoning_content"]}
                out.append(self._delta(thought))
            if delta.get("content"):
                if self._open != "text":
                    out += self._start("text", text_block(""))
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    block = tool_use_block(call["id"], call["function"]["name"], {})
                    out += self._start("tool_use", block)
                fragment = call["function"].get("arguments", "")
                if fragment:
                    out.append(self._delta({"type": "input_json_delta", "partial_json": fragment}))
        return out

    def _start(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close()
        self._open = kind
        self._count += 1
        start = {"type": "content_block_start", "index": self._count - 1, "content_block": block}
        return [*out, start]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._count - 1, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._count - 1}]


async def message_events(job: MessageJob) -> AsyncIterator[dict[str, Any]]:
    """The events of one streamed message; message_start waits for the engine's first event,
    so a request the engine refuses still gets its HTTP status."""
    chat = job.chat
    answer = AnswerStream(chat.reasoning, chat.tools)
    blocks = ContentBlocks(answer)
    started = False
    async for _, event in stream_all(chat.generations):
        if not started:
            started = True
            opening = message_object(job, [], None, None, usage(event.prompt_tokens, 0, 0))
            yield {"type": "message_start", "message": opening}
            yield {"type": "ping"}
        for item in blocks.feed(event.text) if event.text else []:
            yield item
        if event.finish_reason is None:
            continue
        for item in blocks.finish(truncated=event.finish_reason == "length"):
            yield item
        used = event.prompt_tokens + event.completion_tokens
        reason = stop_reason(job, event.finish_reason, event.stop_reason, answer.calls > 0, used)
        sequence = event.stop_word if reason == "stop_sequence" else None
        final = usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": final,
        }
        yield {"type": "message_stop"}
