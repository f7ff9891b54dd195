"""Agent histories through every real chat template in llama.cpp's folder (issue 38).

What agent frameworks send back: assistant turns that made tool calls with content "" or null
(and reasoning_content), tool results with and without a name, system and developer messages,
an image part. Each template renders it, through the same path as a chat request, and the
prompt shows the tools' names and the tools' results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxcel.engine.types import ChatTemplate
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.serving.chat import templated_chat
from tests.cached_data import llama_cpp_templates

PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4"
    "z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
)


def _tool(name: str, key: str) -> dict[str, Any]:
    # The parameter has a description (Command R+ prints it); the function has none, as
    # clients often send it (a template printing it gets "").
    properties = {key: {"type": "string", "description": f"The {key}"}}
    parameters = {"type": "object", "properties": properties, "required": [key]}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = [_tool("get_weather", "city"), _tool("get_time", "zone")]
WEATHER_RESULT, TIME_RESULT = "18 degrees and sunny", "half past nine"


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def history(content: str | None) -> list[dict[str, Any]]:
    """A standard agent loop, its assistant turns with calls holding `content`."""
    return [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "developer", "content": "Answer briefly."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What's the weather in Paris, and the time?"},
                {"type": "image_url", "image_url": {"url": PIXEL}},
            ],
        },
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [_call("call_1", "get_weather", '{"city": "Paris"}')],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "get_weather",
            "content": WEATHER_RESULT,
        },
        {
            "role": "assistant",
            "content": content,
            "reasoning_content": "Now the time.",
            "tool_calls": [_call("call_2", "get_time", '{"zone": "CET"}')],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": TIME_RESULT},
        {"role": "assistant", "content": "It is 18 degrees, half past nine."},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ]


def _render(path: Path, messages: list[dict[str, Any]], **body: Any) -> str:
    template = ChatTemplate(path.read_text(), "<s>", "</s>")
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **body})
    return templated_chat(template, request, "auto")


TEMPLATES = llama_cpp_templates()


def test_the_folder_is_llama_cpps() -> None:
    names = {path.stem for path in TEMPLATES}
    assert len(names) >= 60
    assert {"Qwen-Qwen3-0.6B", "meta-llama-Llama-3.3-70B-Instruct", "openai-gpt-oss-120b"} <= names


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
@pytest.mark.parametrize("content", ["", None])
def test_agent_history_renders(path: Path, content: str | None) -> None:
    prompt = _render(path, history(content), tools=TOOLS)
    assert "get_weather" in prompt and "get_time" in prompt
    assert WEATHER_RESULT in prompt and TIME_RESULT in prompt
