"""Stop strings end generation as strings, across token boundaries, streamed or not."""

from __future__ import annotations

import openai
import pytest

from mlxcel.engine.text import StopMatcher
from tests.portable import stop_inside

COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]


@pytest.mark.slow
def test_stop_string_cuts_the_answer(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model="default", messages=COUNT, max_tokens=60, temperature=0
    )
    text = full.choices[0].message.content or ""
    stop = stop_inside(text)
    cut = client.chat.completions.create(
        model="default", messages=COUNT, max_tokens=60, temperature=0, stop=[stop, "zzz"]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


@pytest.mark.slow
def test_stop_string_streamed(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model="default", messages=COUNT, max_tokens=60, temperature=0
    )
    text = full.choices[0].message.content or ""
    stop = stop_inside(text, 3)
    chunks = list(
        client.chat.completions.create(
            model="default", messages=COUNT, max_tokens=60, temperature=0, stop=stop, stream=True
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_matcher_holds_back_a_split_stop_string() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.push("abc E") == ("abc ", False)
    assert matcher.push("N") == ("", False)
    assert matcher.push("D more") == ("", True)


def test_matcher_releases_a_false_start() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.push("xEN") == ("x", False)
    assert matcher.push("Z") == ("ENZ", False)
    assert matcher.flush() == ""


def test_matcher_earliest_of_several_stops() -> None:
    matcher = StopMatcher(("world", "lo w"))
    assert matcher.push("hello world") == ("hel", True)
