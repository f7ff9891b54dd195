"""One SDK script's worth of fields, run against both engines (llama.cpp and MLX).

The llama.cpp server runs the real default model, the MLX one a tiny random-weight model, so
every check here is about structure and behaviour that holds for any model, never words.
Fields whose effect needs a real model's habits are shown per engine in test_fields.py and
test_mlx.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import on_each_engine
from tests.portable import stop_inside
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Tell me a story about a cat."}]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def engine(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    proc = on_each_engine(request, "-c", "2048")
    yield proc
    proc.stop_soon()


@pytest.fixture(scope="module")
def client(engine: ServerProcess) -> openai.OpenAI:
    return engine.openai()


def token_ids(engine: ServerProcess, text: str) -> list[int]:
    with engine.http() as http:
        return list(http.post("/tokenize", json={"content": text}).json()["tokens"])


def complete(client: openai.OpenAI, prompt: object, **kwargs: object) -> openai.types.Completion:
    kwargs = {"model": "default", "prompt": prompt, "max_tokens": 6, **GREEDY, **kwargs}
    return client.completions.create(**kwargs)  # type: ignore[call-overload, no-any-return]


def test_echo_and_every_prompt_shape(client: openai.OpenAI, engine: ServerProcess) -> None:
    text = "The cat sat on the"
    plain = complete(client, text).choices[0].text
    assert complete(client, text, echo=True).choices[0].text == text + plain
    ids = token_ids(engine, text)
    assert complete(client, ids).choices[0].text == plain
    many = complete(client, [text, "Once upon a time"], n=2)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == plain
    assert [c.text for c in complete(client, [ids, ids]).choices] == [plain, plain]


def test_stop_token_ids_and_include_stop_str(client: openai.OpenAI, engine: ServerProcess) -> None:
    forced = token_ids(engine, " cat")[-1]
    stopped = complete(
        client, "Hello", extra_body={"logit_bias": {str(forced): 100}, "stop_token_ids": [forced]}
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == ""
    text = complete(client, "Hello", max_tokens=12).choices[0].text
    stop = stop_inside(text)
    kept = (
        complete(
            client,
            "Hello",
            max_tokens=12,
            stop=[stop],
            extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
        )
        .choices[0]
        .text
    )
    cut = complete(client, "Hello", max_tokens=12, stop=[stop]).choices[0].text
    assert kept == text[: text.index(stop) + len(stop)]
    assert cut == text[: text.index(stop)]


def test_chat_template_controls(client: openai.OpenAI) -> None:
    def prompt_tokens(**extra: object) -> int:
        response = client.chat.completions.create(
            model="default",
            messages=[
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"},
            ],
            max_tokens=2,
            temperature=0,
            extra_body=extra,
        )
        assert response.usage is not None
        return response.usage.prompt_tokens

    full = prompt_tokens()
    without = prompt_tokens(add_generation_prompt=False)
    assert prompt_tokens(add_generation_prompt=False, continue_final_message=True) < without < full
    assert prompt_tokens(chat_template_kwargs={"enable_thinking": False}) == full


def test_responses_api(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="default",
        input="Tell me a story.",
        instructions="Be brief.",
        max_output_tokens=8,
        temperature=0,
    )
    assert first.status in ("completed", "incomplete") and first.usage is not None
    assert client.responses.retrieve(first.id).id == first.id
    events = list(
        client.responses.create(model="default", input="Hi", max_output_tokens=6, stream=True)
    )
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    follow = client.responses.create(
        model="default", input="And then?", previous_response_id=first.id, max_output_tokens=4
    )
    assert follow.usage is not None
    assert follow.usage.input_tokens > first.usage.input_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_native_routes(client: openai.OpenAI, engine: ServerProcess) -> None:
    with engine.http() as http:
        ids = http.post("/tokenize", json={"content": "héllo 世界"}).json()["tokens"]
        detok = http.post("/detokenize", json={"tokens": ids}).json()["content"]
        assert detok == "héllo 世界"
        native = http.post(
            "/completion", json={"prompt": "Hello", "n_predict": 5, "ignore_eos": True}
        ).json()
        assert native["stop_type"] == "limit" and native["tokens_predicted"] == 5
        prompt = http.post("/apply-template", json={"messages": STORY}).json()["prompt"]
        assert "Tell me a story about a cat." in prompt
        counted = http.post("/v1/chat/completions/input_tokens", json={"messages": STORY}).json()[
            "input_tokens"
        ]
        assert http.get("/props").json()["default_generation_settings"]["n_ctx"] == 2048
    used = client.chat.completions.create(model="default", messages=STORY, max_tokens=1)
    assert used.usage is not None and counted == used.usage.prompt_tokens


def test_errors_are_the_same_envelope(engine: ServerProcess) -> None:
    with engine.http() as http:
        responses = [
            (http.post("/v1/chat/completions", json=body), 400)
            for body in (
                {"messages": STORY, "tools": [{"type": "function"}]},
                {"messages": [{"role": "user", "content": "word " * 3000}]},
            )
        ]
        responses.append((http.get("/v1/models/nope"), 404))
        for response, status in responses:
            assert response.status_code == status
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_structured_output_on_each_engine(engine: ServerProcess) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    with engine.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"messages": STORY, "max_tokens": 40, "json_schema": schema},
        )
    assert json.loads(response.json()["choices"][0]["message"]["content"]) in (
        {"ok": True},
        {"ok": False},
    )


def _two_token_bias(http: httpx.Client, prompt: str) -> tuple[list[list[Any]], str, str]:
    """Biases that leave the prompt's two likeliest tokens 1 nat apart and the rest far behind."""
    body = {"prompt": prompt, "n_predict": 1, "n_probs": 2, "temperature": 0}
    first = http.post("/completion", json=body).json()["completion_probabilities"][0]
    a, b = first["top_logprobs"]
    bias = [[a["id"], 20 - a["logprob"]], [b["id"], 19 - b["logprob"]]]
    return bias, a["token"], b["token"]


def test_llama_server_sampler_chain_on_each_engine(engine: ServerProcess) -> None:
    with engine.http() as http:

        def texts(**body: Any) -> set[str]:
            body = {"prompt": "Hello", "max_tokens": 6, "ignore_eos": True, **body}
            answer = http.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            return {c["text"] for c in answer.json()["choices"]}

        greedy = texts(temperature=0)
        many = {"temperature": 1.5, "n": 3, "seed": 1}
        assert texts(top_k=1, samplers="kt", **many) == greedy
        assert len(texts(top_k=1, samplers=["temperature"], **many)) > 1
        for version in (1, 2):
            assert texts(mirostat=version, mirostat_tau=0.01, **many) == greedy
            loose = {"mirostat": version, "mirostat_tau": 10, "temperature": 1.0, "seed": 5}
            assert texts(**loose) == texts(**loose)
        # At temperature 1, b is 0.37 as likely as a: min_p 0.5 drops it. At 2, 0.61: kept.
        bias, a, b = _two_token_bias(http, "Hello")
        order = {"max_tokens": 1, "n": 16, "seed": 7, "temperature": 2.0, "min_p": 0.5}
        order |= {"top_k": 0, "top_p": 1.0, "logit_bias": bias, "ignore_eos": False}
        assert texts(samplers=["min_p", "temperature"], **order) == {a}
        assert texts(samplers=["temperature", "min_p"], **order) == {a, b}


def test_llama_server_request_fields_on_each_engine(engine: ServerProcess) -> None:
    with engine.http() as http:
        body = {"prompt": "Hello", "n_predict": 4, "ignore_eos": True, "temperature": 0}
        first = http.post("/completion", json={**body, "n_probs": 2, "return_tokens": True})
        answer = first.json()
        assert len(answer["completion_probabilities"]) == len(answer["tokens"]) == 4
        again = http.post("/completion", json=body).json()
        assert again["tokens_cached"] == answer["tokens_evaluated"] - 1
        fresh = http.post("/completion", json={**body, "cache_prompt": False}).json()
        assert fresh["tokens_cached"] == 0 and fresh["content"] == again["content"]
        empty = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 0}).json()
        assert empty["usage"]["completion_tokens"] == 0
