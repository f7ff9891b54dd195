"""Tool calling: the hermes parser token by token, and forced calls over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from mlxcel.parsers.tools import PARSERS, Text, ToolArguments, ToolEnd, ToolStart
from tests.conftest import start
from tests.server_process import ServerProcess

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"],
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


def _parse(text: str, step: int) -> tuple[str, dict[int, str], dict[int, str]]:
    parser = PARSERS["hermes"]()
    deltas = []
    for i in range(0, len(text), step):
        deltas += parser.feed(text[i : i + step])
    deltas += parser.finish()
    names = {d.index: d.name for d in deltas if isinstance(d, ToolStart)}
    # A ToolEnd without a start is the markup of a call the text ended in: content here.
    content = "".join(
        d.text if isinstance(d, Text) else d.markup
        for d in deltas
        if isinstance(d, Text) or (isinstance(d, ToolEnd) and d.index not in names)
    )
    args: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, ToolArguments):
            args[d.index] = args.get(d.index, "") + d.fragment
    return content, names, args


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_hermes_calls_split_anywhere(step: int) -> None:
    text = (
        'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
    )
    content, names, args = _parse(text, step)
    assert content.strip() == "Let me check."
    assert names == {0: "get_weather", 1: "get_time"}
    assert {i: json.loads(a) for i, a in args.items()} == {0: {"city": "Paris"}, 1: {"zone": "CET"}}


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_malformed_and_unfinished_calls_stay_content(step: int) -> None:
    broken = "<tool_call>not json</tool_call>"
    assert _parse(broken, step) == (broken, {}, {})
    assert _parse("a <tool_c", step)[0] == "a <tool_c"
    assert _parse('x <tool_call>{"oops', step)[0] == 'x <tool_call>{"oops'


def test_arguments_before_name_are_parsed_whole() -> None:
    content, names, args = _parse('<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', 1)
    assert (content, names, json.loads(args[0])) == ("", {0: "f"}, {"a": 1})


def _arguments_valid(call: Any, tool: dict[str, Any]) -> None:
    assert call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.slow
def test_required_tool_call(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",  # type: ignore[list-item]
        max_tokens=100,
        temperature=0,
        parallel_tool_calls=False,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    _arguments_valid(call, WEATHER if call.function.name == "get_weather" else TIME)  # type: ignore[union-attr]
    assert "<tool_call>" not in (choice.message.content or "")


@pytest.mark.slow
def test_named_tool_call_streams_as_openai_does(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=ASK,
            tools=[WEATHER, TIME],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            max_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for d in deltas for call in d.tool_calls or []]
    first, rest = calls[0], calls[1:]
    assert first.id and first.type == "function" and first.function is not None
    assert first.function.name == "get_time"
    assert rest and all(c.id is None and c.function and c.function.name is None for c in rest)
    arguments = "".join(c.function.arguments or "" for c in calls if c.function)
    jsonschema.validate(json.loads(arguments), TIME["function"]["parameters"])
    assert all("<tool_call>" not in (d.content or "") for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.slow
def test_whitespace_between_forced_calls_is_no_content(client: openai.OpenAI) -> None:
    # min_tokens bans the end until past the first call: the grammar must write a second.
    request: dict[str, Any] = {
        "model": "default",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "max_tokens": 300,
        "temperature": 0,
        "extra_body": {"min_tokens": 60},
    }
    message = client.chat.completions.create(**request).choices[0].message
    assert message.tool_calls and len(message.tool_calls) >= 2
    assert message.content is None or message.content.strip()
    chunks = list(client.chat.completions.create(stream=True, **request))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = {call.index for d in deltas for call in d.tool_calls or []}
    assert len(calls) >= 2
    assert not [d.content for d in deltas if d.content and not d.content.strip()]


@pytest.mark.slow
def test_tool_results_round_trip_through_the_template(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",  # type: ignore[list-item]
        max_tokens=60,
        temperature=0,
        parallel_tool_calls=False,
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    answer = client.chat.completions.create(
        model="default",
        messages=messages,
        tools=[WEATHER],
        max_tokens=30,
        temperature=0,  # type: ignore[arg-type, list-item]
    )
    reply = answer.choices[0].message
    assert reply.content or reply.tool_calls  # which of the two depends on the CPU's kernels
    assert answer.usage is not None and first.usage is not None
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.slow
def test_tool_choice_none_and_auto(client: openai.OpenAI) -> None:
    def ask(**tools: Any) -> Any:
        return client.chat.completions.create(
            model="default", messages=ASK, max_tokens=60, temperature=0, **tools
        )

    plain = ask()
    none = ask(tools=[WEATHER], tool_choice="none")
    auto = ask(tools=[WEATHER], tool_choice="auto")
    # "none" shows the model no tools and returns no calls; "auto" shows them.
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens
    # Whether the model calls the tool is its own choice; either way no markup leaks.
    message = auto.choices[0].message
    for call in message.tool_calls or []:
        _arguments_valid(call, WEATHER)
    if auto.choices[0].finish_reason != "length":
        assert "<tool_call>" not in (message.content or "")


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


# Bounds and lengths a GBNF conversion drops: the forced call must still keep them.
BOOKING = _tool(
    "book",
    {
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "guests": {"type": "integer", "exclusiveMinimum": 0, "maximum": 4},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
        "note": {"type": "string", "minLength": 3, "maxLength": 8},
    },
    ["nights", "guests", "code", "note"],
)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_forced_call_arguments_keep_bounds(client: openai.OpenAI, seed: int) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Book me a room."}],
        tools=[BOOKING],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=1.5,
        seed=seed,
    )
    calls = response.choices[0].message.tool_calls or []
    assert len(calls) >= 1 and response.choices[0].finish_reason == "tool_calls"
    for call in calls:
        arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
        jsonschema.validate(arguments, BOOKING["function"]["parameters"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "json_schema": {"type": "object"}},
            "tool_choice",
        ),
        (
            {
                "tools": [_tool("odd", {"n": {"type": "integer", "minimum": "one"}}, ["n"])],
                "tool_choice": "required",
            },
            # Checked as a JSON Schema before any grammar is built from it.
            "tools.0.function.parameters",
        ),
    ],
)
def test_bad_tool_requests_are_400(server: ServerProcess, body: dict[str, Any], param: str) -> None:
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={"messages": ASK, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start(tmp_path_factory.mktemp("think"), "--reasoning-parser", "qwen3")
    yield proc
    proc.stop_soon()


# Forces the default model (which never thinks) to write qwen3-style thinking, tags included.
THINKING = (
    'root ::= "<think>" [a-z]{2,8} (" " [a-z]{2,8}){0,3} "</think>" '
    '[A-Za-z]{2,8} (" " [A-Za-z]{2,8}){0,3}'
)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_split_from_the_answer(thinking: ServerProcess, stream: bool) -> None:
    client = thinking.openai()
    body = {"model": "default", "messages": ASK, "max_tokens": 160, "temperature": 0}
    extra = {"grammar": THINKING}
    if not stream:
        message = client.chat.completions.create(**body, extra_body=extra).choices[0].message  # type: ignore[call-overload]
        reasoning, content = message.reasoning_content, message.content  # type: ignore[attr-defined]
        assert message.reasoning == reasoning  # type: ignore[attr-defined]
    else:
        chunks = list(client.chat.completions.create(**body, extra_body=extra, stream=True))  # type: ignore[call-overload]
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        content = "".join(d.content or "" for d in deltas)
    assert reasoning and content
    assert "<think>" not in reasoning + content and "</think>" not in reasoning + content
    assert reasoning.replace(" ", "").isalpha() and content.replace(" ", "").isalpha()


JSON_FORMATS = {
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_time", "arguments": {"zone": "CET"}}]',
    "json": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
}


@pytest.mark.parametrize("name", sorted(JSON_FORMATS))
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_json_call_formats(name: str, step: int) -> None:
    parser = PARSERS[name]()
    text = "Checking. " + JSON_FORMATS[name] if name != "json" else JSON_FORMATS[name]
    deltas = []
    for i in range(0, len(text), step):
        deltas += parser.feed(text[i : i + step])
    deltas += parser.finish()
    names = [d.name for d in deltas if isinstance(d, ToolStart)]
    args = [json.loads(d.fragment) for d in deltas if isinstance(d, ToolArguments)]
    assert names[0] == "get_weather" and args[0] == {"city": "Paris"}
    assert len(names) == (2 if name == "mistral" else 1)
    content = "".join(d.text for d in deltas if isinstance(d, Text))
    assert content == ("" if name == "json" else "Checking. ")


@pytest.mark.parametrize("name", sorted(JSON_FORMATS))
def test_json_formats_keep_plain_and_broken_answers_as_content(name: str) -> None:
    for text in ("Just an answer.", "{not json at all"):
        parser = PARSERS[name]()
        deltas = parser.feed(text) + parser.finish()
        assert all(isinstance(d, Text) for d in deltas)
        assert "".join(d.text for d in deltas if isinstance(d, Text)).endswith(text)


@pytest.fixture(
    scope="module",
    params=[
        "mistral",
        "llama3_json",
        "kimi_k2",
        "glm",
        "functionary_v3_2",
        "minimax_m2",
        "deepseek_v32",
        "granite",
        "firefunction",
    ],
)
def parser_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    proc = start(tmp_path_factory.mktemp(request.param), "--tool-call-parser", request.param)
    yield proc
    proc.stop_soon()


@pytest.mark.slow
def test_forced_calls_in_each_format(parser_server: ServerProcess) -> None:
    client = parser_server.openai()
    response = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",  # type: ignore[list-item]
        # One call: with more allowed, whether this small model closes its calls or repeats
        # the same one up to max_tokens is its greedy choice (DSML's and MiniMax's it repeats).
        parallel_tool_calls=False,
        max_tokens=300,  # DSML's fullwidth markup is many tokens to a small vocabulary
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        _arguments_valid(call, WEATHER)


def test_auto_detects_the_parser_from_the_template() -> None:
    from mlxcel.parsers.tools import detect_parser

    assert detect_parser("{{ '<tool_call>' }}{{ tool_call | tojson }}") == "hermes"
    assert detect_parser("{{ '[TOOL_CALLS]' + tool_calls | tojson }}") == "mistral"
    assert detect_parser("{{ '<|python_tag|>' + tool_call.arguments }}") == "llama3_json"
    assert detect_parser("{{ message.content }}") == "hermes"
    assert detect_parser(None) == "hermes"
