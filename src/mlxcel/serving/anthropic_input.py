"""Anthropic Messages input -> a chat completions request, so it runs on the chat path.

System blocks, content blocks, tools, tool_choice and thinking become what the chat template
and the tool and reasoning parsers already read; what cannot be honoured is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from mlxcel.protocol.anthropic import (
    Block,
    CountTokensRequest,
    CustomTool,
    DocumentBlock,
    ImageBlock,
    Message,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolResultBlock,
    ToolUseBlock,
)
from mlxcel.protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDef,
    ImageURL,
    NamedToolChoice,
    ToolCall,
    ToolDef,
    text_parts,
)
from mlxcel.protocol.common import ReasoningEffort, SamplingFields
from mlxcel.protocol.errors import APIError, field_error, invalid_request

# thinking.budget_tokens -> the reasoning effort templates read; Claude Code's "think",
# "think hard" and "ultrathink" budgets land on low, medium and high.
_EFFORT_BUDGETS: tuple[tuple[int, ReasoningEffort], ...] = ((4096, "low"), (16384, "medium"))


def _unsupported(param: str, message: str) -> APIError:
    return invalid_request(message, param, "unsupported_field")


def check_supported(request: CountTokensRequest) -> None:
    """A 400 naming the first field the Messages route cannot honour."""
    if request.n != 1:
        raise _unsupported("n", "a message has one answer; 'n' must be 1")
    if request.stream_options is not None:
        raise _unsupported("stream_options", "'stream_options' is not a Messages API field")
    if request.stop is not None:
        raise _unsupported("stop", "'stop' is not a Messages API field; use 'stop_sequences'")
    for index, tool in enumerate(request.tools or []):
        if not isinstance(tool, CustomTool):
            raise _unsupported(
                f"tools.{index}.type",
                f"tools of type '{tool.type}' run on Anthropic's servers and are not supported "
                "here; only custom tools (name, description, input_schema) are",
            )
    choice = request.tool_choice
    if choice is not None and choice.type == "tool" and not choice.name:
        raise invalid_request("tool_choice of type 'tool' needs a 'name'", "tool_choice.name")
    budget = request.thinking.budget_tokens if isinstance(request.thinking, ThinkingEnabled) else 0
    if request.max_tokens is not None and budget >= request.max_tokens:
        raise invalid_request(
            "'max_tokens' must be greater than thinking.budget_tokens",
            "thinking.budget_tokens",
        )


def _no_images(param: str) -> APIError:
    return invalid_request(
        "image blocks are read in user messages and their tool results, not in assistant turns",
        param,
        "unsupported_content",
    )


def _image_part(block: ImageBlock, param: str) -> ContentPart:
    """An image block as a chat image part: a base64 source as a data: URI, a URL as is."""
    source = block.source
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', '')};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise invalid_request(
            "an image source must be {type: base64, media_type, data} or {type: url, url}",
            f"{param}.source",
        )
    return ContentPart(type="image_url", image_url=ImageURL(url=url))


def _result_parts(block: ToolResultBlock, param: str) -> list[ContentPart]:
    """A tool result's text and images, in their order, as a tool message's content."""
    if block.content is None or isinstance(block.content, str):
        parts = [ContentPart(type="text", text=block.content or "")]
    else:
        parts = [
            _image_part(part, f"{param}.content.{index}")
            if isinstance(part, ImageBlock)
            else ContentPart(type="text", text=part.text)
            for index, part in enumerate(block.content)
        ]
    # The chat template has no error flag on a tool result, so the text carries it.
    return [ContentPart(type="text", text="Error: "), *parts] if block.is_error else parts


def _user_turns(blocks: list[Block], param: str, names: dict[str, str]) -> list[ChatMessage]:
    """A user message: its text, and each tool_result as a tool message, in their order."""
    turns: list[ChatMessage] = []
    parts: list[ContentPart] = []

    def flush() -> None:
        if parts:
            turns.append(ChatMessage(role="user", content=list(parts)))
            parts.clear()

    for index, block in enumerate(blocks):
        where = f"{param}.{index}"
        if isinstance(block, TextBlock):
            parts.append(ContentPart(type="text", text=block.text))
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(block, where))
        elif isinstance(block, ToolResultBlock):
            flush()
            turns.append(
                ChatMessage(
                    role="tool",
                    tool_call_id=block.tool_use_id,
                    content=_result_parts(block, where),
                    name=names.get(block.tool_use_id),
                )
            )
        else:
            _refuse(block, where, "user")
    flush()
    return turns


def _assistant_turn(blocks: list[Block], param: str, names: dict[str, str]) -> ChatMessage:
    """An assistant message: text, tool_use blocks as tool calls, thinking as its reasoning."""
    text: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            names[block.id] = block.name
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(
                ToolCall(id=block.id, function=FunctionCall(name=block.name, arguments=arguments))
            )
        elif not isinstance(block, RedactedThinkingBlock):
            _refuse(block, f"{param}.{index}", "assistant")
    return ChatMessage(
        role="assistant",
        content=text_parts("".join(text)) if text or not calls else None,
        tool_calls=calls or None,
        reasoning_content="".join(thinking) if thinking else None,
    )


def _refuse(block: Block, param: str, role: str) -> None:
    if isinstance(block, ImageBlock):
        raise _no_images(param)
    if isinstance(block, DocumentBlock):
        raise _unsupported(param, "document blocks are not supported by this server")
    raise invalid_request(f"a {role} message cannot hold '{block.type}' blocks", param)


def chat_messages(messages: list[Message]) -> list[ChatMessage]:
    """Anthropic messages as chat messages, tool results as `tool` messages after the call."""
    out: list[ChatMessage] = []
    names: dict[str, str] = {}
    for index, message in enumerate(messages):
        param = f"messages.{index}.content"
        if message.role == "user":
            out += _user_turns(message.blocks(), param, names)
        else:
            out.append(_assistant_turn(message.blocks(), param, names))
    return out


def _system(request: CountTokensRequest) -> list[ChatMessage]:
    system = request.system
    if not system:
        return []
    text = system if isinstance(system, str) else "".join(block.text for block in system)
    return [ChatMessage(role="system", content=text_parts(text))]


def _tool_choice(request: CountTokensRequest) -> tuple[Any, bool | None]:
    """The chat tool_choice and parallel_tool_calls for Anthropic's tool_choice."""
    choice = request.tool_choice
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "tool":
        return NamedToolChoice(type="function", function={"name": choice.name or ""}), parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def _thinking(request: CountTokensRequest) -> tuple[ReasoningEffort | None, dict[str, Any]]:
    """Reasoning effort and template variables: output_config.effort, else the thinking
    budget picks the effort (it is no hard cap on the thinking's length)."""
    thinking = request.thinking
    effort: ReasoningEffort | None = None
    kwargs: dict[str, Any] = {}
    if isinstance(thinking, ThinkingDisabled):
        effort = "none"
    elif thinking is not None:
        kwargs["enable_thinking"] = True
    if isinstance(thinking, ThinkingEnabled):
        budget = thinking.budget_tokens
        effort = next((e for limit, e in _EFFORT_BUDGETS if budget <= limit), "high")
    config = request.output_config
    if config is not None and config.effort is not None:
        effort = config.effort
    return effort, kwargs


def _response_format(request: CountTokensRequest) -> dict[str, Any] | None:
    """output_config.format as chat's response_format: the same structured-output path."""
    config = request.output_config
    if config is None or config.format is None:
        return None
    schema = {"name": "output", "schema": config.format.schema_}
    return {"type": "json_schema", "json_schema": schema}


def chat_request(request: CountTokensRequest) -> ChatCompletionRequest:
    """The chat completions request the Messages request stands for."""
    try:
        return _chat_request(request)
    except ValidationError as exc:
        # What the Messages API takes and chat does not: a 400 naming it, never a 500.
        found = field_error(exc.errors())
        raise invalid_request(f"'{found.path}': {found.message}", found.path) from None


def _chat_request(request: CountTokensRequest) -> ChatCompletionRequest:
    check_supported(request)
    sampling = request.model_dump(include=set(SamplingFields.model_fields), exclude_unset=True)
    messages = [*_system(request), *chat_messages(request.messages)]
    if not messages:
        raise invalid_request("the messages hold nothing to send: every one is empty", "messages")
    # A final assistant message is a prefill: the model carries on from its text.
    prefill = request.messages[-1].role == "assistant"
    tools = [
        ToolDef(
            type="function",
            function=FunctionDef(
                name=tool.name, description=tool.description, parameters=tool.input_schema
            ),
        )
        for tool in request.tools or []
        if isinstance(tool, CustomTool)
    ]
    choice, parallel = _tool_choice(request)
    effort, kwargs = _thinking(request)
    extra: dict[str, Any] = {}
    if isinstance(request, MessagesRequest):
        if request.stop_sequences:
            extra["stop"] = request.stop_sequences
        if request.metadata and request.metadata.user_id:
            extra["user"] = request.metadata.user_id
    return ChatCompletionRequest(
        **sampling,
        **extra,
        messages=messages,
        tools=tools or None,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        reasoning_effort=effort,
        chat_template_kwargs=kwargs or None,
        response_format=_response_format(request),
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
    )
