"""The harmony (gpt-oss) parser on outputs from openai/harmony's format guide, chunked every way."""

from __future__ import annotations

import re

import pytest

from mlxcel.parsers.tools.base import Delta, Reasoning, Text, ToolArguments, ToolEnd, ToolStart
from mlxcel.parsers.tools.harmony import HarmonyParser

# Outputs as the format guide (openai/harmony docs/format.md) shows them after `<|start|>assistant`.
ANALYSIS_FINAL = (
    '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide '
    "answer.<|end|>\n<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
)
ANALYSIS_CALL = (
    "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant"
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"location":"San Francisco"}<|call|>'
)
PREAMBLE_CALL = (
    "<|channel|>analysis<|message|>{long chain of thought}<|end|><|start|>assistant<|channel|>"
    "commentary<|message|>**Action plan**:\n1. Generate an HTML file\n---\nWill start executing"
    "<|end|><|start|>assistant<|channel|>commentary to=functions.generate_file<|constrain|>json"
    '<|message|>{"template": "basic_html", "path": "index.html"}<|call|>'
)
TWO_CALLS = (
    "<|channel|>analysis<|message|>Two cities.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
    "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
    '<|message|>{"city":"Tokyo"}<|call|>'
)
RECIPIENT_FIRST = (
    "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions.lookup"
    '<|channel|>commentary json<|message|>{"q": "harmony"}<|call|>'
)

CHUNKS = [1, 2, 3, 7, 10_000]


def run(output: str, size: int) -> list[Delta]:
    """Feed `output` `size` characters at a time; merge what streamed so chunkings compare."""
    parser = HarmonyParser()
    deltas: list[Delta] = []
    for at in range(0, len(output), size):
        deltas += parser.feed(output[at : at + size])
    return merged(deltas + parser.finish())


def run_split(output: str, at: int) -> list[Delta]:
    parser = HarmonyParser()
    return merged(parser.feed(output[:at]) + parser.feed(output[at:]) + parser.finish())


def merged(deltas: list[Delta]) -> list[Delta]:
    """Adjacent text of one kind joined; call ids replaced by their index, checked first; each
    call's end checked to follow its arguments, then left out."""
    out: list[Delta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if isinstance(delta, ToolEnd):
            assert isinstance(last, ToolArguments) and last.index == delta.index
            assert delta.markup.startswith("<|channel|>") or " to=" in delta.markup
            assert last.fragment in delta.markup
        elif isinstance(delta, ToolStart):
            assert re.fullmatch(r"call_[0-9a-f]{24}", delta.id)
            out.append(ToolStart(delta.index, f"id{delta.index}", delta.name))
        elif isinstance(delta, ToolArguments) and isinstance(last, ToolArguments):
            assert delta.index == last.index
            out[-1] = ToolArguments(delta.index, last.fragment + delta.fragment)
        elif isinstance(delta, Text) and isinstance(last, Text):
            out[-1] = Text(last.text + delta.text)
        elif isinstance(delta, Reasoning) and isinstance(last, Reasoning):
            out[-1] = Reasoning(last.text + delta.text)
        else:
            out.append(delta)
    return out


def whole(output: str) -> list[Delta]:
    return run(output, len(output))


EXPECTED = {
    ANALYSIS_FINAL: [
        Reasoning('User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.'),
        Text("2 + 2 = 4."),
    ],
    ANALYSIS_CALL: [
        Reasoning("Need to use function get_weather."),
        ToolStart(0, "id0", "get_weather"),
        ToolArguments(0, '{"location":"San Francisco"}'),
    ],
    PREAMBLE_CALL: [
        Reasoning("{long chain of thought}"),
        Text("**Action plan**:\n1. Generate an HTML file\n---\nWill start executing"),
        ToolStart(0, "id0", "generate_file"),
        ToolArguments(0, '{"template": "basic_html", "path": "index.html"}'),
    ],
    TWO_CALLS: [
        Reasoning("Two cities."),
        ToolStart(0, "id0", "get_weather"),
        ToolArguments(0, '{"city":"Paris"}'),
        ToolStart(1, "id1", "get_time"),
        ToolArguments(1, '{"city":"Tokyo"}'),
    ],
    RECIPIENT_FIRST: [
        Reasoning("Look it up."),
        ToolStart(0, "id0", "lookup"),
        ToolArguments(0, '{"q": "harmony"}'),
    ],
}


@pytest.mark.parametrize("size", CHUNKS)
@pytest.mark.parametrize("output", list(EXPECTED))
def test_recorded_outputs_in_chunks(output: str, size: int) -> None:
    assert run(output, size) == EXPECTED[output]


@pytest.mark.parametrize("output", list(EXPECTED))
def test_markers_split_anywhere(output: str) -> None:
    for at in range(1, len(output)):
        assert run_split(output, at) == EXPECTED[output], at


def test_nothing_is_held_past_what_may_be_a_marker() -> None:
    parser = HarmonyParser()
    assert parser.feed("<|channel|>final<|message|>Hello wor") == [Text("Hello wor")]
    assert parser.feed("ld<|re") == [Text("ld")]
    assert parser.feed("turn|>") == []
    assert parser.finish() == []


def test_arguments_stream_before_the_call_ends() -> None:
    parser = HarmonyParser()
    header = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
    head = parser.feed(header)
    assert [type(d) for d in head] == [ToolStart]
    assert parser.feed('{"a": ') == [ToolArguments(0, '{"a": ')]
    assert parser.feed("1}<|ca") == [ToolArguments(0, "1}")]
    assert parser.feed("ll|>") == [ToolEnd(0, header + '{"a": 1}<|call|>')]


def test_a_call_the_text_ends_inside_is_not_closed() -> None:
    parser = HarmonyParser()
    header = "<|channel|>commentary to=functions.f json<|message|>"
    parser.feed(header + '{"a": 1')
    assert parser.finish() == [ToolEnd(0, header + '{"a": 1', closed=False)]


def test_call_ids_are_distinct() -> None:
    parser = HarmonyParser()
    starts = [d for d in parser.feed(TWO_CALLS) if isinstance(d, ToolStart)]
    assert len({start.id for start in starts}) == 2


def test_recipient_first_right_after_the_prompt() -> None:
    output = " to=functions.get_location<|channel|>commentary json<|message|>{}<|call|>"
    for size in CHUNKS:
        assert run(output, size) == [ToolStart(0, "id0", "get_location"), ToolArguments(0, "{}")]


def test_stop_token_not_in_text_finishes_the_message() -> None:
    # <|call|> and <|return|> are stop tokens: the engine may end the text without them.
    call = ANALYSIS_CALL.removesuffix("<|call|>")
    final = ANALYSIS_FINAL.removesuffix("<|return|>")
    for size in CHUNKS:
        assert run(call, size) == EXPECTED[ANALYSIS_CALL]
        assert run(final, size) == EXPECTED[ANALYSIS_FINAL]


def test_unfinished_output_at_finish() -> None:
    assert whole("<|channel|>analysis<|message|>Still thinking") == [Reasoning("Still thinking")]
    assert whole("<|channel|>final<|message|>The ans<|re") == [Text("The ans<|re")]
    cut = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>fin"
    assert whole(cut) == [Reasoning("Hm."), Text("<|start|>assistant<|channel|>fin")]
    assert whole("<|channel|>analysis<|message|>Done.<|end|>\n") == [Reasoning("Done.")]


def test_plain_text_is_content_and_streams() -> None:
    parser = HarmonyParser()
    assert parser.feed("Hello") == [Text("Hello")]
    assert parser.feed(" there") == [Text(" there")]
    assert parser.finish() == []


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        # A role other than the assistant's is not a header of ours: echoed whole.
        (
            "<|start|>user<|message|>hi<|end|>",
            [Text("<|start|>user<|message|>hi")],
        ),
        # A message end inside a header: the header text is content.
        ("<|channel|>analysis<|end|>rest", [Text("<|channel|>analysisrest")]),
        # A header that never reaches <|message|>.
        ("<|channel|>final " + "x" * 300, [Text("<|channel|>final " + "x" * 300)]),
        ("x" * 300 + "<|message|>tail", [Text("x" * 300 + "<|message|>tail")]),
        # No <|end|> before the next message: nothing is lost.
        (
            "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b",
            [Reasoning("a"), Text("b")],
        ),
        # A doubled <|start|> is echoed, the message after it still parsed.
        (
            "<|end|><|start|><|start|>assistant<|channel|>final<|message|>ok",
            [Text("<|start|>ok")],
        ),
    ],
)
def test_malformed_markup_is_content(output: str, expected: list[Delta]) -> None:
    for size in CHUNKS:
        assert run(output, size) == expected


def test_builtin_tool_calls_are_reasoning() -> None:
    output = '<|channel|>analysis to=browser.search code<|message|>{"query": "weather"}<|call|>'
    assert whole(output) == [Reasoning('{"query": "weather"}')]


def test_commentary_without_recipient_and_unknown_channel_are_content() -> None:
    assert whole("<|channel|>commentary<|message|>Working on it.<|end|>") == [
        Text("Working on it.")
    ]
    assert whole("<|channel|>other<|message|>x<|end|>") == [Text("x")]
