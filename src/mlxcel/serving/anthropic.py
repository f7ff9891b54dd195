"""Anthropic's Messages API on the chat path: message objects, content blocks, usage."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from mlxcel.media.audio import SentMedia
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.anthropic import CountTokensRequest, MessagesRequest
from mlxcel.serving.answer import parse_answer
from mlxcel.serving.anthropic_input import chat_request
from mlxcel.serving.chat import ChatJob, chat_prompt, prepare_chat
from mlxcel.serving.responses import response_id
from mlxcel.serving.text import collect


@dataclass
class MessageJob:
    """A Messages request on the chat path: its one generation, tools and reasoning parser."""

    chat: ChatJob
    message_id: str

    @property
    def model_name(self) -> str:
        """The model's name, as the message reports it."""
        return self.chat.generations[0].model.name


def prepare_message(
    model: LoadedModel,
    request: MessagesRequest,
    n_predict: int,
    tool_parser: str,
    reasoning_parser: str,
    media: Sequence[SentMedia] = (),
) -> MessageJob:
    """Render the request through the chat path; the generation carries the message's id."""
    chat = chat_request(request)
    job = prepare_chat(model, chat, n_predict, tool_parser, reasoning_parser, media)
    message_id = response_id("msg")
    generations = [replace(g, request_id=message_id) for g in job.generations]
    return MessageJob(replace(job, generations=generations), message_id)


def count_tokens(
    model: LoadedModel,
    request: CountTokensRequest,
    tool_parser: str,
    media: Sequence[SentMedia] = (),
) -> dict[str, int]:
    """POST /v1/messages/count_tokens: the prompt length /v1/messages would run."""
    prompt = chat_prompt(model, chat_request(request), tool_parser, media)
    return {"input_tokens": len(prompt)}


def text_block(text: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": text}


def thinking_block(thinking: str) -> dict[str, Any]:
    """A thinking content block; nothing here signs it, so its signature is empty."""
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def tool_use_block(call_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    """A tool_use content block."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def stop_reason(
    job: MessageJob, finish_reason: str, engine_reason: str | None, called: bool, used: int
) -> str:
    """Anthropic's stop_reason for how the generation ended, `used` tokens of context taken."""
    if finish_reason == "length":
        full = used >= job.chat.generations[0].model.generator.n_ctx_seq
        return "model_context_window_exceeded" if full else "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if engine_reason == "word" else "end_turn"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, int]:
    """Anthropic's usage: input_tokens leave out what was read from the prefix cache."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def message_object(
    job: MessageJob,
    content: list[dict[str, Any]],
    reason: str | None,
    sequence: str | None,
    usage_: dict[str, int],
) -> dict[str, Any]:
    """The message object, whole or as message_start carries it."""
    return {
        "id": job.message_id,
        "type": "message",
        "role": "assistant",
        "model": job.model_name,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_,
    }


async def create_message(job: MessageJob) -> dict[str, Any]:
    """Run the message to its end: thinking, text and tool_use blocks, in that order."""
    outcome = await collect(job.chat.generations[0])
    truncated = outcome.finish_reason == "length"
    answer = parse_answer(outcome.text, job.chat.reasoning, job.chat.tools, truncated)
    content: list[dict[str, Any]] = []
    if answer.reasoning:
        content.append(thinking_block(answer.reasoning))
    if answer.content or not answer.tool_calls:
        content.append(text_block(answer.content or ""))
    for call in answer.tool_calls:
        function = call["function"]
        content.append(
            tool_use_block(call["id"], function["name"], json.loads(function["arguments"]))
        )
    used = outcome.prompt_tokens + outcome.completion_tokens
    called = bool(answer.tool_calls)
    reason = stop_reason(job, outcome.finish_reason, outcome.stop_reason, called, used)
    sequence = outcome.stop_word if reason == "stop_sequence" else None
    usage_ = usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
    return message_object(job, content, reason, sequence, usage_)
