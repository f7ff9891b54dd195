"""Responses API input: the fields it cannot honour yet, and items -> chat messages -> tokens."""

from __future__ import annotations

import json
from typing import Any

from mlxcel.engine.types import ChatTemplate
from mlxcel.protocol.errors import invalid_request
from mlxcel.protocol.responses import (
    FunctionCallItem,
    FunctionTool,
    InputItem,
    MessageItem,
    OtherTool,
    ReasoningItem,
    ResponsesRequest,
)
from mlxcel.serving.chat_template import render_chat
from mlxcel.serving.reasoning import thinking_kwargs
from mlxcel.serving.tools import DEFAULT_PARSER, ToolPlan, template_messages

# Stateless clients (store=false) ask for reasoning they can send back. Nothing leaves this
# machine, so the "encrypted" content is the reasoning text itself, read back the same way.
ENCRYPTED_REASONING = "reasoning.encrypted_content"


def check_supported(request: ResponsesRequest) -> None:
    """A 400 naming the first field this server knows but cannot honour yet."""
    problem = _unsupported(request)
    if problem is not None:
        param, message = problem
        raise invalid_request(message, param, "unsupported_field")


def _unsupported(request: ResponsesRequest) -> tuple[str, str] | None:
    if request.max_tokens is not None:
        return "max_tokens", "'max_tokens' is not a Responses API field; use 'max_output_tokens'"
    if request.n != 1:
        return "n", "a response has one output; 'n' must be 1"
    if request.n_predict is not None:
        return "n_predict", "'n_predict' is not a Responses API field; use 'max_output_tokens'"
    if request.n_probs:
        return "n_probs", "responses carry no log-probabilities: 'n_probs' must be 0"
    if request.stream_options is not None:
        return "stream_options", "'stream_options' is not supported for responses"
    if request.background:
        return "background", "background responses are not supported yet"
    for index, value in enumerate(request.include or []):
        if value != ENCRYPTED_REASONING:
            return (
                f"include.{index}",
                f"include '{value}' is not supported; only '{ENCRYPTED_REASONING}' is",
            )
    if request.truncation == "auto":
        return "truncation", "'truncation' must be 'disabled': this server does not truncate input"
    choice = request.tool_choice
    if isinstance(choice, dict) and choice.get("type") != "function":
        return "tool_choice", f"tool_choice {json.dumps(choice)} is not a function choice"
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        return "tool_choice", f"tool_choice '{choice}' is not one of auto, none, required"
    for index, tool in enumerate(request.tools or []):
        if isinstance(tool, OtherTool):
            return (
                f"tools.{index}.type",
                f"tools of type '{tool.type}' are not supported; only 'function' tools are",
            )
    return None


def _arguments(arguments: str) -> Any:
    # HF chat templates expect a tool call's arguments as a mapping, not a JSON string.
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def _tool_call(item: FunctionCallItem) -> dict[str, Any]:
    function = {"name": item.name, "arguments": _arguments(item.arguments)}
    return {"id": item.call_id, "type": "function", "function": function}


def chat_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """Input items as chat messages; function calls in the shape HF chat templates expect."""
    messages: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    thinking: str | None = None
    for item in items:
        if isinstance(item, ReasoningItem):
            # It belongs to the assistant turn that follows it.
            thinking = item.text()
            continue
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            # Consecutive calls are one assistant turn that called several tools at once.
            last = messages[-1] if messages else {}
            if last.get("role") == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(_tool_call(item))
            else:
                messages.append(
                    {"role": "assistant", "content": None, "tool_calls": [_tool_call(item)]}
                )
        else:
            message = {"role": "tool", "tool_call_id": item.call_id, "content": item.text()}
            if item.call_id in names:
                message["name"] = names[item.call_id]
            messages.append(message)
        if thinking is not None and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = thinking
        thinking = None
    return messages


def chat_tool(tool: FunctionTool) -> dict[str, Any]:
    """A Responses function tool in the chat-completions shape chat templates know."""
    function = tool.model_dump(exclude={"type", "strict"}, exclude_none=True)
    return {"type": "function", "function": function}


def prompt_text(
    template: ChatTemplate | None,
    messages: list[dict[str, Any]],
    plan: ToolPlan | None,
    effort: str | None,
) -> str:
    """Render the chat template with the tools and the reasoning effort."""
    tools = plan.tools if plan else []
    messages = template_messages(template, messages, tools, plan.parser if plan else DEFAULT_PARSER)
    extra = {**thinking_kwargs(effort), **({"tools": tools} if tools else {})}
    return render_chat(template, messages, extra=extra)


def chat_tool_choice(choice: str | dict[str, Any] | None) -> Any:
    """A Responses tool_choice in the chat shape: {"type", "name"} -> {"type", "function"}."""
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice
