"""The Responses API: input items -> engine -> response objects, stored for follow-ups."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from mlxcel.api.schemas.responses import ResponsesRequest
from mlxcel.engine.registry import LoadedModel
from mlxcel.serving.errors import invalid_request
from mlxcel.serving.response_store import ResponseStore
from mlxcel.serving.responses_input import (
    chat_messages,
    chat_tool,
    chat_tool_choice,
    check_supported,
    prompt_tokens,
)
from mlxcel.serving.responses_tools import assistant_turn, split_output
from mlxcel.serving.text import Generation, collect, prepare
from mlxcel.serving.tools import ToolPlan, plan_tools


def response_id(prefix: str) -> str:
    """A Responses-style object id: `resp_...`, `msg_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponseRun:
    """A prepared response: its generation, and what the response object echoes and stores."""

    generation: Generation
    request: ResponsesRequest
    messages: list[dict[str, Any]]
    """The earlier conversation and this input, without instructions (those do not carry over)."""
    message_id: str
    tools: ToolPlan | None = None


def prepare_response(
    model: LoadedModel,
    request: ResponsesRequest,
    history: list[dict[str, Any]],
    n_predict: int,
) -> ResponseRun:
    """Check the fields, render instructions, history and input, and resolve sampling."""
    check_supported(request)
    messages = [*history, *chat_messages(request.input)]
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    parallel = request.parallel_tool_calls is not False
    chat_tools = [chat_tool(t) for t in request.function_tools()]
    template = model.generator.chat_template
    plan = plan_tools(
        chat_tools,
        chat_tool_choice(request.tool_choice),
        parallel,
        "auto",
        template.source if template else None,
    )
    shown = plan.tools if plan else []
    prompt = prompt_tokens(model.generator, [*system, *messages], shown)
    generation = prepare(
        model, response_id("resp"), prompt, request, request.max_output_tokens, n_predict, "input"
    )
    if plan is not None and plan.grammar is not None:
        if generation.params.grammar or generation.params.json_schema:
            raise invalid_request(
                "a forced tool call cannot be combined with text.format, json_schema or grammar",
                "tool_choice",
            )
        generation = replace(generation, params=replace(generation.params, grammar=plan.grammar))
    return ResponseRun(generation, request, messages, response_id("msg"), plan)


def output_text(text: str) -> dict[str, Any]:
    """An output_text content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(run: ResponseRun, status: str, text: str | None) -> dict[str, Any]:
    """The assistant message output item; no content part yet when `text` is None."""
    return {
        "id": run.message_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [output_text(text)],
    }


def usage_object(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The Responses usage object."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    run: ResponseRun,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The response object in any state, echoing the request's settings as applied."""
    request, params = run.request, run.generation.params
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": run.generation.request_id,
        "object": "response",
        "created_at": run.generation.created,
        "completed_at": int(time.time()) if status == "completed" else None,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": run.generation.model.name,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "store": request.store,
        "temperature": params.temperature,
        "text": {"format": (request.text.format if request.text else None) or {"type": "text"}},
        "tool_choice": request.tool_choice or "auto",
        "tools": [tool.model_dump() for tool in request.function_tools()],
        "top_p": params.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": request.user,
        "metadata": request.metadata or {},
    }


def status_for(finish_reason: str) -> str:
    """A response's status for the engine's finish reason."""
    return "incomplete" if finish_reason == "length" else "completed"


def finish(
    run: ResponseRun,
    store: ResponseStore,
    status: str,
    text: str,
    usage: dict[str, Any] | None,
    error: dict[str, str] | None = None,
    calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The final response object, stored with its conversation if the request asked.

    With tools, `text` is the message text and `calls` the function_call items already built
    while streaming; without `calls` the whole text is parsed for tool calls here.
    """
    item_status = "completed" if status == "completed" else "incomplete"
    message: str | None = text
    if run.tools is not None and calls is None:
        message, calls = split_output(text, run.tools.parser)
    calls = calls or []
    output = [message_item(run, item_status, message)] if message or not calls else []
    response = response_object(run, status, [*output, *calls], usage, error)
    if run.request.store:
        store.put(response, [*run.messages, assistant_turn(message, calls)])
    return response


async def create_response(run: ResponseRun, store: ResponseStore) -> dict[str, Any]:
    """Run a response to its end and return the whole object."""
    outcome = await collect(run.generation)
    usage = usage_object(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
    return finish(run, store, status_for(outcome.finish_reason), outcome.text, usage)
