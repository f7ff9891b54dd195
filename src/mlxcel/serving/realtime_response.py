"""A conversation's response: the chat model answers the conversation (instructions, tools,
history), its text streamed as transcript or text deltas, its sentences spoken by the voice as
they end and streamed back as 24 kHz pcm16, its tool calls as function-call items; cancelled by
`response.cancel` or by the person speaking again."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlxcel.backends.audio.speech import SpeechJob
from mlxcel.models.audio import SpeechModel
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.realtime_update import ResponseSettings
from mlxcel.serving.audio_speech import voice_for
from mlxcel.serving.chat import chat_chunks, prepare_chat
from mlxcel.serving.realtime_audio import OUTPUT_RATE, output_resampler
from mlxcel.serving.realtime_items import (
    arguments_text,
    chat_messages,
    chat_tool_choice,
    chat_tools,
    new_id,
)

Emit = Callable[..., Awaitable[None]]
# A sentence ends at . ! ? or a line break followed by space: spoken as soon as it ends.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+|\n+")


@dataclass
class Reply:
    """What a response produced so far, for its events and for the conversation."""

    id: str
    settings: ResponseSettings
    item_id: str = field(default_factory=lambda: new_id("item"))
    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    audio_bytes: int = 0

    def message(self, status: str) -> dict[str, Any]:
        """The assistant message item as it stands."""
        text = "".join(self.text)
        part = (
            {"type": "output_audio", "transcript": text}
            if self.settings.modality == "audio"
            else {"type": "output_text", "text": text}
        )
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [part],
        }

    def shape(self, status: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
        """The realtime.response object."""
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": self.output,
            "conversation_id": None if not self.settings.in_conversation else "conv_default",
            "output_modalities": [self.settings.modality],
            "max_output_tokens": self.settings.max_output_tokens or "inf",
            "audio": {
                "output": {
                    "format": {"type": "audio/pcm", "rate": OUTPUT_RATE},
                    "voice": self.settings.voice or "alloy",
                }
            },
            "usage": self.usage,
            "metadata": self.settings.metadata,
        }


def chat_request(settings: ResponseSettings, items: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request a response makes of the text model."""
    body: dict[str, Any] = {"messages": chat_messages(settings.instructions, items)}
    if not body["messages"]:
        body["messages"] = [{"role": "user", "content": ""}]
    if settings.tools and settings.tool_choice != "none":
        body["tools"] = chat_tools(settings.tools)
        body["tool_choice"] = chat_tool_choice(settings.tool_choice)
    if settings.max_output_tokens is not None:
        body["max_completion_tokens"] = settings.max_output_tokens
    return ChatCompletionRequest.model_validate(body)


class Speaker:
    """Sentences spoken in order, one at a time, while the text goes on."""

    def __init__(
        self, model: SpeechModel, voice: str, emit_audio: Callable[[bytes], Awaitable[None]]
    ):
        self._model = model
        self._voice = voice
        self._emit_audio = emit_audio
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run())
        self._pending = ""

    def feed(self, text: str) -> None:
        """More of the answer; each sentence it ends is queued."""
        self._pending += text
        while (end := _SENTENCE_END.search(self._pending)) is not None:
            sentence, self._pending = self._pending[: end.end()], self._pending[end.end() :]
            if sentence.strip():
                self._queue.put_nowait(sentence.strip())

    async def finish(self) -> None:
        """Speak what is left, and wait for the last sentence."""
        if self._pending.strip():
            self._queue.put_nowait(self._pending.strip())
        self._pending = ""
        self._queue.put_nowait(None)
        await self._task

    def cancel(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        while (sentence := await self._queue.get()) is not None:
            resampler = output_resampler(self._model.engine.sample_rate)
            job = SpeechJob(sentence, self._voice)
            async with self._model.place():
                async for piece in self._model.engine.speak(job, "pcm"):
                    pcm = resampler.push(np.frombuffer(piece, "<i2"))
                    if len(pcm):
                        await self._emit_audio(pcm.tobytes())
            rest = resampler.flush()
            if len(rest):
                await self._emit_audio(rest.tobytes())


async def run_reply(
    reply: Reply,
    chat: LoadedModel,
    voice: SpeechModel | None,
    items: list[dict[str, Any]],
    emit: Emit,
) -> None:
    """Generate the reply, emitting its events; the caller emits response.created and
    response.done (which it also does when this is cancelled)."""
    request = chat_request(reply.settings, items)
    job = await asyncio.to_thread(
        prepare_chat, chat, request, chat.n_predict, chat.tool_call_parser, chat.reasoning_parser
    )
    where = {"response_id": reply.id, "item_id": reply.item_id, "output_index": 0}
    audio = reply.settings.modality == "audio" and voice is not None
    speaker: Speaker | None = None
    started = False

    async def emit_audio(pcm: bytes) -> None:
        reply.audio_bytes += len(pcm)
        delta = base64.b64encode(pcm).decode()
        await emit("response.output_audio.delta", **where, content_index=0, delta=delta)

    try:
        async for chunk in chat_chunks(job, include_usage=True):
            if chunk.get("usage"):
                reply.usage = _usage(chunk["usage"])
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                text = delta.get("content")
                if text:
                    if not started:
                        started = True
                        await _open_message(reply, emit, where)
                        if audio and voice is not None:
                            name = voice_for(voice, reply.settings.voice or "alloy")
                            speaker = Speaker(voice, name, emit_audio)
                    reply.text.append(text)
                    kind = "output_audio_transcript" if audio else "output_text"
                    await emit(f"response.{kind}.delta", **where, content_index=0, delta=text)
                    if speaker is not None:
                        speaker.feed(text)
                for call in delta.get("tool_calls") or []:
                    _called(reply, call)
        if speaker is not None:
            await speaker.finish()
    finally:
        if speaker is not None:
            speaker.cancel()
    if started:
        await _close_message(reply, emit, where, audio)
    for index in sorted(reply.calls):
        await _call_events(reply, reply.calls[index], emit)


async def _open_message(reply: Reply, emit: Emit, where: dict[str, Any]) -> None:
    item = reply.message("in_progress")
    item["content"] = []
    await emit("response.output_item.added", response_id=reply.id, output_index=0, item=item)
    if reply.settings.in_conversation:
        await emit("conversation.item.added", item=item, previous_item_id=None)
    part = (
        {"type": "audio", "transcript": ""}
        if reply.settings.modality == "audio"
        else {"type": "text", "text": ""}
    )
    await emit("response.content_part.added", **where, content_index=0, part=part)


async def _close_message(reply: Reply, emit: Emit, where: dict[str, Any], audio: bool) -> None:
    text = "".join(reply.text)
    if audio:
        await emit("response.output_audio.done", **where, content_index=0)
        await emit(
            "response.output_audio_transcript.done", **where, content_index=0, transcript=text
        )
        part = {"type": "audio", "transcript": text}
    else:
        await emit("response.output_text.done", **where, content_index=0, text=text)
        part = {"type": "text", "text": text}
    await emit("response.content_part.done", **where, content_index=0, part=part)
    item = reply.message("completed")
    reply.output.append(item)
    await emit("response.output_item.done", response_id=reply.id, output_index=0, item=item)
    if reply.settings.in_conversation:
        await emit("conversation.item.done", item=item, previous_item_id=None)


def _called(reply: Reply, call: dict[str, Any]) -> None:
    found = reply.calls.setdefault(call.get("index", 0), {"name": "", "arguments": "", "id": ""})
    function = call.get("function") or {}
    found["id"] = call.get("id") or found["id"]
    found["name"] += function.get("name") or ""
    found["arguments"] += arguments_text(function.get("arguments") or "")


async def _call_events(reply: Reply, call: dict[str, Any], emit: Emit) -> None:
    index = len(reply.output)
    item = {
        "id": new_id("item"),
        "object": "realtime.item",
        "type": "function_call",
        "status": "in_progress",
        "name": call["name"],
        "call_id": call["id"] or new_id("call"),
        "arguments": "",
    }
    await emit("response.output_item.added", response_id=reply.id, output_index=index, item=item)
    where = {"response_id": reply.id, "item_id": item["id"], "output_index": index}
    common = {**where, "call_id": item["call_id"]}
    await emit("response.function_call_arguments.delta", **common, delta=call["arguments"])
    args = {"arguments": call["arguments"], "name": call["name"]}
    await emit("response.function_call_arguments.done", **common, **args)
    item = {**item, "status": "completed", "arguments": call["arguments"]}
    reply.output.append(item)
    await emit("response.output_item.done", response_id=reply.id, output_index=index, item=item)
    if reply.settings.in_conversation:
        await emit("conversation.item.done", item=item, previous_item_id=None)


def _usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """The chat model's tokens; the voice samples no tokens, so audio counts none."""
    prompt = int(chat_usage.get("prompt_tokens", 0))
    output = int(chat_usage.get("completion_tokens", 0))
    cached = int((chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return {
        "total_tokens": prompt + output,
        "input_tokens": prompt,
        "output_tokens": output,
        "input_token_details": {
            "text_tokens": prompt,
            "audio_tokens": 0,
            "cached_tokens": cached,
        },
        "output_token_details": {"text_tokens": output, "audio_tokens": 0},
    }
