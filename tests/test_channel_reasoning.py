"""Gemma 4's `<|channel>thought ... <channel|>` thinking, split from the answer as it streams."""

from __future__ import annotations

import pytest

from mlxcel.parsers.reasoning import PARSERS, GemmaParser
from mlxcel.serving.answer import Answer, parse_answer

# As Google's Gemma 4 prompt-formatting guide shows a thinking answer (after `<|turn>model\n`).
THOUGHT_ANSWER = (
    "<|channel>thought\nThe user asks about the water formula. H2O is the usual meaning.\n"
    '<channel|>The most common interpretation of "the water formula" refers to H2O.'
)
EXPECTED = {
    THOUGHT_ANSWER: (
        "The user asks about the water formula. H2O is the usual meaning.\n",
        'The most common interpretation of "the water formula" refers to H2O.',
    ),
    # Thinking off: the larger models' prompt ends with an empty block, the output is answer.
    "Water is H2O.": ("", "Water is H2O."),
    # The model may still close an empty block itself.
    "<|channel>thought\n<channel|>Water is H2O.": ("", "Water is H2O."),
    # Blocks between parts of an answer (the template strips every one from history).
    "Let me check.<|channel>thought\nIs 7 prime? Yes.<channel|>7 is prime.": (
        "Is 7 prime? Yes.",
        "Let me check.7 is prime.",
    ),
    "<|channel>thought\nA<channel|>x<|channel>thought\nB<channel|>y": ("AB", "xy"),
}
CHUNKS = [1, 2, 3, 7, 10_000]


def run(output: str, size: int) -> tuple[str, str]:
    """Feed `output` `size` characters at a time: the joined (reasoning, content)."""
    parser = GemmaParser()
    reasoning, content = "", ""
    for at in range(0, len(output), size):
        more_reasoning, more_content = parser.feed(output[at : at + size])
        reasoning, content = reasoning + more_reasoning, content + more_content
    rest_reasoning, rest_content = parser.finish()
    return reasoning + rest_reasoning, content + rest_content


@pytest.mark.parametrize("size", CHUNKS)
@pytest.mark.parametrize("output", list(EXPECTED))
def test_outputs_in_chunks(output: str, size: int) -> None:
    assert run(output, size) == EXPECTED[output]


@pytest.mark.parametrize("output", list(EXPECTED))
def test_markers_split_anywhere(output: str) -> None:
    for at in range(1, len(output)):
        parser = GemmaParser()
        first, second, rest = parser.feed(output[:at]), parser.feed(output[at:]), parser.finish()
        joined = tuple("".join(part) for part in zip(first, second, rest, strict=True))
        assert joined == EXPECTED[output], at


def test_streams_without_holding_more_than_a_marker() -> None:
    parser = GemmaParser()
    assert parser.feed("<|chan") == ("", "")
    assert parser.feed("nel>thou") == ("", "")
    assert parser.feed("ght\nStep one") == ("Step one", "")
    assert parser.feed(". <chan") == (". ", "")
    assert parser.feed("nel|>Done") == ("", "Done")
    assert parser.feed(" now <") == ("", " now ")
    assert parser.finish() == ("", "<")


def test_unfinished_thought_at_finish_is_reasoning() -> None:
    assert run("<|channel>thought\nStill going <chann", 3) == ("Still going <chann", "")
    assert run("<|channel>thou", 1) == ("thou", "")
    assert run("Answer <|chan", 1) == ("", "Answer <|chan")


def test_malformed_markup_is_content() -> None:
    # A close with no open is answer text, kept as written.
    assert run("a<channel|>b", 1) == ("", "a<channel|>b")
    # A channel without the thought label keeps its text.
    assert run("<|channel>plan: x<channel|>y", 2) == ("plan: x", "y")
    # An open inside a thought is part of the thought.
    assert run("<|channel>thought\na<|channel>b<channel|>c", 1) == ("a<|channel>b", "c")


def test_registered_as_gemma() -> None:
    assert isinstance(PARSERS["gemma"](), GemmaParser)
    reasoning, content = EXPECTED[THOUGHT_ANSWER]
    assert parse_answer(THOUGHT_ANSWER, "gemma", None) == Answer(content, reasoning, [])
    assert parse_answer("Plain.", "gemma", None) == Answer("Plain.", None, [])
