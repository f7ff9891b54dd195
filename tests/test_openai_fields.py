"""The field policy over HTTP: what OpenAI clients send back is taken, what cannot be honoured is
a 400 naming it, and typos are still caught."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ok

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Tell me a story about a cat."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TOOLS = [{"type": "function", "function": WEATHER}]
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]


def chat(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"max_tokens": 8, "temperature": 0, **body})


def refused(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


def test_model_dump_round_trip(client: openai.OpenAI) -> None:
    messages: list[Any] = list(STORY)
    first = client.chat.completions.create(
        model="default", messages=messages, max_tokens=8, temperature=0
    )
    sent_back = first.choices[0].message.model_dump()
    assert {"refusal", "annotations", "audio", "function_call", "tool_calls"} <= set(sent_back)
    messages += [sent_back, {"role": "user", "content": "And then?"}]
    second = client.chat.completions.create(
        model="default", messages=messages, max_tokens=8, temperature=0
    )
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_model_dump_round_trip_with_tool_calls(client: openai.OpenAI) -> None:
    messages: list[Any] = list(PARIS)
    called = client.chat.completions.create(
        model="default",
        messages=messages,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    message = called.choices[0].message
    assert message.tool_calls
    messages.append(message.model_dump())
    messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"})
    answer = client.chat.completions.create(
        model="default", messages=messages, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert answer.choices[0].message is not None


def test_streamed_tool_call_kept_with_its_index(client: openai.OpenAI, http: httpx.Client) -> None:
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(
        model="default",
        messages=PARIS,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
        stream=True,
    ):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            call = calls.setdefault(
                delta.index, {"index": delta.index, "type": "function", "function": {}}
            )
            call["id"] = delta.id or call.get("id")
            function = call["function"]
            if delta.function and delta.function.name:
                function["name"] = delta.function.name
            if delta.function and delta.function.arguments is not None:
                function["arguments"] = function.get("arguments", "") + delta.function.arguments
    assert calls and all("index" in call for call in calls.values())
    history = [
        *PARIS,
        {"role": "assistant", "content": None, "tool_calls": list(calls.values())},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"},
    ]
    ok(chat(http, messages=history, tools=TOOLS))


def test_cache_control_parts_as_litellm_sends_them(http: httpx.Client) -> None:
    hint = {"type": "ephemeral"}
    with_hints = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "Be brief.", "cache_control": hint}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Tell me a story "},
                {"type": "text", "text": "about a cat.", "cache_control": hint},
            ],
        },
    ]
    plain = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me a story about a cat."},
    ]
    hinted, unhinted = ok(chat(http, messages=with_hints)), ok(chat(http, messages=plain))
    assert hinted["usage"]["prompt_tokens"] == unhinted["usage"]["prompt_tokens"]
    assert hinted["choices"][0]["message"] == unhinted["choices"][0]["message"]


def test_fields_with_no_effect_change_nothing(http: httpx.Client) -> None:
    baseline = ok(chat(http, messages=STORY))
    hinted = ok(
        chat(
            http,
            messages=STORY,
            store=True,
            metadata={"team": "search"},
            service_tier="auto",
            verbosity="low",
            prompt_cache_key="conversation-1",
            prompt_cache_retention="24h",
            safety_identifier="user-1",
            modalities=["text"],
            verbose=True,
            stream_options=None,
        )
    )
    assert hinted["choices"][0]["message"] == baseline["choices"][0]["message"]
    streamed = http.post(
        "/v1/chat/completions",
        json={
            "messages": STORY,
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True, "include_obfuscation": False},
        },
    )
    assert streamed.status_code == 200, streamed.text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("modalities", ["text", "audio"]),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("prediction", {"type": "content", "content": "Once upon a time"}),
        ("web_search_options", {}),
    ],
)
def test_fields_that_cannot_be_honoured_are_refused(
    http: httpx.Client, field: str, value: object
) -> None:
    error = refused(chat(http, messages=STORY, **{field: value}))
    assert (error["param"], error["code"]) == (field, "unsupported_field")


def test_an_audio_answer_in_history_is_refused(http: httpx.Client) -> None:
    history = [*STORY, {"role": "assistant", "content": None, "audio": {"id": "audio_1"}}]
    error = refused(chat(http, messages=history))
    assert (error["param"], error["code"]) == ("messages.1.audio", "unsupported_field")
    assert ok(chat(http, messages=[*STORY, {"role": "assistant", "content": "x", "audio": None}]))


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            "model does not support image input",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            "model does not support audio input",
        ),
        ({"type": "file", "file": {"file_id": "file-1"}}, "content part of type 'file'"),
    ],
)
def test_content_parts_a_text_model_cannot_read_are_named(
    http: httpx.Client, part: dict[str, Any], message: str
) -> None:
    content = [{"type": "text", "text": "What is this?"}, part]
    error = refused(chat(http, messages=[{"role": "user", "content": content}]))
    assert error["param"] == "messages.0.content.1"
    assert message in error["message"]
    assert "str" not in error["param"]


def test_typos_are_still_caught(http: httpx.Client) -> None:
    for body, param in (
        ({"messages": STORY, "temprature": 0.5}, "temprature"),
        ({"messages": [{"role": "user", "contnet": "hi"}]}, "messages.0.contnet"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "txt": "hi"}]}]},
            "messages.0.content.0.txt",
        ),
        (
            {"messages": STORY, "stream_options": {"include_usages": True}},
            "stream_options.include_usages",
        ),
    ):
        error = refused(http.post("/v1/chat/completions", json=body))
        assert (error["param"], error["code"]) == (param, "unsupported_field")
    part = {"role": "user", "content": [{"type": "text"}]}
    assert refused(chat(http, messages=[part]))["param"] == "messages.0.content.0"


def test_max_tokens_zero_only_evaluates_the_prompt(http: httpx.Client) -> None:
    # A prompt no earlier test sent, so the cache holds none of it before.
    prompt = f"Remember the word {uuid.uuid4().hex}."
    warmed = ok(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 0}))
    assert warmed["choices"][0]["text"] == ""
    assert warmed["choices"][0]["finish_reason"] == "length"
    assert warmed["usage"]["completion_tokens"] == 0
    used = ok(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}))
    prompt_tokens = used["usage"]["prompt_tokens"]
    assert used["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens - 1
    empty = ok(chat(http, messages=STORY, max_completion_tokens=0))
    assert empty["choices"][0]["message"]["content"] == ""
    assert empty["usage"]["completion_tokens"] == 0


def test_top_p_zero_keeps_the_most_likely_token(http: httpx.Client) -> None:
    greedy = ok(chat(http, messages=STORY))["choices"][0]["message"]["content"]
    sampled = {
        ok(chat(http, messages=STORY, temperature=1.5, top_p=0, seed=seed))["choices"][0][
            "message"
        ]["content"]
        for seed in (1, 2, 3)
    }
    assert sampled == {greedy}


def legacy_call(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(  # type: ignore[call-overload]
        model="default",
        messages=PARIS,
        functions=[WEATHER],
        function_call={"name": "get_weather"},
        max_tokens=60,
        temperature=0,
        **extra,
    )


def test_legacy_function_calling(client: openai.OpenAI, http: httpx.Client) -> None:
    choice = legacy_call(client).choices[0]
    assert choice.finish_reason == "function_call"
    call = choice.message.function_call
    assert call is not None and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"}
    assert choice.message.tool_calls is None
    streamed = list(legacy_call(client, stream=True))
    deltas = [c.choices[0].delta.function_call for c in streamed if c.choices]
    assert "".join(d.arguments or "" for d in deltas if d) == call.arguments
    assert streamed[-1].choices[0].finish_reason == "function_call"
    history = [
        *PARIS,
        choice.message.model_dump(),
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    ok(chat(http, messages=history, functions=[WEATHER]))
    assert refused(chat(http, messages=PARIS, functions=[WEATHER], tools=TOOLS))["param"] == (
        "functions"
    )


def test_a_refusal_reaches_the_template(http: httpx.Client) -> None:
    history = [*STORY, {"role": "assistant", "content": None, "refusal": "I will not say."}]
    prompt = ok(http.post("/apply-template", json={"messages": history}))["prompt"]
    assert "I will not say." in prompt
