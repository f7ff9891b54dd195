"""Chat completions over HTTP with the official OpenAI client."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]


def test_chat_answers_with_text_and_usage(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default", messages=HELLO, max_tokens=24, temperature=0
    )
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage is not None
    assert usage.prompt_tokens > 5
    assert 0 < usage.completion_tokens <= 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_capital_of_france(client: openai.OpenAI) -> None:
    """The template, BOS and tokenizer are wired up: the model's top next token is the one a
    working model gives, by a margin no CPU's rounding closes (6.4 nats measured on AVX-512)."""
    response = client.chat.completions.create(
        model="default",
        messages=[
            {"role": "user", "content": "Which city is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is"},
        ],
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"add_generation_prompt": False, "continue_final_message": True},
    )
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    first, second = logprobs.content[0].top_logprobs
    assert first.token == " Paris"
    assert first.logprob - second.logprob >= 2


def test_system_developer_and_text_parts(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": [{"type": "text", "text": "Name a color."}]},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one."},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert response.choices[0].message.content


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=5,
        temperature=0,
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 5


def test_max_completion_tokens_is_honoured(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_completion_tokens=3,
        temperature=0,
    )
    assert response.usage is not None and response.usage.completion_tokens == 3


def test_streaming_role_first_finish_last(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="default", messages=HELLO, max_tokens=16, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    whole = client.chat.completions.create(
        model="default", messages=HELLO, max_tokens=16, temperature=0
    )
    assert text == whole.choices[0].message.content
    assert all(c.usage is None for c in chunks)


def test_streaming_include_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=HELLO,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens <= 6
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens


def test_seed_reproduces_sampled_output(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        response = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Tell me a short story."}],
            max_tokens=40,
            temperature=1.0,
            seed=seed,
        )
        return response.choices[0].message.content or ""

    first = sample(1234)
    assert sample(1234) == first
    others = {sample(seed) for seed in (1, 2, 3)}
    assert others != {first}


def test_penalties_change_repetitive_output(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Repeat the word 'apple' fifty times."}]
    plain = client.chat.completions.create(
        model="default", messages=messages, max_tokens=40, temperature=0
    )
    penalised = client.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=40,
        temperature=0,
        frequency_penalty=2.0,
        presence_penalty=2.0,
    )
    assert plain.choices[0].message.content != penalised.choices[0].message.content


def test_top_p_is_accepted_and_deterministic_with_seed(client: openai.OpenAI) -> None:
    def sample() -> str:
        response = client.chat.completions.create(
            model="default", messages=HELLO, max_tokens=12, top_p=0.5, seed=7
        )
        return response.choices[0].message.content or ""

    assert sample() == sample()


def test_server_knobs_in_extra_body(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me a story."}]
    greedy = client.chat.completions.create(
        model="default", messages=messages, max_tokens=20, temperature=0
    )
    for knob in ({"top_k": 1}, {"min_p": 1.0}):
        hot = client.chat.completions.create(
            model="default", messages=messages, max_tokens=20, temperature=1.5, extra_body=knob
        )
        assert hot.choices[0].message.content == greedy.choices[0].message.content, knob


def test_repeat_penalty_breaks_repetition(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Repeat the word 'apple' fifty times."}]
    plain = client.chat.completions.create(
        model="default", messages=messages, max_tokens=40, temperature=0
    )
    for name in ("repeat_penalty", "repetition_penalty"):
        penalised = client.chat.completions.create(
            model="default",
            messages=messages,
            max_tokens=40,
            temperature=0,
            extra_body={name: 1.8, "repeat_last_n": -1},
        )
        assert penalised.choices[0].message.content != plain.choices[0].message.content
