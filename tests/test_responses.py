"""The Responses API over HTTP with the official OpenAI client, and its response store."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from mlxcel.engine.handle import RequestHandle
from mlxcel.engine.types import EngineError, SamplingParams, TokenEvent
from mlxcel.protocol.responses import ResponsesRequest
from mlxcel.serving.response_store import ResponseStore
from mlxcel.serving.responses import ResponseRun
from mlxcel.serving.responses_stream import response_events
from mlxcel.serving.text import Generation
from tests.server_process import ServerProcess

slow = pytest.mark.slow

STORY = "Write a long story about a dragon."
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
def http(server: ServerProcess) -> httpx.Client:
    return server.http()


def _create(client: openai.OpenAI, **kwargs: Any) -> Any:
    settings: dict[str, Any] = {"model": "default", "max_output_tokens": 16, "temperature": 0}
    return client.responses.create(**{**settings, **kwargs})


# --- the store, without a server ---


def _fake(response_id: str, padding: int = 0) -> dict[str, Any]:
    return {"id": response_id, "pad": "x" * padding}


def test_store_evicts_the_oldest_past_its_entry_limit() -> None:
    store = ResponseStore(max_entries=2)
    for name in ("a", "b", "c"):
        store.put(_fake(name), [])
    assert store.get("a") is None
    assert store.get("b") is not None and store.get("c") is not None
    assert len(store) == 2


def test_store_evicts_the_oldest_past_its_byte_limit() -> None:
    store = ResponseStore(max_bytes=1000)
    for name in ("a", "b", "c"):
        store.put(_fake(name, padding=400), [])
    assert [store.get(n) is not None for n in "abc"] == [False, True, True]
    assert store.total_bytes <= 1000
    store.put(_fake("huge", padding=2000), [])
    assert store.get("huge") is None
    assert store.get("c") is not None


def test_store_expires_and_deletes() -> None:
    now = [0.0]
    store = ResponseStore(ttl=10, clock=lambda: now[0])
    store.put(_fake("old"), [{"role": "user", "content": "hi"}])
    now[0] = 5
    store.put(_fake("new"), [])
    stored = store.get("old")
    assert stored is not None and stored.messages == [{"role": "user", "content": "hi"}]
    now[0] = 11
    assert store.get("old") is None
    assert store.delete("new") and not store.delete("new")
    assert len(store) == 0 and store.total_bytes == 0


def test_engine_failure_mid_stream_is_response_failed() -> None:
    async def run() -> list[dict[str, Any]]:
        handle = RequestHandle("resp_test", asyncio.get_running_loop())
        model = SimpleNamespace(name="fake", scheduler=SimpleNamespace(submit=lambda *_: [handle]))
        params = SamplingParams(max_tokens=8, temperature=0, top_p=1, top_k=1, min_p=0)
        generation = Generation(model, "resp_test", [1, 2], params)  # type: ignore[arg-type]
        request = ResponsesRequest.model_validate({"input": "hi"})
        store = ResponseStore()
        handle.deliver(TokenEvent("Hel", (1,)))
        handle.deliver(TokenEvent("", (), error=EngineError("the engine fell over")))
        events = [
            e async for e in response_events(ResponseRun(generation, request, [], "m"), store)
        ]
        assert store.get("resp_test") is not None
        return events

    events = asyncio.run(run())
    last = events[-1]
    types = [e["type"] for e in events]
    assert types.index("response.output_text.delta") < types.index("response.output_text.done")
    assert types[-2:] == ["response.output_item.done", "response.failed"]
    assert last["response"]["status"] == "failed"
    assert last["response"]["error"] == {"code": "server_error", "message": "the engine fell over"}
    assert last["response"]["output"][0]["content"][0]["text"] == "Hel"


# --- creating responses ---


@slow
def test_string_input_gives_a_response_object(client: openai.OpenAI, http: httpx.Client) -> None:
    response = _create(client, input="Say hello.", metadata={"topic": "greeting"})
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.metadata == {"topic": "greeting"}
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert message.content[0].type == "output_text"
    assert response.output_text == message.content[0].text != ""
    raw = http.post("/v1/responses", json={"input": "Say hello.", "max_output_tokens": 4}).json()
    assert "output_text" not in raw
    assert raw["error"] is None and raw["text"] == {"format": {"type": "text"}}


@slow
def test_usage_adds_up(client: openai.OpenAI) -> None:
    response = _create(client, input="Say hello.")
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens > 5
    assert 0 < usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 <= usage.input_tokens_details.cached_tokens < usage.input_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


@slow
def test_item_list_with_text_parts_and_instructions(client: openai.OpenAI) -> None:
    items = [
        {"role": "developer", "content": "Answer in English."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "Name a color."},
    ]
    plain = _create(client, input=items)
    instructed = _create(client, input=items, instructions="You are terse.")
    assert instructed.output_text
    assert instructed.instructions == "You are terse."
    assert plain.usage is not None and instructed.usage is not None
    assert instructed.usage.input_tokens != plain.usage.input_tokens


@slow
def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    response = _create(client, input=STORY, max_output_tokens=4)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.usage is not None and response.usage.output_tokens == 4


@slow
def test_greedy_and_seeded_outputs_repeat(client: openai.OpenAI) -> None:
    assert _create(client, input=STORY).output_text == _create(client, input=STORY).output_text

    def sample(seed: int) -> str:
        hot = _create(client, input=STORY, temperature=1.0, extra_body={"seed": seed})
        return str(hot.output_text)

    assert sample(1234) == sample(1234)


@slow
def test_function_call_items_are_rendered(client: openai.OpenAI) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    result = {"type": "function_call_output", "call_id": "call_1", "output": "22 C and sunny"}
    asked = _create(client, input=[question], tools=[WEATHER_TOOL])
    answered = _create(client, input=[question, call, result], tools=[WEATHER_TOOL])
    assert answered.status in ("completed", "incomplete")
    assert answered.tools[0].type == "function" and answered.tools[0].name == "get_weather"
    assert answered.tool_choice == "auto"
    assert asked.usage is not None and answered.usage is not None
    assert answered.usage.input_tokens > asked.usage.input_tokens + 10


# --- streaming ---


@slow
def test_stream_events_in_order(client: openai.OpenAI) -> None:
    events = list(_create(client, input="Say hello.", stream=True))
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events[4:-4])
    final = events[-1].response
    assert text == final.output_text == events[-4].text
    assert final.usage is not None and final.usage.output_tokens > 0
    assert text == _create(client, input="Say hello.").output_text


@slow
def test_stream_helper_gives_the_final_response(client: openai.OpenAI) -> None:
    deltas = []
    with client.responses.stream(
        model="default", input="Say hi.", max_output_tokens=64, temperature=0
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(deltas) != ""


@slow
def test_raw_stream_is_typed_sse_without_done(http: httpx.Client) -> None:
    body = {"input": "Hi", "max_output_tokens": 3, "stream": True}
    response = http.post("/v1/responses", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = [frame for frame in response.text.split("\n\n") if frame]
    assert frames[0].startswith("event: response.created\ndata: {")
    assert frames[-1].startswith("event: response.incomplete\n")
    assert "[DONE]" not in response.text


@slow
def test_disconnect_mid_stream_frees_the_engine(server: ServerProcess) -> None:
    client = server.openai()
    tokens, cancelled = server.generation_counts()
    stream = _create(
        client,
        input=STORY,
        max_output_tokens=1500,
        temperature=1.5,
        stream=True,
        store=False,
        extra_body={"ignore_eos": True},
    )
    for received, _ in enumerate(stream, start=1):
        if received == 6:
            break
    stream.close()
    server.assert_cancelled_early(tokens, cancelled, max_tokens=1500)
    assert _create(client, input="Hi", max_output_tokens=4).output_text


# --- stored responses ---


@slow
def test_retrieve_then_delete(client: openai.OpenAI, http: httpx.Client) -> None:
    created = _create(client, input="Say hello.", metadata={"k": "v"})
    stored = client.responses.retrieve(created.id)
    assert stored.id == created.id
    assert stored.output_text == created.output_text
    assert stored.metadata == {"k": "v"}
    deleted = http.delete(f"/v1/responses/{created.id}")
    assert deleted.json() == {"id": created.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


@slow
def test_streamed_responses_are_stored(client: openai.OpenAI) -> None:
    events = list(_create(client, input="Say hello.", stream=True))
    final = events[-1].response
    assert client.responses.retrieve(final.id).output_text == final.output_text


@slow
def test_unknown_ids_are_404_in_the_envelope(http: httpx.Client) -> None:
    for response in (http.get("/v1/responses/resp_nope"), http.delete("/v1/responses/resp_nope")):
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "response_not_found" and error["param"] == "response_id"
    body = {"input": "Hi", "previous_response_id": "resp_nope"}
    error = http.post("/v1/responses", json=body).json()["error"]
    assert error["param"] == "previous_response_id"


@slow
def test_store_false_is_not_retrievable(client: openai.OpenAI) -> None:
    response = _create(client, input="Say hello.", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        _create(client, input="And again.", previous_response_id=response.id)


@slow
def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = _create(client, input="My name is Ada. Remember it.", instructions="Be brief.")
    second = _create(client, input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    third = _create(client, input="Thanks.", previous_response_id=second.id)
    assert third.usage is not None
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


# --- what is rejected ---


@slow
@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"background": True}, "background", "background"),
        ({"tool_choice": "required"}, "tool_choice", "requires tools"),
        (
            {"tool_choice": {"type": "web_search"}},
            "tool_choice",
            "not a function choice",
        ),
        (
            {"text": {"format": {"type": "xml"}}},
            "text.format.type",
            "xml",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type", "web_search"),
        ({"include": ["file_search_call.results"]}, "include.0", "file_search_call.results"),
        ({"reasoning": {"effort": "lots"}}, "reasoning.effort", "reasoning.effort"),
        ({"truncation": "auto"}, "truncation", "truncation"),
        ({"max_tokens": 5}, "max_tokens", "max_output_tokens"),
        ({"n": 2}, "n", "'n'"),
        ({"service_tier": "flex"}, "service_tier", "service_tier"),
    ],
)
def test_unsupported_fields_are_named(
    http: httpx.Client, extra: dict[str, Any], param: str, words: str
) -> None:
    response = http.post("/v1/responses", json={"input": "Hi", **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]


@slow
@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "input_image", "image_url": "http://x"}, "input.0"),
        ({"role": "user", "content": [{"type": "input_image"}]}, "input.0.message.content.0"),
        (
            {"type": "function_call", "name": "f", "arguments": "{}"},
            "input.0.function_call.call_id",
        ),
    ],
)
def test_bad_input_items_are_named(http: httpx.Client, item: dict[str, Any], param: str) -> None:
    response = http.post("/v1/responses", json={"input": [item]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.slow
def test_repeated_input_reports_cached_tokens(client: openai.OpenAI) -> None:
    text = "Summarise the plot of a long novel about the sea. " * 8
    client.responses.create(model="default", input=text, max_output_tokens=2)
    again = client.responses.create(model="default", input=text, max_output_tokens=2)
    assert again.usage is not None
    assert again.usage.input_tokens_details.cached_tokens > 0


RESPONSES_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}


@pytest.mark.slow
def test_forced_function_call_becomes_a_function_call_item(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="default",
        input="Weather in Paris?",
        tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    follow = client.responses.create(
        model="default",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
        tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
        max_output_tokens=10,
    )
    assert follow.output_text is not None


@pytest.mark.slow
def test_streamed_function_call_events(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="default",
            input="Weather in Paris?",
            tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    types = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(deltas) == json.loads(done.arguments)
    assert types[-1] == "response.completed"
    final = events[-1].response.output
    assert [item.type for item in final] == ["function_call"]
    assert "response.output_text.delta" not in types


# min_tokens bans the end until past the first call (at most ~45 tokens), so the grammar of
# `required` with parallel calls must write a second one, after the newline it puts between.
TWO_CALLS: dict[str, Any] = {
    "input": "Weather in Paris and in Rome?",
    "tools": [RESPONSES_WEATHER],
    "tool_choice": "required",
    "parallel_tool_calls": True,
    "max_output_tokens": 300,
    "temperature": 0,
    "extra_body": {"min_tokens": 50},
}


def _calls_then_text(items: list[Any]) -> None:
    """Function calls first, side by side; a message only after them, never whitespace."""
    kinds = [item.type for item in items]
    assert kinds.count("function_call") >= 2, kinds
    last_call = len(kinds) - 1 - kinds[::-1].index("function_call")
    assert kinds[: last_call + 1] == ["function_call"] * (last_call + 1), kinds
    for item in items:
        if item.type == "message":
            assert "".join(part.text for part in item.content).strip()


@slow
def test_whitespace_between_forced_calls_is_no_message(client: openai.OpenAI) -> None:
    response = client.responses.create(model="default", **TWO_CALLS)
    _calls_then_text(response.output)
    events = list(client.responses.create(model="default", stream=True, **TWO_CALLS))
    _calls_then_text(events[-1].response.output)
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == [item.type for item in events[-1].response.output]
    assert not [e for e in events if e.type == "response.output_text.delta" and not e.delta.strip()]


@slow
def test_a_codex_style_request_is_served(client: openai.OpenAI) -> None:
    # The fields a Codex-style agent sends on every turn, stateless.
    shell = {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
        },
    }
    events = list(
        client.responses.create(
            model="default",
            instructions="You are a coding agent.",
            input=[{"type": "message", "role": "user", "content": "List the files."}],
            tools=[shell],  # type: ignore[list-item]
            tool_choice="auto",
            parallel_tool_calls=False,
            reasoning={"effort": "medium", "summary": "auto"},
            store=False,
            stream=True,
            include=["reasoning.encrypted_content"],
            prompt_cache_key="conversation-1",
            safety_identifier="user-1",
            max_output_tokens=16,
        )
    )
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert final.response.prompt_cache_key == "conversation-1"
