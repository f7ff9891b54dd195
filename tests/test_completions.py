"""Text completions over HTTP with the official OpenAI client."""

from __future__ import annotations

import openai
import pytest

from tests.portable import stop_inside

pytestmark = pytest.mark.slow


def test_completion_continues_the_prompt(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model="default", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    choice = response.choices[0]
    assert response.object == "text_completion"
    assert choice.text
    assert choice.finish_reason in ("stop", "length")
    assert response.usage is not None and response.usage.prompt_tokens >= 5


def test_completion_length_and_stop(client: openai.OpenAI) -> None:
    prompt = "1, 2, 3, 4,"
    fixed = {"max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(model="default", prompt=prompt, **fixed)  # type: ignore[call-overload]
    assert full.choices[0].finish_reason == "length"
    text = full.choices[0].text
    stop = stop_inside(text)
    cut = client.completions.create(model="default", prompt=prompt, stop=stop, **fixed)  # type: ignore[call-overload]
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completion_streaming_matches_whole(client: openai.OpenAI) -> None:
    prompt = "Once upon a time"
    whole = client.completions.create(model="default", prompt=prompt, max_tokens=16, temperature=0)
    chunks = list(
        client.completions.create(
            model="default",
            prompt=prompt,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")


def test_completion_seed(client: openai.OpenAI) -> None:
    def sample() -> str:
        return (
            client.completions.create(
                model="default",
                prompt="My favourite animal is",
                max_tokens=20,
                seed=99,
                temperature=1.2,
            )
            .choices[0]
            .text
        )

    assert sample() == sample()
