"""Calls a model wrote without their tags (issue 38): Qwen2.5-Coder-0.5B answers a weather
question with a bare `{"name": "get_weather", "arguments": {...}}`. JSON naming a declared
tool at the start of the answer is a call, whole or streamed in any pieces; JSON naming none,
or anywhere else, is content."""

from __future__ import annotations

import json

import pytest

from mlxcel.serving.answer import parse_answer
from mlxcel.serving.tools import ToolPlan, ToolStream

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PLAN = ToolPlan([WEATHER], "hermes", None)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def _streamed(text: str, step: int) -> tuple[str, list[tuple[str, object]]]:
    stream = ToolStream("hermes", [WEATHER])
    deltas = []
    for at in range(0, len(text), step):
        deltas += stream.feed(text[at : at + step])
    deltas += stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            if "id" in call:
                names[call["index"]] = call["function"]["name"]
            arguments[call["index"]] = (
                arguments.get(call["index"], "") + (call["function"]["arguments"])
            )
    return content, [(names[i], json.loads(arguments[i])) for i in sorted(names)]


PARIS = ("get_weather", {"city": "Paris"})


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        (CALL, [PARIS]),
        ("\n " + CALL + "\n", [PARIS]),
        (f"[{CALL}, {CALL}]", [PARIS, PARIS]),
        (f"{CALL}\n{CALL}", [PARIS, PARIS]),
        (f"{CALL}\n<tool_call>\n{CALL}\n</tool_call>", [PARIS, PARIS]),
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
        ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', [PARIS]),
    ],
)
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_untagged_calls_to_declared_tools(text: str, calls: list[object], step: int) -> None:
    answer = parse_answer(text, None, PLAN)
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer.tool_calls
    ]
    assert (answer.content, got) == (None, calls)
    assert _streamed(text, step) == ("", calls)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_time", "arguments": {}}',  # no such tool
        '{"city": "Paris", "name": "get_weather"}',  # JSON of another shape
        '[1, 2, {"name": "get_weather", "arguments": {}}]',
        "[]",
        "{}",
        f"The call would be {CALL}",  # not at the start
        '{"name": "get_weather", "arguments": {"city": "Pa',  # cut off
        '{"name": "get_weather", "arguments": ["Paris"]}',
    ],
)
@pytest.mark.parametrize("step", [1, 5, 1000])
def test_other_json_stays_content(text: str, step: int) -> None:
    assert parse_answer(text, None, PLAN).tool_calls == []
    assert _streamed(text, step) == (text, [])


def test_json_that_names_no_tool_streams_before_it_ends() -> None:
    stream = ToolStream("hermes", [WEATHER])
    assert stream.feed('{"answer": "the weather is ') == [{"content": '{"answer": "the weather is'}]
    stream = ToolStream("hermes", [WEATHER])
    assert stream.feed('{"name": "get_time", "x": ') == [{"content": '{"name": "get_time", "x":'}]


def test_without_tools_json_is_content() -> None:
    stream = ToolStream("hermes", None)
    assert stream.feed(CALL) + stream.finish() == [{"content": CALL}]


def test_an_untagged_repeat_cut_by_max_tokens_is_dropped() -> None:
    text = CALL + '\n{"name": "get_weather", "arguments": {"ci'
    answer = parse_answer(text, None, PLAN, truncated=True)
    assert answer.content is None and len(answer.tool_calls) == 1
    stream = ToolStream("hermes", [WEATHER])
    deltas = stream.feed(text) + stream.finish(truncated=True)
    assert not any(d.get("content") for d in deltas) and stream.calls == 1
