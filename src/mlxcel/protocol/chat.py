"""POST /v1/chat/completions request body."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from mlxcel.media.images import MEDIA_MARKER
from mlxcel.protocol.common import ReasoningEffort, SamplingFields
from mlxcel.protocol.policy import NoEffect, Refused, Strict

_PART_TYPES = ("text", "refusal", "image_url", "input_audio")


def _arguments(function: FunctionCall) -> Any:
    try:
        return json.loads(function.arguments)
    except ValueError:
        return function.arguments


class ImageURL(Strict):
    url: str
    detail: Annotated[
        Literal["auto", "low", "high"] | None,
        NoEffect("the model's projector sets how many tokens an image takes"),
    ] = None


class InputAudio(Strict):
    """OpenAI's audio part: base64 data (no data: prefix) and its format. The bytes are read
    for what they are (any container FFmpeg reads); `format` names what the client sent."""

    data: str
    format: str


class ContentPart(Strict):
    """A text, image or audio part (or an earlier answer's refusal part); other kinds are a
    400 naming them. An image or audio clip stands in the text as MEDIA_MARKER where it sits."""

    type: Literal["text", "refusal", "image_url", "input_audio"]
    text: str | None = None
    refusal: str | None = None
    image_url: ImageURL | None = None
    input_audio: InputAudio | None = None
    # Anthropic-style prompt-caching hint that LiteLLM and others pass through.
    cache_control: Annotated[
        dict[str, Any] | None,
        NoEffect("the prefix cache keeps every prompt's tokens without being asked"),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind not in _PART_TYPES:
            raise PydanticCustomError(
                "unsupported_content_part",
                "content part of type '{kind}' is not supported: this server reads text, "
                "image_url and input_audio parts",
                {"kind": kind},
            )
        return value

    @model_validator(mode="after")
    def _has_its_text(self) -> ContentPart:
        if getattr(self, self.type) is None:
            raise ValueError(f"a '{self.type}' part needs its '{self.type}' field")
        return self

    def content(self) -> str:
        """The part's text (a refusal part's refusal, an image's or clip's marker)."""
        if self.type in ("image_url", "input_audio"):
            return MEDIA_MARKER
        return (self.text if self.type == "text" else self.refusal) or ""


def _as_parts(value: Any) -> Any:
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


# A string, or content parts; one shape after validation keeps errors naming the real part.
Content = Annotated[list[ContentPart] | None, BeforeValidator(_as_parts)]


def text_parts(text: str | None) -> list[ContentPart] | None:
    """A message's content built from text, in the one shape content takes."""
    return None if text is None else [ContentPart(type="text", text=text)]


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
    index: Annotated[
        int | None, NoEffect("a stream's position, kept by clients that joined the deltas")
    ] = None


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


class FunctionName(Strict):
    name: str


def _text_only(modalities: list[str] | None) -> bool:
    return modalities is None or set(modalities) <= {"text"}


class ChatMessage(Strict):
    # "function" is the legacy function-calling result; templates see it as a tool message.
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # An earlier answer's thinking, as this server returned it; templates read reasoning_content.
    reasoning_content: str | None = None
    reasoning: str | None = None
    # An earlier answer's refusal: with no content of its own, the turn's text.
    refusal: str | None = None
    # Legacy function calling: the call an earlier answer made, seen as a tool call.
    function_call: FunctionCall | None = None
    annotations: Annotated[
        list[Any] | None, NoEffect("citations of an earlier answer; the model reads the text")
    ] = None
    audio: Annotated[
        dict[str, Any] | None,
        Refused("this server never generates audio, so there is no audio answer to refer to"),
    ] = None

    def _calls(self) -> list[tuple[str, FunctionCall]]:
        calls = [(call.id, call.function) for call in self.tool_calls or []]
        if self.function_call is not None:
            calls.append((f"call_{len(calls)}", self.function_call))
        return calls

    def template_dict(self) -> dict[str, Any]:
        """The message as HF chat templates read it (tool-call arguments as a mapping)."""
        role = "tool" if self.role == "function" else self.role
        message: dict[str, Any] = {"role": role, "content": self.text()}
        calls = self._calls()
        if calls:
            message["content"] = self.text() or None
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": function.name, "arguments": _arguments(function)},
                }
                for call_id, function in calls
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
        """The message's content as one string (its refusal, when it has no content)."""
        text = "".join(part.content() for part in self.content or [])
        return text or self.refusal or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
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
    # Legacy function calling, served as tools: a call comes back as message.function_call.
    functions: list[FunctionDef] | None = None
    function_call: Literal["none", "auto"] | FunctionName | None = None
    store: Annotated[
        bool | None, NoEffect("completions are not kept for listing; /v1/responses stores")
    ] = None
    metadata: Annotated[
        dict[str, str] | None, NoEffect("tags for stored completions, which are not kept")
    ] = None
    service_tier: Annotated[str | None, NoEffect("one local tier serves every request")] = None
    verbosity: Annotated[
        Literal["low", "medium", "high"] | None,
        NoEffect("a hint for OpenAI's own models; the length is the model's and max_tokens'"),
    ] = None
    prompt_cache_retention: Annotated[
        str | None, NoEffect("the prefix cache keeps what fits in its memory, for no set time")
    ] = None
    modalities: Annotated[
        list[Literal["text", "audio"]] | None,
        Refused("this server generates text only, no audio", accepts=_text_only),
    ] = None
    audio: Annotated[
        dict[str, Any] | None, Refused("this server generates text only, no audio")
    ] = None
    prediction: Annotated[
        dict[str, Any] | None, Refused("predicted outputs are not implemented")
    ] = None
    web_search_options: Annotated[
        dict[str, Any] | None, Refused("this server has no web search")
    ] = None

    def unsupported(self) -> str | None:
        """The first field set to something this server does not do yet."""
        if self.functions and self.tools:
            return "functions"
        if self.function_call is not None and not self.functions:
            return "function_call"
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs"
        if self.continue_final_message and self.add_generation_prompt:
            return "continue_final_message"
        if self.continue_final_message and self.messages[-1].role != "assistant":
            return "continue_final_message"
        return None

    def top_logprobs_wanted(self) -> int | None:
        """None for no log-probabilities, else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else super().top_logprobs_wanted()

    @property
    def legacy_functions(self) -> bool:
        """Whether tools came as legacy `functions`, so calls go back as `function_call`."""
        return bool(self.functions)

    def tool_defs(self) -> list[ToolDef]:
        """`tools`, or the legacy `functions` as function tools."""
        if self.functions:
            return [ToolDef(type="function", function=f) for f in self.functions]
        return self.tools or []

    def tool_choice_value(self) -> str | dict[str, Any] | None:
        """tool_choice as a string or a named-function object (legacy function_call mapped)."""
        choice = self.tool_choice
        if self.functions and self.function_call is not None:
            call = self.function_call
            if isinstance(call, str):
                return call
            return {"type": "function", "function": {"name": call.name}}
        return choice.model_dump() if isinstance(choice, NamedToolChoice) else choice

    def output_format(self) -> tuple[dict[str, Any] | None, str]:
        """response_format wins over llama-server's json_schema when both are set."""
        if self.response_format and self.response_format.get("type", "text") != "text":
            return self.response_format, "response_format"
        return super().output_format()

    def token_limit(self) -> int | None:
        """n_predict (llama-server's), else max_completion_tokens, else the older max_tokens."""
        if self.n_predict is None and self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return super().token_limit()
