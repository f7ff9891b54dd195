"""The qwen3_coder and deepseek_v3 tool-call formats: parsers fed recorded model output in
pieces, template detection, and calls forced over HTTP in each format's own markup."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from mlxcel.parsers.tools import (
    CALL_EXAMPLES,
    PARSERS,
    Delta,
    Text,
    ToolArguments,
    ToolEnd,
    ToolStart,
    detect_parser,
)
from mlxcel.parsers.tools.deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from mlxcel.serving.answer import Answer, parse_answer
from mlxcel.serving.tools import ToolPlan, ToolStream, template_messages
from tests.conftest import start
from tests.server_process import ServerProcess


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


WEATHER = _tool(
    "get_weather",
    {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer"},
        # A string that reads as a number: only the schema keeps it a string.
        "postcode": {"enum": ["75001", "75002"]},
        "unit": {"enum": ["c", "f"]},
    },
    ["city", "days", "postcode"],
)
TIME = _tool("get_time", {"zone": {"type": "string", "maxLength": 10}}, ["zone"])
TYPED = _tool(
    "typed",
    {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "o": {"type": "object"},
        "a": {"type": "array"},
        "maybe": {"type": ["integer", "null"]},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    },
    [],
)
STEPS = [1, 2, 5, 1000]


def _deltas(name: str, text: str, step: int, tools: list[dict[str, Any]] | None) -> list[Delta]:
    parser = PARSERS[name](tools)
    deltas = []
    for i in range(0, len(text), step):
        deltas += parser.feed(text[i : i + step])
    return deltas + parser.finish()


def _parse(
    name: str, text: str, step: int, tools: list[dict[str, Any]] | None = None
) -> tuple[str, dict[int, str], dict[int, Any]]:
    """Content, call names and parsed arguments by call index."""
    deltas = _deltas(name, text, step, tools)
    names = {d.index: d.name for d in deltas if isinstance(d, ToolStart)}
    # A ToolEnd without a start is the markup of a call the text ended in: content here.
    content = "".join(
        d.text if isinstance(d, Text) else d.markup
        for d in deltas
        if isinstance(d, Text) or (isinstance(d, ToolEnd) and d.index not in names)
    )
    arguments: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, ToolArguments):
            arguments[d.index] = arguments.get(d.index, "") + d.fragment
    return content, names, {i: json.loads(a) for i, a in arguments.items()}


QWEN_TWO_CALLS = (
    "I'll check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=postcode>\n75001\n"
    "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
    "<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>"
)


@pytest.mark.parametrize("step", STEPS)
def test_qwen3_coder_calls_split_anywhere(step: int) -> None:
    content, names, arguments = _parse("qwen3_coder", QWEN_TWO_CALLS, step, [WEATHER, TIME])
    assert content.strip() == "I'll check both."
    assert names == {0: "get_weather", 1: "get_time"}
    assert arguments == {0: {"city": "Paris", "days": 3, "postcode": "75001"}, 1: {"zone": "CET"}}


def test_qwen3_coder_streams_a_call_as_its_parts_complete() -> None:
    parser = PARSERS["qwen3_coder"]([WEATHER])
    assert parser.feed("<tool_call>\n<function=get_weather") == []
    [start] = parser.feed(">\n<parameter=city>\nPar")
    assert isinstance(start, ToolStart) and start.name == "get_weather"
    assert parser.feed("is\n</parameter>\n") == [ToolArguments(0, '{"city": "Paris"')]
    assert parser.feed("<parameter=days>\n3\n</parameter>\n</func") == [
        ToolArguments(0, ', "days": 3')
    ]
    markup = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>"
    )
    assert parser.feed("tion>\n</tool_call>") == [ToolArguments(0, "}"), ToolEnd(0, markup)]
    assert parser.finish() == []


@pytest.mark.parametrize("step", STEPS)
def test_qwen3_coder_values_take_their_schema_type(step: int) -> None:
    values = {
        "s": "007\n  <b>not a tag</b>",
        "i": "42",
        "n": "2.5",
        "b": "true",
        "o": '{"k": [1, 2]}',
        "a": '["x", 1]',
        "maybe": "null",
        "either": "x7",
        "unknown": "[1]",
    }
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    text = f"<tool_call>\n<function=typed>\n{body}</function>\n</tool_call>"
    _, _, arguments = _parse("qwen3_coder", text, step, [TYPED])
    assert arguments[0] == {
        "s": "007\n  <b>not a tag</b>",
        "i": 42,
        "n": 2.5,
        "b": True,
        "o": {"k": [1, 2]},
        "a": ["x", 1],
        "maybe": None,
        "either": "x7",
        "unknown": [1],  # a parameter the schema does not name: JSON when it parses as JSON
    }


def test_qwen3_coder_values_that_are_not_their_type_stay_strings() -> None:
    text = (
        "<function=typed>\n<parameter=i>\nlots\n</parameter>\n<parameter=o>\n{broken\n"
        "</parameter>\n<parameter=n>\nNaN\n</parameter>\n</function>"
    )
    assert _parse("qwen3_coder", text, 3, [TYPED])[2][0] == {
        "i": "lots",
        "o": "{broken",
        "n": "NaN",
    }


@pytest.mark.parametrize("step", STEPS)
def test_qwen3_coder_lenient_shapes(step: int) -> None:
    # No <tool_call> around the function, a missing </parameter>, two functions in one block,
    # and no tools to type by: a value is JSON when it reads as JSON.
    text = (
        "Sure <function=f>\n<parameter=a>\n1\n<parameter=b>\nhi\n</parameter>\n</function> and "
        "<tool_call>\n<function=g>\n</function>\n<function=h>\n</function>\n</tool_call> done"
    )
    content, names, arguments = _parse("qwen3_coder", text, step)
    assert content == "Sure  and  done"
    assert names == {0: "f", 1: "g", 2: "h"}
    assert arguments == {0: {"a": 1, "b": "hi"}, 1: {}, 2: {}}


QWEN_NOT_CALLS = [
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    "a <tool_call>\n<function=two words\n>\n</function>",
    "text <tool_call>\n<functio",
    "<function=",
    "x <tool_call>",
]


@pytest.mark.parametrize("text", QWEN_NOT_CALLS)
@pytest.mark.parametrize("step", STEPS)
def test_qwen3_coder_malformed_and_unfinished_markup_is_content(text: str, step: int) -> None:
    assert _parse("qwen3_coder", text, step) == (text, {}, {})


@pytest.mark.parametrize(
    "text",
    [
        "ok <tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\nchat",
        "<tool_call>\n<function=get_weather>\n",
    ],
)
def test_qwen3_coder_unfinished_calls_leave_the_message_as_content(text: str) -> None:
    deltas = _deltas("qwen3_coder", text, 2, [WEATHER])
    assert [d.name for d in deltas if isinstance(d, ToolStart)] == ["get_weather"]
    assert parse_answer(text, None, ToolPlan([WEATHER], "qwen3_coder", None)) == Answer(
        text, None, []
    )


DS_V3 = (
    f"Let me look.{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n"
    '{"city": "Paris", "days": 3, "postcode": "75001"}\n```'
    f"{CALL_END}\n{CALL_BEGIN}function{SEP}get_time\n```json\n"
    f'{{"zone": "CET"}}\n```{CALL_END}{CALLS_END}'
)
DS_V31 = (
    f"Let me look.{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}"
    f'{{"city": "Paris", "days": 3, "postcode": "75001"}}{CALL_END}'
    f'{CALL_BEGIN}get_time{SEP}{{"zone": "CET"}}{CALL_END}{CALLS_END}'
)


@pytest.mark.parametrize("text", [DS_V3, DS_V31], ids=["v3", "v3.1"])
@pytest.mark.parametrize("step", STEPS)
def test_deepseek_v3_calls_split_anywhere(text: str, step: int) -> None:
    content, names, arguments = _parse("deepseek_v3", text, step)
    assert content == "Let me look."
    assert names == {0: "get_weather", 1: "get_time"}
    assert arguments == {0: {"city": "Paris", "days": 3, "postcode": "75001"}, 1: {"zone": "CET"}}


def test_deepseek_v3_streams_arguments_without_the_code_fence() -> None:
    parser = PARSERS["deepseek_v3"]()
    assert parser.feed(f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}run") == []
    [start] = parser.feed("\n```json\n")
    assert isinstance(start, ToolStart) and start.name == "run"
    assert parser.feed('{"code": "``') == [ToolArguments(0, '{"code": "')]
    assert parser.feed('`x`"}\n``') == [ToolArguments(0, '```x`"}')]
    markup = (
        f'{CALLS_BEGIN}{CALL_BEGIN}function{SEP}run\n```json\n{{"code": "```x`"}}\n```{CALL_END}'
    )
    assert parser.feed(f"`{CALL_END}{CALLS_END} after") == [ToolEnd(0, markup), Text(" after")]
    assert parser.finish() == []


DS_NOT_CALLS = [
    f"{CALLS_BEGIN}just text",
    f"a {CALL_BEGIN}two words{SEP}{{}}{CALL_END}",
    f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}<oops>{CALL_END}",
    f"{CALLS_BEGIN}{CALLS_END} b",
    f"text {CALLS_BEGIN}{CALL_BEGIN}functi",
    CALLS_BEGIN[:5],
]


@pytest.mark.parametrize("text", DS_NOT_CALLS)
@pytest.mark.parametrize("step", STEPS)
def test_deepseek_v3_malformed_and_unfinished_markup_is_content(text: str, step: int) -> None:
    assert _parse("deepseek_v3", text, step) == (text, {}, {})


@pytest.mark.parametrize(
    "text",
    [
        f'x {CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n```json\n{{"a": ',
        f'{CALL_BEGIN}f{SEP}{{"a": 1}}\n```',
    ],
)
def test_deepseek_v3_unfinished_calls_leave_the_message_as_content(text: str) -> None:
    deltas = _deltas("deepseek_v3", text, 1, None)
    assert [d.name for d in deltas if isinstance(d, ToolStart)] == ["f"]
    assert parse_answer(text, None, ToolPlan([], "deepseek_v3", None)) == Answer(text, None, [])


def test_tool_stream_turns_qwen3_coder_calls_into_openai_deltas() -> None:
    stream = ToolStream("qwen3_coder", [WEATHER])
    pieces = [QWEN_TWO_CALLS[i : i + 7] for i in range(0, len(QWEN_TWO_CALLS), 7)]
    deltas = [delta for piece in pieces for delta in stream.feed(piece)] + stream.finish()
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert [c["function"]["name"] for c in calls if "id" in c] == ["get_weather", "get_time"]
    first = "".join(c["function"]["arguments"] for c in calls if c["index"] == 0)
    assert json.loads(first)["postcode"] == "75001" and stream.calls == 2


def test_auto_detects_the_new_formats_from_the_template() -> None:
    qwen3_coder = (
        "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
        "{{- '<parameter=' + args_name + '>\\n' }}"
    )
    deepseek = f"{{{{'{CALLS_BEGIN}{CALL_BEGIN}' + tool['type'] + '{SEP}' + tool.name }}}}"
    assert detect_parser(qwen3_coder) == "qwen3_coder"
    assert detect_parser("{%- if tools %}<parameter=name>{% endif %}") == "qwen3_coder"
    assert detect_parser(deepseek) == "deepseek_v3"
    assert detect_parser("{{ '<tool_call>' }}{{ tool_call | tojson }}") == "hermes"


@pytest.fixture(scope="module", params=["qwen3_coder", "deepseek_v3", "qwen3_coder on mlx"])
def format_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    # On MLX the GBNF grammar runs in llguidance, its markers split out of its literals
    # (engine/markers.py), where llama.cpp's grammar sampler reads it as it is.
    parser, _, engine = request.param.partition(" on ")
    models = request.getfixturevalue("models") if engine else None
    model = ["-m", str(models / "tiny-qwen3"), "--backend", "mlx"] if models else []
    proc = start(tmp_path_factory.mktemp(parser), *model, "--tool-call-parser", parser)
    yield proc
    proc.stop()


MARKUP = ("<tool_call>", "<function=", "<parameter=", CALLS_BEGIN, CALL_BEGIN)
ASK = [{"role": "user", "content": "What's the weather in Paris for the next 3 days?"}]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("named", [False, True], ids=["required", "named"])
def test_forced_calls_written_in_the_format_markup(
    format_server: ServerProcess, named: bool, stream: bool
) -> None:
    client = format_server.openai()
    choice = {"type": "function", "function": {"name": "get_time"}} if named else "required"
    body: dict[str, Any] = {
        "model": "default",
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "max_tokens": 300,  # DeepSeek's fullwidth markup is many tokens to a small vocabulary
        "temperature": 0,
    }
    if stream:
        chunks = list(client.chat.completions.create(**body, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [call for d in deltas for call in d.tool_calls or []]
        assert calls[0].id and calls[0].function and calls[0].function.name
        assert [c.id for c in calls if c.id] == [calls[0].id]
        name = calls[0].function.name
        arguments = "".join(c.function.arguments or "" for c in calls if c.function)
        content = "".join(d.content or "" for d in deltas)
        finish = chunks[-1].choices[0].finish_reason
    else:
        response = client.chat.completions.create(**body)
        message = response.choices[0].message
        assert message.tool_calls and len(message.tool_calls) == 1
        call = message.tool_calls[0]
        name, arguments = call.function.name, call.function.arguments  # type: ignore[union-attr]
        content, finish = message.content or "", response.choices[0].finish_reason
    assert finish == "tool_calls"
    if named:
        assert name == "get_time"
    tool = {"get_weather": WEATHER, "get_time": TIME}[name]
    jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])
    assert not any(marker in content for marker in MARKUP)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_templates_without_tools_are_shown_the_parsers_call_shape(name: str) -> None:
    messages = template_messages(None, [{"role": "user", "content": "Hi"}], [WEATHER], name)
    system = messages[0]["content"]
    assert messages[0]["role"] == "system" and CALL_EXAMPLES[name] in system
    assert '"name": "get_weather"' in system
