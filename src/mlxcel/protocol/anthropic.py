"""POST /v1/messages and /v1/messages/count_tokens bodies: Anthropic's Messages API.

The sampling fields and llama-server's knobs come from SamplingFields, as on every text route;
Anthropic's own names (`stop_sequences`, `system`, `tools` with `input_schema`) sit on top.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from mlxcel.protocol.common import SamplingFields, Strict

# Prompt caching is automatic here (the prefix cache matches the prompt's own tokens), so a
# block's cache_control breakpoint is accepted and has nothing to add.
CacheControl = dict[str, Any] | None


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None
    citations: list[Any] | None = None


class ImageBlock(Strict):
    """Declared so that an image gets a 400 saying the model takes none, not a schema error."""

    type: Literal["image"]
    source: dict[str, Any]
    cache_control: CacheControl = None


class DocumentBlock(BaseModel):
    """A PDF or text document; declared only so that a 400 can name it."""

    model_config = ConfigDict(extra="allow")
    type: Literal["document"]


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Discriminator("type")]] | None = None
    is_error: bool | None = None
    cache_control: CacheControl = None


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Strict):
    """Thinking Anthropic encrypted: nothing here can read it, so it is left out of the prompt."""

    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock,
    Discriminator("type"),
]


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    def blocks(self) -> list[Block]:
        """The content as blocks, a plain string being one text block."""
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return self.content


class CustomTool(Strict):
    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl = None
    # As on chat: a forced call follows the schema exactly, strict or not.
    strict: bool | None = None
    # Tool input always streams as the model writes it.
    eager_input_streaming: bool | None = None


class ServerTool(BaseModel):
    """A tool Anthropic runs itself (web search, code execution, ...); kept to name it in a 400."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "custom" if kind in (None, "custom") else "server"


Tool = Annotated[
    Annotated[CustomTool, Tag("custom")] | Annotated[ServerTool, Tag("server")],
    Discriminator(_tool_kind),
]


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


# Thinking comes back as the model wrote it; "omitted" (signature only) is not offered.
ThinkingDisplay = Literal["summarized"] | None


class ThinkingEnabled(Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: ThinkingDisplay = None


class ThinkingAdaptive(Strict):
    type: Literal["adaptive"]
    display: ThinkingDisplay = None


class ThinkingDisabled(Strict):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Discriminator("type")]


class OutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(Strict):
    user_id: str | None = None


class CountTokensRequest(SamplingFields):
    """What a message's prompt is made of: count_tokens takes this much."""

    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    # Required, as Anthropic's API has it: a client written against this server works there.
    max_tokens: int = Field(ge=1)

    stop_sequences: list[str] | None = None
    metadata: Metadata | None = None
    # Anthropic's capacity tiers; one local server has one, so either value is the same.
    service_tier: Literal["auto", "standard_only"] | None = None
