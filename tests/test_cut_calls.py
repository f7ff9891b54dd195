"""Tool calls that max_tokens cuts off: the same answer streamed and whole, in every format.

The calls before the cut stay calls; the call being written after them is dropped (issue 38: a
forced call's cut repeat came back as markup in content), and alone it is content; a call whose
JSON is whole is a call though its closing tag was cut; no call goes out with broken arguments
or closing-tag fragments. Over HTTP the cut is forced: the tool call grammar
writes a fixed call, ignore_eos keeps it writing more, and max_tokens lands in the second.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from mlxcel.parsers.tools.deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, SEP
from mlxcel.serving.answer import AnswerStream, parse_answer
from mlxcel.serving.tools import ToolPlan, ToolStream
from tests.server_process import ServerProcess

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris"]}},
            "required": ["city"],
        },
    },
}
PARIS = {"city": "Paris"}

# Per format: one whole call, then the start of a second that the text's end cut off.
CUT = {
    "hermes": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
        '<tool_call>\n{"name": "get_weather", "arguments": { "city": "Par',
    ),
    "mistral": (
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, ',
        '{"name": "get_weather", "argu',
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>\n",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa",
    ),
    "deepseek_v3": (
        f'{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{{"city": "Paris"}}\n```'
        f"{CALL_END}\n",
        f'{CALL_BEGIN}function{SEP}get_weather\n```json\n{{"city": "Pa',
    ),
    "harmony": (
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|>',
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Pa',
    ),
}


def _streamed(text: str, step: int, plan: ToolPlan, truncated: bool) -> tuple[str, list[Any]]:
    """Content and calls as a client puts a stream of `text` together."""
    stream = AnswerStream("harmony" if plan.parser == "harmony" else None, plan)
    deltas = []
    for i in range(0, len(text), step):
        deltas += stream.feed(text[i : i + step])
    deltas += stream.finish(truncated)
    content = "".join(d.get("content", "") for d in deltas)
    fragments: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            if "id" in call:
                names[call["index"]] = call["function"]["name"]
            fragments.setdefault(call["index"], []).append(call["function"]["arguments"])
    calls = [(names[i], json.loads("".join(fragments[i]))) for i in sorted(fragments)]
    return content.strip(), calls


@pytest.mark.parametrize("name", sorted(CUT))
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_cut_off_call_is_dropped_and_the_calls_before_it_stay(name: str, step: int) -> None:
    whole_call, cut_call = CUT[name]
    plan = ToolPlan([WEATHER], name, None)
    answer = parse_answer(whole_call + cut_call, None, plan, truncated=True)
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer.tool_calls
    ] == [("get_weather", PARIS)]
    assert answer.content is None
    assert _streamed(whole_call + cut_call, step, plan, truncated=True) == (
        "",
        [("get_weather", PARIS)],
    )


@pytest.mark.parametrize("name", sorted(CUT))
def test_a_call_cut_off_alone_is_all_content(name: str) -> None:
    cut_call = CUT[name][1].removeprefix("<|start|>assistant")
    answer = parse_answer(cut_call, None, ToolPlan([WEATHER], name, None), truncated=True)
    assert (answer.content, answer.tool_calls) == (cut_call, [])


@pytest.mark.parametrize("truncated", [False, True])
def test_a_whole_call_whose_closing_tag_was_cut_is_a_call(truncated: bool) -> None:
    # max_tokens 30 on Qwen2.5-Coder ends a forced call here: its JSON is whole.
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_'
    plan = ToolPlan([WEATHER], "hermes", None)
    answer = parse_answer(text, None, plan, truncated=truncated)
    assert [json.loads(c["function"]["arguments"]) for c in answer.tool_calls] == [PARIS]
    assert answer.content is None
    for step in (1, 3):
        assert _streamed(text, step, plan, truncated) == ("", [("get_weather", PARIS)])


def test_a_closing_tag_cut_by_a_stop_is_left_out_of_the_arguments() -> None:
    # Not max_tokens (a stop token or string): the call's JSON is whole, so it is a call.
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_'
    plan = ToolPlan([WEATHER], "hermes", None)
    answer = parse_answer(text, None, plan)
    assert [json.loads(c["function"]["arguments"]) for c in answer.tool_calls] == [PARIS]
    assert _streamed(text, 1, plan, truncated=False) == ("", [("get_weather", PARIS)])


def test_calls_keep_counting_from_zero_past_a_bad_one() -> None:
    bad = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>'
    good = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    stream = ToolStream("hermes", [WEATHER])
    deltas = stream.feed(bad + good) + stream.finish()
    assert [d["content"] for d in deltas if "content" in d] == [bad]
    assert {call["index"] for d in deltas for call in d.get("tool_calls", [])} == {0}
    assert stream.calls == 1


ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


def _cut_budget(client: openai.OpenAI) -> int:
    """max_tokens that ends halfway into a second forced call: 1.5 times one call's tokens."""
    one = client.chat.completions.create(
        model="default",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=100,
    )
    assert one.choices[0].finish_reason == "tool_calls" and one.usage is not None
    return one.usage.completion_tokens * 3 // 2


def _forced_two(max_tokens: int) -> dict[str, Any]:
    # ignore_eos: after a call the grammar allows only the next one.
    return {
        "model": "default",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


@pytest.mark.slow
def test_chat_cut_off_call_streamed_and_whole(server: ServerProcess) -> None:
    client = server.openai()
    body = _forced_two(_cut_budget(client))
    with server.http() as http:
        whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    message = whole["message"]
    assert whole["finish_reason"] == "length"
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]
    assert calls and all(call == ("get_weather", PARIS) for call in calls)
    assert message["content"] is None  # the cut repeat is dropped, never markup
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    streamed_calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            assert "<" not in arguments, arguments  # no markup, never a closing tag's start
            entry = streamed_calls.setdefault(call["index"], {"name": "", "arguments": ""})
            entry["name"] += call["function"].get("name") or ""
            entry["arguments"] += arguments
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed_calls.values()] == calls
    assert "".join(d.get("content") or "" for d in deltas).strip() == ""


@pytest.mark.slow
def test_responses_cut_off_call_streamed_and_whole(server: ServerProcess) -> None:
    client = server.openai()
    budget = _cut_budget(client)
    body = _forced_two(budget)
    tool = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
    request = {
        "model": body["model"],
        "input": "What's the weather in Paris?",
        "tools": [tool],
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": budget,
        "ignore_eos": True,
        "store": False,
    }
    with server.http() as http:
        whole = http.post("/v1/responses", json=request).json()
        with http.stream("POST", "/v1/responses", json={**request, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert whole["status"] == "incomplete", whole
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    kinds = [item["type"] for item in whole["output"]]
    calls = [item for item in whole["output"] if item["type"] == "function_call"]
    assert calls and all(json.loads(c["arguments"]) == PARIS for c in calls)
    assert "message" not in kinds  # the cut repeat is dropped, never markup
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert [i["type"] for i in final["output"]] == kinds
    streamed_args = [i["arguments"] for i in final["output"] if i["type"] == "function_call"]
    assert streamed_args == [c["arguments"] for c in calls]
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert all("<" not in delta for delta in deltas)


@pytest.mark.slow
def test_messages_cut_off_call_streamed_and_whole(server: ServerProcess) -> None:
    budget = _cut_budget(server.openai())
    claude = server.anthropic()
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    request: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": budget,
        "messages": ASK,
        "tools": [tool],
        "tool_choice": {"type": "any"},
        "extra_body": {"ignore_eos": True, "temperature": 0},
    }
    whole = claude.messages.create(**request)
    assert whole.stop_reason == "max_tokens"
    uses = [block for block in whole.content if block.type == "tool_use"]
    assert uses and all(block.input == PARIS for block in uses)  # type: ignore[union-attr]
    assert [block.type for block in whole.content if block.type != "tool_use"] == []
    with claude.messages.stream(**request) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    partial = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]  # type: ignore[union-attr]
    assert all("<" not in fragment for fragment in partial)
    assert streamed.stop_reason == "max_tokens"
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [b.input for b in uses]  # type: ignore[union-attr]
    assert "".join(b.text for b in streamed.content if b.type == "text").strip() == ""  # type: ignore[union-attr]
