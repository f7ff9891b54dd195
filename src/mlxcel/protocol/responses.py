"""POST /v1/responses request body, its input items and its tools."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)
from pydantic_core import PydanticCustomError

from mlxcel.media.images import MEDIA_MARKER
from mlxcel.protocol.common import ReasoningEffort, SamplingFields, Strict
from mlxcel.protocol.policy import NoEffect


class ContentPart(Strict):
    type: Literal["input_text", "output_text", "input_image"]
    text: str | None = None
    image_url: str | None = None
    """An input_image's data: URI or URL (file_id images need the Files API, which is not here)."""
    detail: Annotated[
        Literal["auto", "low", "high"] | None,
        NoEffect("the model's projector sets how many tokens an image takes"),
    ] = None
    # Carried by a response's own output parts, so its items can be sent back as input.
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_audio(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") == "input_audio":
            # OpenAI's Responses API takes no audio parts either.
            raise PydanticCustomError(
                "unsupported_content_part",
                "the Responses API takes no input_audio parts: send audio to /v1/chat/completions",
            )
        return value

    @model_validator(mode="after")
    def _has_its_data(self) -> ContentPart:
        if self.type == "input_image" and self.image_url is None:
            raise ValueError(
                "an input_image part needs its image_url (file_id needs the Files API, "
                "which this server does not have)"
            )
        if self.type != "input_image" and self.text is None:
            raise ValueError(f"a '{self.type}' part needs its 'text' field")
        return self


def _as_parts(value: Any) -> Any:
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


# A string, or text parts; one shape after validation keeps errors naming the real field.
Content = Annotated[list[ContentPart], BeforeValidator(_as_parts)]


def _text(content: list[ContentPart]) -> str:
    return "".join(MEDIA_MARKER if p.type == "input_image" else p.text or "" for p in content)


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Content
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        """The message's content as one string."""
        return _text(self.content)


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: Content
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        """The tool's output as one string."""
        return _text(self.output)


class ReasoningText(Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Strict):
    """An earlier answer's thinking, sent back as clients do with a response's output."""

    type: Literal["reasoning"]
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    id: str | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        """The reasoning text (else the summary, else what include's encrypted_content carried)."""
        parts = self.content or self.summary
        if parts:
            return "".join(part.text for part in parts)
        return self.encrypted_content or ""


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(
        _item_type,
        custom_error_type="invalid_input_item",
        custom_error_message=(
            "this server takes input items of type message, function_call, "
            "function_call_output and reasoning"
        ),
    ),
]


def _as_items(value: Any) -> Any:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class FunctionTool(Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class OtherTool(BaseModel):
    """A tool of a type this server does not run; kept only to name it in a 400."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function" if kind == "function" else "other"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[OtherTool, Tag("other")],
    Discriminator(_tool_type),
]


class ReasoningConfig(Strict):
    effort: ReasoningEffort | None = None
    # Accepted for compatibility; the reasoning item carries the thinking itself, not a summary.
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextConfig(Strict):
    format: dict[str, Any] | None = None


class ResponsesRequest(SamplingFields):
    """The Responses API body; sampling fields and llama-server knobs come from SamplingFields."""

    input: Annotated[list[InputItem], BeforeValidator(_as_items), Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: TextConfig | None = None
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    parallel_tool_calls: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None
    # Declared only so that a request using it gets a 400 that names it.
    background: bool | None = None

    def output_format(self) -> tuple[dict[str, Any] | None, str]:
        """text.format constrains a response's output."""
        if self.text and self.text.format and self.text.format.get("type", "text") != "text":
            return self.text.format, "text.format"
        return super().output_format()

    def function_tools(self) -> list[FunctionTool]:
        """The request's function tools."""
        return [tool for tool in self.tools or [] if isinstance(tool, FunctionTool)]
