"""Every accepted sampling field shows its effect, over HTTP with the OpenAI client."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import start
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Tell me a story about a cat."}]
APPLES = [{"role": "user", "content": "Repeat the word 'apple' fifty times."}]


def token_ids(server: ServerProcess, text: str) -> list[int]:
    with server.http() as http:
        return list(http.post("/tokenize", json={"content": text}).json()["tokens"])


def chat_text(client: openai.OpenAI, **kwargs: object) -> str:
    kwargs = {"model": "default", "messages": STORY, "max_tokens": 20, **kwargs}
    response = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    return str(response.choices[0].message.content)


def test_n_gives_indexed_choices(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default", messages=STORY, max_tokens=12, n=3, temperature=1.2, seed=11
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert len({c.message.content for c in response.choices}) > 1
    assert response.usage is not None
    assert 3 <= response.usage.completion_tokens <= 36
    single = client.chat.completions.create(
        model="default", messages=STORY, max_tokens=12, temperature=1.2, seed=11
    )
    assert single.usage is not None
    assert response.usage.prompt_tokens == single.usage.prompt_tokens
    assert response.choices[0].message.content == single.choices[0].message.content


def test_n_streams_every_choice_by_index(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=STORY,
            max_tokens=8,
            n=2,
            temperature=1.0,
            seed=5,
            stream=True,
        )
    )
    texts: dict[int, str] = {0: "", 1: ""}
    finished = set()
    for chunk in chunks:
        choice = chunk.choices[0]
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished.add(choice.index)
    assert finished == {0, 1}
    whole = client.chat.completions.create(
        model="default", messages=STORY, max_tokens=8, n=2, temperature=1.0, seed=5
    )
    assert texts == {c.index: c.message.content for c in whole.choices}


def test_chat_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=STORY,
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    choice = response.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == 10
    assert "".join(t.token for t in content) == choice.message.content
    for entry in content:
        assert entry.logprob <= 0
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert sum(math.exp(lp) for lp in tops) <= 1.0001
        # Greedy decoding picks the most likely token.
        assert entry.token == entry.top_logprobs[0].token
        assert math.isclose(entry.logprob, tops[0], abs_tol=1e-4)
        assert bytes(entry.bytes or []) == entry.token.encode()


def test_completion_logprobs_shape(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model="default",
        prompt="The cat sat on the",
        max_tokens=6,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    logprobs = response.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert logprobs.text_offset is not None
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert "".join(logprobs.tokens) == response.choices[0].text
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    assert all(len(top) == 2 for top in logprobs.top_logprobs)


def test_logit_bias_forces_and_bans(client: openai.OpenAI, server: ServerProcess) -> None:
    forced = token_ids(server, " banana")[-1]
    text = chat_text(client, max_tokens=4, temperature=0, logit_bias={str(forced): 100})
    assert text.strip().split() == ["banana"] * 4 or text == " banana" * 4
    greedy = (
        client.completions.create(
            model="default", prompt="The capital of France is", max_tokens=1, temperature=0
        )
        .choices[0]
        .text
    )
    banned = token_ids(server, greedy)[-1]
    other = (
        client.completions.create(
            model="default",
            prompt="The capital of France is",
            max_tokens=1,
            temperature=0,
            logit_bias={str(banned): -100},
        )
        .choices[0]
        .text
    )
    assert other != greedy


def test_dry_and_xtc_change_output(client: openai.OpenAI) -> None:
    plain = chat_text(client, messages=APPLES, max_tokens=40, temperature=0)
    dry = chat_text(
        client,
        messages=APPLES,
        max_tokens=40,
        temperature=0,
        extra_body={"dry_multiplier": 2.0, "dry_allowed_length": 1, "dry_penalty_last_n": -1},
    )
    assert dry != plain
    sampled = chat_text(client, temperature=1.0, seed=4, extra_body={"top_k": 0})
    xtc = chat_text(
        client,
        temperature=1.0,
        seed=4,
        extra_body={"top_k": 0, "xtc_probability": 1.0, "xtc_threshold": 0.01},
    )
    assert xtc != sampled


def test_typical_p_narrows_to_one_candidate(client: openai.OpenAI) -> None:
    outputs = {
        chat_text(client, temperature=1.0, seed=seed, extra_body={"typical_p": 0.001, "top_k": 0})
        for seed in (1, 2, 3)
    }
    assert len(outputs) == 1


def test_min_tokens_and_ignore_eos(client: openai.OpenAI) -> None:
    hi = [{"role": "user", "content": "Say hi."}]
    short = client.chat.completions.create(
        model="default", messages=hi, max_tokens=200, temperature=0
    )
    assert short.usage is not None and short.usage.completion_tokens < 60
    longer = client.chat.completions.create(
        model="default", messages=hi, max_tokens=200, temperature=0, extra_body={"min_tokens": 80}
    )
    assert longer.usage is not None and longer.usage.completion_tokens >= 80
    forced = client.chat.completions.create(
        model="default", messages=hi, max_tokens=60, temperature=0, extra_body={"ignore_eos": True}
    )
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage is not None and forced.usage.completion_tokens == 60


def test_stop_token_ids_and_include_stop_str(client: openai.OpenAI, server: ServerProcess) -> None:
    comma = token_ids(server, ",")[-1]
    prompt = "1, 2, 3, 4,"
    cut = client.completions.create(
        model="default",
        prompt=prompt,
        max_tokens=10,
        temperature=0,
        extra_body={"stop_token_ids": [comma]},
    )
    assert cut.choices[0].finish_reason == "stop"
    assert "," not in cut.choices[0].text
    kept = client.completions.create(
        model="default",
        prompt=prompt,
        max_tokens=10,
        temperature=0,
        stop=[" 6"],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text.endswith(" 6")


def test_echo_and_prompt_shapes(client: openai.OpenAI, server: ServerProcess) -> None:
    text = "The cat sat on the"
    echoed = client.completions.create(
        model="default", prompt=text, max_tokens=3, temperature=0, echo=True
    )
    plain = client.completions.create(model="default", prompt=text, max_tokens=3, temperature=0)
    assert echoed.choices[0].text == text + plain.choices[0].text
    ids = token_ids(server, text)
    by_ids = client.completions.create(model="default", prompt=ids, max_tokens=3, temperature=0)
    assert by_ids.choices[0].text == plain.choices[0].text
    many = client.completions.create(
        model="default", prompt=[text, "Once upon a time"], max_tokens=3, temperature=0, n=2
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == plain.choices[0].text
    lists = client.completions.create(
        model="default", prompt=[ids, ids], max_tokens=3, temperature=0
    )
    assert [c.text for c in lists.choices] == [plain.choices[0].text] * 2


def test_user_is_accepted(client: openai.OpenAI) -> None:
    assert chat_text(client, max_tokens=2, user="someone")


@pytest.fixture(scope="module")
def cold_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start(tmp_path_factory.mktemp("cold"), "--temp", "0", "--top-k", "1")
    yield proc
    proc.stop_soon()


def test_server_sampling_flags_are_the_defaults(cold_server: ServerProcess) -> None:
    client = cold_server.openai()
    outputs = {chat_text(client, max_tokens=16) for _ in range(3)}
    assert len(outputs) == 1
    with httpx.Client(base_url=cold_server.root) as http:
        settings = http.get("/props").json()["default_generation_settings"]["params"]
    assert settings["temperature"] == 0
    assert settings["top_k"] == 1
