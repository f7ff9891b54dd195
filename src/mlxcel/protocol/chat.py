"""POST /v1/chat/completions request body."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from mlxcel.protocol.common import ReasoningEffort, SamplingFields, Strict


def _mapping(call: ToolCall) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: dict[str, str]


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # An earlier answer's thinking, as this server returned it; templates read reasoning_content.
    reasoning_content: str | None = None
    reasoning: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """The message as HF chat templates read it (tool-call arguments as a mapping)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["content"] = self.text() or None
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _mapping(call)},
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        thinking = self.reasoning_content or self.reasoning
        if thinking is not None:
            message["reasoning_content"] = thinking
        return message

    def text(self) -> str:
        """The message's content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> str | None:
        """The first field set to something this server does not do yet."""
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs"
        if self.continue_final_message and self.add_generation_prompt:
            return "continue_final_message"
        if self.continue_final_message and self.messages[-1].role != "assistant":
            return "continue_final_message"
        return None

    def top_logprobs_wanted(self) -> int | None:
        """None for no log-probabilities, else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def output_format(self) -> tuple[dict[str, Any] | None, str]:
        """response_format wins over llama-server's json_schema when both are set."""
        if self.response_format and self.response_format.get("type", "text") != "text":
            return self.response_format, "response_format"
        return super().output_format()

    def token_limit(self) -> int | None:
        """max_completion_tokens, else the older max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens
