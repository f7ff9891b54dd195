"""The Responses API: input items -> engine -> response objects, stored for follow-ups."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from mlxcel.media.audio import SentMedia
from mlxcel.models.loaded import LoadedModel
from mlxcel.parsers.reasoning import reasoning_parser_name
from mlxcel.protocol.responses import ResponsesRequest
from mlxcel.serving.answer import renders_special_tokens
from mlxcel.serving.reasoning import reasoning_tokens
from mlxcel.serving.response_store import ResponseStore
from mlxcel.serving.responses_input import (
    ENCRYPTED_REASONING,
    chat_messages,
    chat_tool,
    chat_tool_choice,
    check_supported,
    prompt_text,
)
from mlxcel.serving.responses_output import Emit, OutputItems
from mlxcel.serving.responses_tools import assistant_turn
from mlxcel.serving.text import Generation, collect, prepare
from mlxcel.serving.tools import ToolPlan, plan_tools, with_tools
from mlxcel.serving.vision import laid_out


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
    reasoning: str | None = None
    """The reasoning parser's name, when the model's thinking becomes a reasoning item."""
    image_urls: tuple[str, ...] = ()
    """The URLs of the images in `messages`, in prompt order, stored with them."""

    def output(self, emit: Emit) -> OutputItems:
        """A builder for this response's output items, its events sent through `emit`."""
        clear = ENCRYPTED_REASONING in (self.request.include or [])
        return OutputItems(
            self.tools, self.reasoning, emit, self.message_id, reasoning_in_clear=clear
        )


def prepare_response(
    model: LoadedModel,
    request: ResponsesRequest,
    history: list[dict[str, Any]],
    n_predict: int,
    tool_parser: str = "auto",
    reasoning_parser: str = "auto",
    images: Sequence[SentMedia] = (),
    image_urls: tuple[str, ...] = (),
) -> ResponseRun:
    """Check the fields, render instructions, history and input, and resolve sampling;
    `images` are the history's and the input's, `image_urls` where they came from."""
    check_supported(request)
    messages = [*history, *chat_messages(request.input)]
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    parallel = request.parallel_tool_calls is not False
    chat_tools = [chat_tool(t) for t in request.function_tools()]
    template = model.chat_template
    source = template.source if template else None
    choice = chat_tool_choice(request.tool_choice)
    plan = plan_tools(chat_tools, choice, parallel, tool_parser, source)
    effort = request.reasoning.effort if request.reasoning else None
    text = prompt_text(template, [*system, *messages], plan, effort)
    reasoning = reasoning_parser_name(reasoning_parser, text, source or "")
    prompt = laid_out(model, text, images, "input")
    generation = prepare(
        model,
        response_id("resp"),
        prompt,
        request,
        request.max_output_tokens,
        n_predict,
        "input",
    )
    special = renders_special_tokens(reasoning, plan)
    generation = replace(generation, params=replace(generation.params, render_special=special))
    generation = with_tools(generation, plan, "text.format")
    return ResponseRun(
        generation, request, messages, response_id("msg"), plan, reasoning, image_urls
    )


def usage_object(
    run: ResponseRun, input_tokens: int, output_tokens: int, cached_tokens: int, reasoning: str
) -> dict[str, Any]:
    """The Responses usage object; reasoning tokens are the reasoning text's, retokenized."""
    thought = reasoning_tokens(run.generation.model.generator, reasoning, output_tokens)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": thought},
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
        "reasoning": request.reasoning.model_dump() if request.reasoning else None,
        "store": request.store,
        "temperature": params.temperature,
        "text": {"format": (request.text.format if request.text else None) or {"type": "text"}},
        "tool_choice": request.tool_choice or "auto",
        "tools": [tool.model_dump() for tool in request.function_tools()],
        "top_p": params.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": request.user,
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
        "metadata": request.metadata or {},
    }


def status_for(finish_reason: str) -> str:
    """A response's status for the engine's finish reason."""
    return "incomplete" if finish_reason == "length" else "completed"


def item_status(status: str) -> str:
    """An output item's status when its response ends with `status`."""
    return "completed" if status == "completed" else "incomplete"


def finish(
    run: ResponseRun,
    store: ResponseStore,
    status: str,
    output: OutputItems,
    usage: dict[str, Any] | None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The final response object, stored with its conversation if the request asked."""
    response = response_object(run, status, output.items, usage, error)
    if run.request.store:
        turn = assistant_turn(output.text, output.calls, output.reasoning)
        store.put(response, [*run.messages, turn], run.image_urls)
    return response


def _no_event(type_: str, **fields: Any) -> dict[str, Any]:
    return {}


async def create_response(run: ResponseRun, store: ResponseStore) -> dict[str, Any]:
    """Run a response to its end and return the whole object."""
    outcome = await collect(run.generation)
    status = status_for(outcome.finish_reason)
    output = run.output(_no_event)
    output.feed(outcome.text)
    output.finish(item_status(status))
    usage = usage_object(
        run,
        outcome.prompt_tokens,
        outcome.completion_tokens,
        outcome.cached_tokens,
        output.reasoning or "",
    )
    return finish(run, store, status, output, usage)
