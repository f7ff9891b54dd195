"""The formats issue 38 added (Kimi K2, GLM 4.x, functionary v3.2, MiniMax-M2, DeepSeek-V3.2,
Granite 3.x, firefunction-v2) read from canonical output split anywhere, and the parser `auto`
picks for each template in llama.cpp's folder."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlxcel.parsers.tools import PARSERS, Text, ToolArguments, ToolEnd, ToolStart, detect_parser
from mlxcel.parsers.tools.invoke_xml import DSML
from mlxcel.parsers.tools.kimi_k2 import (
    ARGUMENTS_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
)
from mlxcel.serving.answer import parse_answer
from mlxcel.serving.tools import ToolPlan, forced_call_grammar
from tests.cached_data import llama_cpp_templates

PARIS, CET = {"city": "Paris"}, {"zone": "CET"}
TWO = [("get_weather", PARIS), ("get_time", CET)]


def _kimi(name: str, index: int, arguments: dict[str, Any]) -> str:
    return f"{CALL_BEGIN}functions.{name}:{index}{ARGUMENTS_BEGIN}{json.dumps(arguments)}{CALL_END}"


def _json_list(marker: str) -> str:
    calls = [{"name": "get_weather", "arguments": PARIS}, {"name": "get_time", "arguments": CET}]
    return f"{marker}{json.dumps(calls)}"


TWO_CALLS = {
    "kimi_k2": f"Checking.{SECTION_BEGIN}{_kimi('get_weather', 0, PARIS)}"
    f"{_kimi('get_time', 1, CET)}{SECTION_END}",
    "granite": "Checking." + _json_list("<|tool_call|>"),
    "minimax_m2": 'Checking.\n<minimax:tool_call>\n<invoke name="get_weather">'
    '<parameter name="city">Paris</parameter>\n</invoke>\n<invoke name="get_time">'
    '<parameter name="zone">CET</parameter>\n</invoke>\n</minimax:tool_call>',
    "deepseek_v32": f'Checking.\n\n<{DSML}function_calls>\n<{DSML}invoke name="get_weather">\n'
    f'<{DSML}parameter name="city" string="true">Paris</{DSML}parameter>\n</{DSML}invoke>\n'
    f'<{DSML}invoke name="get_time">\n<{DSML}parameter name="zone" string="true">CET'
    f"</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}function_calls>",
    # After the prompt's ">>>": the user's text, then each function's arguments.
    "functionary_v3_2": 'all\nChecking.>>>get_weather\n{"city": "Paris"}\n>>>get_time\n'
    '{"zone": "CET"}',
    # GLM 4.6 with newlines, 4.7 without.
    "glm": "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
    "</arg_value>\n</tool_call><tool_call>get_time<arg_key>zone</arg_key><arg_value>CET"
    "</arg_value></tool_call>",
    "firefunction": "Checking. " + _json_list("functools"),
}


def _parse(name: str, text: str, step: int) -> tuple[str, list[tuple[str, Any]]]:
    parser = PARSERS[name]()
    deltas = []
    for at in range(0, len(text), step):
        deltas += parser.feed(text[at : at + step])
    deltas += parser.finish()
    content = "".join(d.text for d in deltas if isinstance(d, Text))
    names = {d.index: d.name for d in deltas if isinstance(d, ToolStart)}
    arguments: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, ToolArguments):
            arguments[d.index] = arguments.get(d.index, "") + d.fragment
    assert {d.index for d in deltas if isinstance(d, ToolEnd)} == set(names)
    return content.strip(), [(names[i], json.loads(arguments[i])) for i in sorted(names)]


@pytest.mark.parametrize("name", sorted(TWO_CALLS))
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_two_calls_split_anywhere(name: str, step: int) -> None:
    assert _parse(name, TWO_CALLS[name], step) == ("Checking.", TWO)


@pytest.mark.parametrize("name", sorted(TWO_CALLS))
def test_a_cut_second_call_is_dropped(name: str) -> None:
    text = TWO_CALLS[name]
    cut = text[: text.index("get_time") + 12]
    answer = parse_answer(cut, None, ToolPlan([], name, None), truncated=True)
    called = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer.tool_calls
    ]
    assert called == TWO[:1] and answer.content == "Checking."


@pytest.mark.parametrize("text", ["Just words.", f"{SECTION_BEGIN}not a call", f"{CALL_BEGIN}x y"])
def test_kimi_k2_markup_that_is_no_call_is_content(text: str) -> None:
    answer = parse_answer(text, None, ToolPlan([], "kimi_k2", None))
    assert (answer.content, answer.tool_calls) == (text, [])


def test_kimi_k2_grammar_names_its_markers() -> None:
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    grammar = forced_call_grammar([tool], True, "kimi_k2")
    assert grammar.syntax == "lark" and SECTION_BEGIN in grammar.markers
    assert "marker_0" in grammar.text and SECTION_BEGIN not in grammar.text


# The parser `auto` picks from each template's call markup. Templates whose format has no parser
# of ours get hermes (which also reads untagged JSON calls); they are listed so a new parser
# shows up here.
EXPECTED = {
    "GLM-4.6": "glm",
    "MiniMax-M2": "minimax_m2",
    "deepseek-ai-DeepSeek-V3.2": "deepseek_v32",
    "deepseek-ai-DeepSeek-V4": "deepseek_v4",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek_v4",
    "meetkai-functionary-medium-v3.2": "functionary_v3_2",
    "GLM-4.7-Flash": "glm",
    "Spark2.5": "glm",
    "inclusionai-ling-3.0-flash": "glm",
    "poolside-Laguna-S-2.1": "glm",
    "poolside-Laguna-XS-2.1": "glm",
    "poolside-Laguna-XS.2": "glm",
    "ByteDance-Seed-OSS": "qwen3_coder",
    "Kimi-K2-Instruct": "kimi_k2",
    "Kimi-K2-Thinking": "kimi_k2",
    "moonshotai-Kimi-K2": "kimi_k2",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen3_coder",
    "Qwen3-Coder": "qwen3_coder",
    "Qwen3.5-4B": "qwen3_coder",
    "StepFun3.5-Flash": "qwen3_coder",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "deepseek_v3",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek_v3",
    "deepseek-ai-DeepSeek-V3.1": "deepseek_v3",
    "llama-cpp-deepseek-r1": "deepseek_v3",
    "fireworks-ai-llama-3-firefunction-v2": "firefunction",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "meetkai-functionary-medium-v3.1": "qwen3_coder",  # which reads <function=NAME>{json} too
    "meta-llama-Llama-3.1-8B-Instruct": "llama3_json",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3_json",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3_json",
    "MiniMax-M1": "llama3_json",  # names the ipython role
    "openai-gpt-oss-120b": "harmony",
}
TEMPLATES = llama_cpp_templates()


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_auto_picks_the_parser_from_the_template(path: Any) -> None:
    assert detect_parser(path.read_text()) == EXPECTED.get(path.stem, "hermes")


def test_glm_values_take_their_schema_type() -> None:
    properties = {"days": {"type": "integer"}, "code": {"type": "string"}, "tags": {}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"properties": properties}}}
    parser = PARSERS["glm"]([tool])
    pairs = {"days": "3", "code": "007", "tags": '["a", 1]'}
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs.items())
    deltas = parser.feed(f"<tool_call>f{body}</tool_call>") + parser.finish()
    arguments = "".join(d.fragment for d in deltas if isinstance(d, ToolArguments))
    assert json.loads(arguments) == {"days": 3, "code": "007", "tags": ["a", 1]}


def test_glm_reads_no_hermes_json_as_a_call() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    answer = parse_answer(text, None, ToolPlan([], "glm", None))
    assert (answer.content, answer.tool_calls) == (text, [])


@pytest.mark.parametrize(
    "text", ["Just an answer with no recipient line.", "all\nAn answer to the user.", ""]
)
def test_functionary_text_is_content(text: str) -> None:
    answer = parse_answer(text, None, ToolPlan([], "functionary_v3_2", None))
    assert (answer.content, answer.tool_calls) == (text.removeprefix("all\n"), [])


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_functionary_v3_1_json_bodies(step: int) -> None:
    text = (
        'Checking.<function=get_weather>{"city": "Paris"}</function>'
        '<function=get_time>{"zone": "CET"}</function>'
    )
    parser = PARSERS["qwen3_coder"]()
    deltas = []
    for at in range(0, len(text), step):
        deltas += parser.feed(text[at : at + step])
    deltas += parser.finish()
    content = "".join(d.text for d in deltas if isinstance(d, Text))
    names = [d.name for d in deltas if isinstance(d, ToolStart)]
    arguments = [json.loads(d.fragment) for d in deltas if isinstance(d, ToolArguments)]
    assert (content, list(zip(names, arguments, strict=True))) == ("Checking.", TWO)


def test_dsml_values_say_their_type() -> None:
    body = (
        f'<{DSML}parameter name="days" string="false">3</{DSML}parameter>'
        f'<{DSML}parameter name="code" string="true">007</{DSML}parameter>'
    )
    call = f'<{DSML}invoke name="f">{body}</{DSML}invoke>'
    text = f"<{DSML}function_calls>{call}</{DSML}function_calls>"
    answer = parse_answer(text, None, ToolPlan([], "deepseek_v32", None))
    assert [json.loads(c["function"]["arguments"]) for c in answer.tool_calls] == [
        {"days": 3, "code": "007"}
    ]
