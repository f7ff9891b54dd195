"""Ollama's /api/chat and /api/generate on the chat, /completion and /infill paths.

A request becomes one generation (serving/ollama_input.py); its events are split by the same
AnswerStream as chat's, and shaped as Ollama's objects: `message` (chat) or `response`
(generate) pieces with `done: false`, then one line with `done: true`, `done_reason` and the
counters, durations in nanoseconds. A tool call goes out whole, its arguments an object, as
soon as the next one starts or the answer ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from mlxcel.engine.types import TokenEvent
from mlxcel.media.audio import SentMedia
from mlxcel.models.loaded import LoadedModel
from mlxcel.parsers.reasoning import reasoning_parser_name
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.errors import APIError
from mlxcel.protocol.ollama import ChatRequest, GenerateRequest
from mlxcel.serving.answer import AnswerStream, parse_answer
from mlxcel.serving.chat import chat_text, prepare_chat
from mlxcel.serving.infill import prepare_infill
from mlxcel.serving.native import prepare_native
from mlxcel.serving.ollama_input import generate_chat, generate_infill, generate_native
from mlxcel.serving.text import Generation, Outcome, collect, stream_all
from mlxcel.serving.tools import ToolPlan

NS_PER_MS = 1_000_000
# /infill's fields as /api/generate names them, for the errors that name one.
_INFILL_FIELDS = {"input_prefix": "prompt", "input_suffix": "suffix"}


def now_text() -> str:
    """The time now as Ollama writes `created_at` and `modified_at` (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class OllamaJob:
    """One Ollama request's generation, how its answer is split, and what its last line says."""

    generation: Generation
    reasoning: str | None
    tools: ToolPlan | None
    model: str
    """The name the request used, which every line echoes."""
    chat: bool
    started: float
    """time.perf_counter() when the request came in."""
    load_ns: int = 0
    """How long the model took to load for this request (0: it was loaded)."""
    context: list[int] | None = field(default=None)
    """The prompt's tokens, for /api/generate's `context` (None: none to give back)."""


def prepare_chat_job(
    model: LoadedModel,
    request: ChatRequest,
    chat: ChatCompletionRequest,
    media: Sequence[SentMedia],
    started: float,
) -> OllamaJob:
    """/api/chat on the chat path, as `chat` (ollama_input.chat_request) asks."""
    job = prepare_chat(
        model,
        chat,
        model.n_predict,
        model.tool_call_parser,
        model.reasoning_parser,
        media,
    )
    return OllamaJob(job.generations[0], job.reasoning, job.tools, request.model, True, started)


def prepare_generate_job(
    model: LoadedModel,
    request: GenerateRequest,
    media: Sequence[SentMedia],
    started: float,
) -> OllamaJob:
    """/api/generate: infill with a suffix, /completion when raw or continuing a `context`,
    the chat path otherwise."""
    name = request.model
    if request.suffix:
        try:
            native = prepare_infill(model, generate_infill(request), model.n_predict)
        except APIError as exc:
            exc.param = _INFILL_FIELDS.get(exc.param or "", exc.param)
            raise
        generation = native.generations[0]
        return OllamaJob(generation, None, None, name, False, started, context=generation.prompt)
    if request.raw or request.context:
        reasoning = None
        text = request.prompt or ""
        if not request.raw:
            text = chat_text(model, generate_chat(request), model.tool_call_parser)
            template = model.chat_template.source if model.chat_template else ""
            reasoning = reasoning_parser_name(model.reasoning_parser, text, template)
        native = prepare_native(model, generate_native(request, text), model.n_predict)
        prompt = native.generations[0]
        return OllamaJob(prompt, reasoning, None, name, False, started, context=prompt.prompt)
    job = prepare_chat(
        model,
        generate_chat(request),
        model.n_predict,
        model.tool_call_parser,
        model.reasoning_parser,
        media,
    )
    generation = job.generations[0]
    context = generation.prompt if generation.media_prompt is None else None
    return OllamaJob(generation, job.reasoning, None, name, False, started, context=context)


def _call(call: dict[str, Any], index: int) -> dict[str, Any]:
    """An OpenAI-shaped call as Ollama's: arguments an object, the call's index inside."""
    function = call["function"]
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        arguments = {}
    return {
        "id": call.get("id"),
        "function": {"index": index, "name": function.get("name", ""), "arguments": arguments},
    }


class OllamaPieces:
    """AnswerStream's deltas -> Ollama message pieces: content, thinking, whole tool calls."""

    def __init__(self, job: OllamaJob) -> None:
        self._answer = AnswerStream(job.reasoning, job.tools)
        self._calls: dict[int, dict[str, Any]] = {}
        self._sent = 0

    def feed(self, event: TokenEvent) -> list[dict[str, Any]]:
        """The pieces an event's text makes; at the answer's end, all that was held."""
        deltas = self._answer.feed(event.text) if event.text else []
        final = event.finish_reason is not None
        if final:
            deltas += self._answer.finish(truncated=event.finish_reason == "length")
        pieces: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                pieces.append({"thinking": delta["reasoning_content"]})
            if delta.get("content"):
                pieces.append({"content": delta["content"]})
            for call in delta.get("tool_calls", []):
                pieces += self._call_piece(call)
        if final:
            pieces += self._done_calls(len(self._calls))
        return pieces

    def _call_piece(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        index = call["index"]
        if index not in self._calls:
            done = self._done_calls(index)
            self._calls[index] = {"id": call.get("id"), "function": {**call["function"]}}
            return done
        function = self._calls[index]["function"]
        function["arguments"] = function.get("arguments", "") + call["function"].get(
            "arguments", ""
        )
        return []

    def _done_calls(self, until: int) -> list[dict[str, Any]]:
        """The calls before `until` not sent yet, as one piece."""
        ready = [_call(self._calls[i], i) for i in sorted(self._calls) if self._sent <= i < until]
        self._sent = max(self._sent, until)
        return [{"tool_calls": ready}] if ready else []


def _piece_line(job: OllamaJob, piece: dict[str, Any], done: bool) -> dict[str, Any]:
    line: dict[str, Any] = {"model": job.model, "created_at": now_text()}
    if job.chat:
        line["message"] = {"role": "assistant", "content": piece.get("content", ""), **{
            key: piece[key] for key in ("thinking", "tool_calls") if key in piece
        }}  # fmt: skip
    else:
        line["response"] = piece.get("content", "")
        if "thinking" in piece:
            line["thinking"] = piece["thinking"]
    line["done"] = done
    return line


def _final(job: OllamaJob, end: TokenEvent | Outcome, tokens: list[int]) -> dict[str, Any]:
    """The counters of the last line: counts, and durations in nanoseconds."""
    elapsed = time.perf_counter() - job.started
    counters: dict[str, Any] = {
        "done_reason": "length" if end.finish_reason == "length" else "stop",
        "total_duration": int(elapsed * 1e9),
        "load_duration": job.load_ns,
        "prompt_eval_count": end.prompt_tokens,
        "prompt_eval_duration": int(end.prompt_ms * NS_PER_MS),
        "eval_count": end.completion_tokens,
        "eval_duration": int(end.predicted_ms * NS_PER_MS),
    }
    if job.context is not None and not job.chat:
        counters["context"] = [*job.context, *tokens]
    return counters


async def ollama_lines(job: OllamaJob) -> AsyncIterator[dict[str, Any]]:
    """The NDJSON lines of a streamed answer: pieces, then the last line with its counters."""
    pieces = OllamaPieces(job)
    tokens: list[int] = []
    async for _, event in stream_all([job.generation]):
        if event.progress is not None:
            continue
        tokens += event.token_ids
        for piece in pieces.feed(event):
            yield _piece_line(job, piece, False)
        if event.finish_reason is not None:
            yield {**_piece_line(job, {}, True), **_final(job, event, tokens)}


async def ollama_answer(job: OllamaJob) -> dict[str, Any]:
    """The whole answer as one object (`"stream": false`)."""
    outcome = await collect(job.generation)
    truncated = outcome.finish_reason == "length"
    answer = parse_answer(outcome.text, job.reasoning, job.tools, truncated)
    piece: dict[str, Any] = {"content": answer.content or ""}
    if answer.reasoning:
        piece["thinking"] = answer.reasoning
    if answer.tool_calls:
        piece["tool_calls"] = [_call(call, i) for i, call in enumerate(answer.tool_calls)]
    return {**_piece_line(job, piece, True), **_final(job, outcome, outcome.token_ids)}


def empty_answer(name: str, chat: bool, reason: str) -> dict[str, Any]:
    """The answer to a request with nothing to generate: it loaded or unloaded the model."""
    line: dict[str, Any] = {"model": name, "created_at": now_text()}
    if chat:
        line["message"] = {"role": "assistant", "content": ""}
    else:
        line["response"] = ""
    return {**line, "done": True, "done_reason": reason}
