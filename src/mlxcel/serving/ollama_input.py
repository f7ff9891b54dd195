"""Ollama requests -> the requests the chat, /completion and /infill paths already run.

/api/chat becomes a chat completions request; /api/generate one too (its prompt a user
message after `system`), or with `raw` (or `context`) a /completion request over the text,
or with `suffix` an /infill request. `options` become the sampling fields every text route
honours, `format` structured output, `think` the reasoning effort, `images` data: URIs.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from pydantic import ValidationError

from mlxcel.media.images import image_type
from mlxcel.protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    ImageURL,
    ToolCall,
    text_parts,
)
from mlxcel.protocol.errors import APIError, field_error, invalid_request
from mlxcel.protocol.infill import InfillRequest
from mlxcel.protocol.native import NativeCompletionRequest
from mlxcel.protocol.ollama import ChatRequest, GenerateRequest, GenerationFields, Message
from mlxcel.serving.structured import ANY_OBJECT, checked_schema

# Ollama's option -> the sampling field of the same meaning; num_predict is n_predict.
HONOURED_OPTIONS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "seed",
    "stop",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
)
# Ollama's num_predict -2: "until the context is full", which is what -1 means here.
_FILL_CONTEXT = -2


def sampling(request: GenerationFields) -> dict[str, Any]:
    """The request's options as sampling fields, with `stream` (always set: Ollama's default
    is to stream)."""
    fields: dict[str, Any] = {"stream": request.stream}
    options = request.options
    if options is None:
        return fields
    for name in HONOURED_OPTIONS:
        value = getattr(options, name)
        if value is not None:
            fields[name] = value
    if options.num_predict is not None:
        fields["n_predict"] = -1 if options.num_predict <= _FILL_CONTEXT else options.num_predict
    return fields


def output_schema(request: GenerationFields) -> dict[str, Any] | None:
    """`format` as a JSON schema: "json" any object, a schema itself; None for free text."""
    if not request.format:
        return None
    if request.format == "json":
        return ANY_OBJECT
    if not isinstance(request.format, dict):
        raise invalid_request('format must be "json" or a JSON schema', "format")
    # Checked here so that a bad schema is named as `format`, not as the chat field it becomes.
    checked_schema(request.format, "format")
    return request.format


def _response_format(request: GenerationFields) -> dict[str, Any] | None:
    schema = output_schema(request)
    if schema is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _effort(request: GenerationFields) -> dict[str, Any]:
    """`think`: false turns thinking off, true on, a level sets the reasoning effort."""
    if request.think is None:
        return {}
    if request.think is False:
        return {"reasoning_effort": "none"}
    if request.think is True:
        return {"chat_template_kwargs": {"enable_thinking": True}}
    return {"reasoning_effort": request.think}


def image_part(data: str, param: str) -> ContentPart:
    """A base64 image as a chat image part, its type read from its first bytes."""
    try:
        head = base64.b64decode(data[:16] + "=" * (-len(data[:16]) % 4))
    except (binascii.Error, ValueError):
        raise invalid_request("an image must be base64 encoded", param, "invalid_image") from None
    kind = image_type(head) or "image/png"
    return ContentPart(type="image_url", image_url=ImageURL(url=f"data:{kind};base64,{data}"))


def _content(text: str, images: list[str] | None, param: str) -> list[ContentPart]:
    parts = [image_part(image, f"{param}.images.{i}") for i, image in enumerate(images or [])]
    return [*parts, ContentPart(type="text", text=text)] if text or not parts else parts


def _calls(message: Message, index: int, names: dict[str, str]) -> list[ToolCall] | None:
    if not message.tool_calls:
        return None
    calls = []
    for number, call in enumerate(message.tool_calls):
        call_id = call.id or f"call_{index}_{number}"
        names[call_id] = call.function.name
        arguments = json.dumps(call.function.arguments, ensure_ascii=False)
        function = FunctionCall(name=call.function.name, arguments=arguments)
        calls.append(ToolCall(id=call_id, function=function))
    return calls


def chat_messages(messages: list[Message]) -> list[ChatMessage]:
    """Ollama messages as chat messages: images as parts, tool results named by `tool_name`,
    earlier thinking as reasoning_content."""
    out: list[ChatMessage] = []
    names: dict[str, str] = {}
    for index, message in enumerate(messages):
        param = f"messages.{index}"
        if message.images and message.role != "user":
            raise invalid_request("images are read in user messages", f"{param}.images")
        calls = _calls(message, index, names)
        tool_call_id = message.tool_call_id
        if message.role == "tool" and tool_call_id is None:
            # Ollama names a result by its tool: the latest call of that name it answers.
            wanted = message.tool_name
            tool_call_id = next((i for i, n in reversed(names.items()) if n == wanted), None)
        content = _content(message.content, message.images, param)
        out.append(
            ChatMessage(
                role=message.role,
                content=None if calls and not message.content else content,
                tool_calls=calls,
                tool_call_id=tool_call_id,
                name=message.tool_name if message.role == "tool" else None,
                reasoning_content=message.thinking or None,
            )
        )
    return out


def _checked(build: Any, *args: Any) -> Any:
    """Build a request of the path it runs on, a field the translation rejects named as
    Ollama's: options.temperature, not temperature."""
    try:
        return build(*args)
    except ValidationError as exc:
        found = field_error(exc.errors())
        name = found.path.split(".")[0]
        path = f"options.{found.path}" if name in (*HONOURED_OPTIONS, "n_predict") else found.path
        raise invalid_request(f"'{path}': {found.message}", path) from None


def chat_request(request: ChatRequest) -> ChatCompletionRequest:
    """The chat completions request an /api/chat request stands for."""
    return _checked(_chat, request, chat_messages(request.messages))  # type: ignore[no-any-return]


def _chat(request: GenerationFields, messages: list[ChatMessage]) -> ChatCompletionRequest:
    tools = request.tools if isinstance(request, ChatRequest) else None
    # A final assistant message is a prefill: the model carries on from its text.
    prefill = bool(messages) and messages[-1].role == "assistant"
    return ChatCompletionRequest(
        **sampling(request),
        **_effort(request),
        messages=messages,
        tools=tools or None,
        response_format=_response_format(request),
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
    )


def generate_chat(request: GenerateRequest) -> ChatCompletionRequest:
    """/api/generate through the model's chat template: `system`, then the prompt (and its
    images) as the user's message."""
    messages = []
    if request.system:
        messages.append(ChatMessage(role="system", content=text_parts(request.system)))
    content = _content(request.prompt or "", request.images, "")
    messages.append(ChatMessage(role="user", content=content))
    return _checked(_chat, request, messages)  # type: ignore[no-any-return]


def generate_native(request: GenerateRequest, text: str) -> NativeCompletionRequest:
    """/api/generate as /completion: `text` after the `context` tokens of an earlier answer."""
    if request.images:
        raise _no_images("raw")
    prompt: str | list[int | str] = [*request.context, text] if request.context else text
    schema = output_schema(request)
    return _checked(  # type: ignore[no-any-return]
        lambda: NativeCompletionRequest(**sampling(request), prompt=prompt, json_schema=schema)
    )


def generate_infill(request: GenerateRequest) -> InfillRequest:
    """/api/generate with a `suffix`: the gap between the prompt and the suffix, filled."""
    if request.images:
        raise _no_images("suffix")
    if request.context:
        raise invalid_request("context cannot be continued with a suffix (infill)", "context")
    schema = output_schema(request)
    return _checked(  # type: ignore[no-any-return]
        lambda: InfillRequest(
            **sampling(request),
            input_prefix=request.prompt or "",
            input_suffix=request.suffix or "",
            json_schema=schema,
        )
    )


def _no_images(field: str) -> APIError:
    return invalid_request(
        f"images go through the chat template, which {field} leaves out: send them without it",
        "images",
        "unsupported_content",
    )
