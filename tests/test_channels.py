"""Channel formats over HTTP: gpt-oss harmony (reasoning, content and calls) and Gemma thoughts.

The default model knows neither, so grammars make it write the markup; templates with the
formats' markup make the parsers' 'auto' choose them, as a real model's template would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.conftest import serving
from tests.server_process import ServerProcess
from tests.test_tools import ASK, WEATHER

DATA = Path(__file__).parent / "data"
WORDS = '[a-z]{2,8} (" " [a-z]{2,8}){0,3}'
HARMONY = (
    f'root ::= "<|channel|>analysis<|message|>" {WORDS} "<|end|><|start|>assistant'
    f'<|channel|>final<|message|>" {WORDS}'
)
GEMMA = f'root ::= "<|channel>thought\\n" {WORDS} "<channel|>" {WORDS}'


def _with_template(tmp: pytest.TempPathFactory, template: str) -> Iterator[ServerProcess]:
    return serving(tmp, template, "--chat-template-file", str(DATA / template))


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _with_template(tmp_path_factory, "harmony_template.jinja")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _with_template(tmp_path_factory, "gemma_template.jinja")


def _words(text: str | None) -> bool:
    return bool(text) and text.replace(" ", "").isalpha()  # type: ignore[union-attr]


def _chat(server: ServerProcess, stream: bool, **body: Any) -> tuple[str, str, list[Any]]:
    """(reasoning, content, tool calls) of one chat answer, streamed or whole."""
    client = server.openai()
    request: dict[str, Any] = {"model": "default", "messages": ASK, "max_tokens": 160, **body}
    if not stream:
        message = client.chat.completions.create(**request).choices[0].message
        reasoning = getattr(message, "reasoning_content", None) or ""
        return reasoning, message.content or "", list(message.tool_calls or [])
    reasoning, content, calls = "", "", {}
    for chunk in client.chat.completions.create(**request, stream=True):
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += (call.function and call.function.name) or ""
            entry["arguments"] += (call.function and call.function.arguments) or ""
    return reasoning, content, list(calls.values())


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_harmony_channels_split_reasoning_from_content(
    harmony: ServerProcess, stream: bool
) -> None:
    reasoning, content, calls = _chat(harmony, stream, extra_body={"grammar": HARMONY})
    assert _words(reasoning) and _words(content) and not calls


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_harmony_forced_call(harmony: ServerProcess, stream: bool) -> None:
    reasoning, content, calls = _chat(harmony, stream, tools=[WEATHER], tool_choice="required")
    assert len(calls) == 1 and not content and not reasoning
    call = (
        calls[0]
        if stream
        else {"name": calls[0].function.name, "arguments": calls[0].function.arguments}
    )
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])


@pytest.mark.slow
def test_harmony_on_responses(harmony: ServerProcess) -> None:
    client = harmony.openai()
    response = client.responses.create(
        input="Hello", max_output_tokens=160, extra_body={"grammar": HARMONY}
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert _words(response.output[0].content[0].text)  # type: ignore[union-attr]
    assert _words(response.output_text)
    tool = {"type": "function", **WEATHER["function"]}
    called = client.responses.create(
        input="Weather?",
        tools=[tool],
        tool_choice="required",
        max_output_tokens=160,  # type: ignore[list-item]
    )
    assert [item.type for item in called.output] == ["function_call"]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_gemma_thought_channel(gemma: ServerProcess, stream: bool) -> None:
    reasoning, content, _ = _chat(gemma, stream, extra_body={"grammar": GEMMA})
    assert _words(reasoning) and _words(content)
    assert "channel" not in reasoning + content


def test_auto_parsers_are_read_from_the_template_and_logged(
    harmony: ServerProcess, gemma: ServerProcess
) -> None:
    assert "tool-call parser: harmony (auto" in harmony.log()
    assert "reasoning parser: harmony (auto" in harmony.log()
    assert "reasoning parser: gemma (auto" in gemma.log()
