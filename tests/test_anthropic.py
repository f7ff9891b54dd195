"""Anthropic's Messages API over HTTP with the official anthropic SDK, on the chat path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from mlxcel.api.routes.anthropic import stream_error
from mlxcel.api.sse import typed_event_stream
from mlxcel.engine.handle import RequestHandle
from mlxcel.engine.types import EngineError, SamplingParams, TokenEvent
from mlxcel.protocol.anthropic import MessagesRequest
from mlxcel.serving.answer import AnswerStream
from mlxcel.serving.anthropic import MessageJob
from mlxcel.serving.anthropic_input import chat_request
from mlxcel.serving.anthropic_stream import ContentBlocks, message_events
from mlxcel.serving.chat import ChatJob
from mlxcel.serving.text import Generation
from mlxcel.serving.tools import ToolPlan
from tests.conftest import serving
from tests.server_process import ServerProcess
from tests.test_reasoning import TEMPLATE, THINKING

slow = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0}
WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
FORCED = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return server.anthropic()


@pytest.fixture
def http(server: ServerProcess) -> httpx.Client:
    return server.http()


def _create(client: anthropic.Anthropic, **kwargs: Any) -> anthropic.types.Message:
    settings: dict[str, Any] = {"model": "default", "max_tokens": 16, "messages": HELLO}
    extra = {**GREEDY, **kwargs.pop("extra_body", {})}
    return client.messages.create(**{**settings, **kwargs}, extra_body=extra)


def _stream(client: anthropic.Anthropic, **kwargs: Any) -> tuple[list[Any], Any]:
    """A streamed message's events and the SDK's final message."""
    settings: dict[str, Any] = {"model": "default", "max_tokens": 16, "messages": HELLO}
    extra = {**GREEDY, **kwargs.pop("extra_body", {})}
    with client.messages.stream(**{**settings, **kwargs}, extra_body=extra) as stream:
        return list(stream), stream.get_final_message()


_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}


def _deltas(events: list[Any], kind: str) -> str:
    """The text of every content_block_delta of one kind, joined."""
    return "".join(
        getattr(e.delta, _DELTA_FIELDS[kind])
        for e in events
        if e.type == "content_block_delta" and e.delta.type == kind
    )


# --- from messages to a chat request, without a server ---


def _chat(**body: Any) -> list[dict[str, Any]]:
    request = MessagesRequest.model_validate({"messages": HELLO, "max_tokens": 16, **body})
    return [m.template_dict() for m in chat_request(request).messages]


def test_system_blocks_and_tool_turns_become_chat_messages() -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "look it up", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "P"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": []},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    system = [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Be kind."}]
    chat = _chat(system=system, messages=messages)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert chat[0]["content"] == "Be brief. Be kind."
    assistant = chat[2]
    assert assistant["content"] == "Checking." and assistant["reasoning_content"] == "look it up"
    call = assistant["tool_calls"][0]
    assert call["id"] == "toolu_1" and call["function"] == {
        "name": "get_weather",
        "arguments": {"city": "P"},
    }
    assert chat[3] == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": "toolu_1",
        "name": "get_weather",
    }
    assert chat[4]["content"] == "Error: "
    assert chat[5] == {"role": "user", "content": "And tomorrow?"}


def test_tool_choice_thinking_and_prefill_map_onto_chat_fields() -> None:
    tools = [WEATHER]
    request = chat_request(
        MessagesRequest.model_validate(
            {
                "messages": [*HELLO, {"role": "assistant", "content": "Hello"}],
                "tools": tools,
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                "max_tokens": 16000,
                "thinking": {"type": "enabled", "budget_tokens": 8000},
                "stop_sequences": ["END"],
                "metadata": {"user_id": "u-1"},
            }
        )
    )
    assert request.tool_choice == "required" and request.parallel_tool_calls is False
    assert (
        request.tools is not None
        and request.tools[0].function.parameters == WEATHER["input_schema"]
    )
    assert request.reasoning_effort == "medium"
    assert request.chat_template_kwargs == {"enable_thinking": True}
    assert request.continue_final_message and not request.add_generation_prompt
    assert request.stop == ["END"] and request.user == "u-1" and request.max_tokens == 16000
    named = chat_request(
        MessagesRequest.model_validate(
            {
                "messages": HELLO,
                "max_tokens": 16,
                "tools": tools,
                "tool_choice": {"type": "tool", "name": "x"},
            }
        )
    )
    assert named.tool_choice is not None and named.tool_choice.function == {"name": "x"}  # type: ignore[union-attr]
    off = chat_request(
        MessagesRequest.model_validate(
            {"messages": HELLO, "max_tokens": 16, "thinking": {"type": "disabled"}}
        )
    )
    assert off.reasoning_effort == "none"


def test_content_blocks_stream_in_order_with_indices() -> None:
    plan = ToolPlan([{"type": "function", "function": {"name": "f"}}], "hermes", None)
    blocks = ContentBlocks(AnswerStream("qwen3", plan))
    text = '<think>hmm</think>Hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    events = [e for i in range(0, len(text), 3) for e in blocks.feed(text[i : i + 3])]
    events += blocks.finish()
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "text", "tool_use"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1, 2]
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    by_kind: dict[str, str] = {}
    for delta in deltas:
        body = delta["delta"]
        value = body.get("thinking", body.get("text", body.get("partial_json", "")))
        by_kind[body["type"]] = by_kind.get(body["type"], "") + value
    assert by_kind["thinking_delta"] == "hmm"
    assert by_kind["text_delta"].strip() == "Hi"
    assert json.loads(by_kind["input_json_delta"]) == {"a": 1}
    # A block's deltas come between its start and its stop.
    for delta in deltas:
        start = next(i for i, e in enumerate(events) if e.get("index") == delta["index"])
        assert events[start]["type"] == "content_block_start"


def test_an_empty_answer_is_one_empty_text_block() -> None:
    blocks = ContentBlocks(AnswerStream(None, None))
    events = blocks.finish()
    assert [e["type"] for e in events] == ["content_block_start", "content_block_stop"]
    assert events[0]["content_block"] == {"type": "text", "text": ""}


def test_engine_failure_mid_stream_is_an_error_event() -> None:
    async def run() -> list[str]:
        handle = RequestHandle("msg_test", asyncio.get_running_loop())
        model = SimpleNamespace(name="fake", scheduler=SimpleNamespace(submit=lambda *_: [handle]))
        params = SamplingParams(max_tokens=8, temperature=0, top_p=1, top_k=1, min_p=0)
        generation = Generation(model, "msg_test", [1, 2], params)  # type: ignore[arg-type]
        handle.deliver(TokenEvent("Hel", (1,)))
        handle.deliver(TokenEvent("", (), error=EngineError("the engine fell over")))
        job = MessageJob(ChatJob([generation], None), "msg_test")
        response = await typed_event_stream(message_events(job), "msg_test", stream_error)
        frames = [
            chunk if isinstance(chunk, str) else bytes(chunk).decode()
            async for chunk in response.body_iterator
        ]
        return frames

    frames = asyncio.run(run())
    names = [frame.split("\n")[0] for frame in frames]
    assert names == [
        "event: message_start",
        "event: ping",
        "event: content_block_start",
        "event: content_block_delta",
        "event: error",
    ]
    error = json.loads(frames[-1].split("data: ", 1)[1])
    assert error == {
        "type": "error",
        "error": {"type": "api_error", "message": "the engine fell over"},
    }


# --- messages over HTTP ---


@slow
def test_create_gives_a_message(claude: anthropic.Anthropic) -> None:
    message = _create(claude, metadata={"user_id": "user-1"}, service_tier="auto")
    assert message.id.startswith("msg_")
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert [block.type for block in message.content] == ["text"]
    usage = message.usage
    assert 0 < usage.output_tokens <= 16 and usage.cache_creation_input_tokens == 0
    counted = claude.messages.count_tokens(model="default", messages=HELLO)  # type: ignore[arg-type]
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted.input_tokens


@slow
def test_max_tokens_and_stop_sequences_set_the_stop_reason(claude: anthropic.Anthropic) -> None:
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    cut = _create(claude, messages=story, max_tokens=3, extra_body={"ignore_eos": True})
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    forced = {"grammar": 'root ::= "one two three"'}
    stopped = _create(claude, stop_sequences=["two"], max_tokens=10, extra_body=forced)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "two"
    assert stopped.content[0].type == "text" and stopped.content[0].text == "one "


@slow
def test_stream_helper_gives_the_same_message(claude: anthropic.Anthropic) -> None:
    whole = _create(claude, max_tokens=24)
    with claude.messages.stream(
        model="default",
        max_tokens=24,
        messages=HELLO,
        extra_body=GREEDY,  # type: ignore[arg-type]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.id.startswith("msg_") and final.id != whole.id
    assert final.content[0].type == "text" and text == final.content[0].text
    assert whole.content[0].type == "text" and text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == (
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    )


def _frames(text: str) -> list[tuple[str, dict[str, Any]]]:
    frames = []
    for frame in text.strip().split("\n\n"):
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        frames.append((name[len("event: ") :], json.loads(data[len("data: ") :])))
    return frames


@slow
def test_raw_stream_is_anthropics_event_sequence(http: httpx.Client) -> None:
    body = {"messages": HELLO, "max_tokens": 8, "stream": True, "ignore_eos": True, **GREEDY}
    response = http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in response.text
    frames = _frames(response.text)
    assert all(name == data["type"] for name, data in frames)
    names = [name for name, _ in frames]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 0
    delta = frames[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 8
    assert all(data["delta"]["type"] == "text_delta" for _, data in frames[3:-3])


@slow
def test_forced_tool_call_round_trip(claude: anthropic.Anthropic) -> None:
    first = _create(claude, messages=ASK, tools=[WEATHER], tool_choice=FORCED, max_tokens=60)
    assert first.stop_reason == "tool_use"
    assert [block.type for block in first.content] == ["tool_use"]
    call = first.content[0]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER["input_schema"])
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees and sunny"}
    follow = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    answer = _create(claude, messages=follow, tools=[WEATHER], max_tokens=20)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = claude.messages.count_tokens(model="default", messages=follow, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    asked = claude.messages.count_tokens(model="default", messages=ASK, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    assert counted.input_tokens > asked.input_tokens + 10
    used = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert used == counted.input_tokens


@slow
def test_streamed_tool_call_has_input_json_deltas(claude: anthropic.Anthropic) -> None:
    choice = {"type": "any", "disable_parallel_tool_use": True}
    events, final = _stream(
        claude, max_tokens=60, messages=ASK, tools=[WEATHER], tool_choice=choice
    )
    partial = _deltas(events, "input_json_delta")
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["tool_use"]
    assert final.stop_reason == "tool_use"
    block = final.content[0]
    assert block.type == "tool_use" and block.input == json.loads(partial)
    jsonschema.validate(block.input, WEATHER["input_schema"])


@slow
def test_tool_choice_none_and_auto(claude: anthropic.Anthropic) -> None:
    def count(**tools: Any) -> int:
        return claude.messages.count_tokens(model="default", messages=ASK, **tools).input_tokens

    # "none" shows the model no tools and returns no calls; "auto" shows them.
    assert count(tools=[WEATHER], tool_choice={"type": "none"}) == count()
    assert count(tools=[WEATHER], tool_choice={"type": "auto"}) > count()
    none = _create(claude, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"})
    assert [block.type for block in none.content] == ["text"]
    assert none.stop_reason != "tool_use"
    auto = _create(
        claude, messages=ASK, tools=[WEATHER], tool_choice={"type": "auto"}, max_tokens=60
    )
    # Whether the model calls the tool is its own choice; the stop reason says which it made.
    calls = [block for block in auto.content if block.type == "tool_use"]
    for call in calls:
        jsonschema.validate(call.input, WEATHER["input_schema"])
    if auto.stop_reason != "max_tokens":
        assert (auto.stop_reason == "tool_use") == bool(calls)


@slow
def test_count_tokens_sees_system_tools_and_prefill(claude: anthropic.Anthropic) -> None:
    def count(**body: Any) -> int:
        return claude.messages.count_tokens(
            model="default", **{"messages": HELLO, **body}
        ).input_tokens

    plain = count()
    longer = "You are terse, and you answer every question in one short sentence."
    assert count(system=longer) > count(system="You are terse.")
    blocks = [{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}]
    assert count(system=blocks) == count(system="You are terse.")
    assert count(tools=[WEATHER]) > plain + 10
    prefill = [*HELLO, {"role": "assistant", "content": "Hello there, friend"}]
    assert count(messages=prefill) > plain


@slow
def test_prefill_continues_the_assistant_turn(claude: anthropic.Anthropic) -> None:
    prefill = [*HELLO, {"role": "assistant", "content": '{"greeting": "'}]
    message = _create(claude, messages=prefill, max_tokens=8)
    assert message.content[0].type == "text"
    counted = claude.messages.count_tokens(model="default", messages=prefill)  # type: ignore[arg-type]
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted.input_tokens


# --- errors in Anthropic's shape ---

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}


@slow
@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        (
            {"messages": [{"role": "user", "content": [IMAGE]}]},
            400,
            "invalid_request_error",
            "image",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}
                        ],
                    }
                ]
            },
            400,
            "invalid_request_error",
            "image",
        ),
        ({"messages": HELLO, "top_logits": 3}, 400, "invalid_request_error", "top_logits"),
        ({"messages": []}, 400, "invalid_request_error", "messages"),
        (
            {"messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            400,
            "invalid_request_error",
            "web_search_20250305",
        ),
        (
            {"messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "tool"}},
            400,
            "invalid_request_error",
            "name",
        ),
        (
            {
                "messages": HELLO,
                "max_tokens": 1024,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
            },
            400,
            "invalid_request_error",
            "budget_tokens",
        ),
        ({"messages": HELLO, "stop": ["x"]}, 400, "invalid_request_error", "stop_sequences"),
    ],
)
def test_errors_are_in_anthropics_shape(
    http: httpx.Client, body: dict[str, Any], status: int, kind: str, words: str
) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and ("stop" in body or "max_tokens" in body):
            continue
        # Messages needs max_tokens (Anthropic's API does); count_tokens takes none.
        sent = body if path.endswith("count_tokens") else {"max_tokens": 16, **body}
        response = http.post(path, json=sent)
        assert response.status_code == status, response.text
        error = response.json()
        assert set(error) == {"type", "error"} and error["type"] == "error"
        assert set(error["error"]) == {"type", "message"}
        assert error["error"]["type"] == kind and words in error["error"]["message"]


@slow
def test_bad_json_and_the_sdk_error_classes(
    http: httpx.Client, claude: anthropic.Anthropic
) -> None:
    response = http.post(
        "/v1/messages", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        _create(claude, messages=[{"role": "user", "content": [IMAGE]}])
    assert bad.value.status_code == 400
    assert "model does not support image input" in bad.value.message
    # Messages that hold nothing (found by schemathesis: once a 500 on count_tokens).
    empty = [{"role": "user", "content": []}]
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.count_tokens(model="any", messages=empty)
    assert "the messages hold nothing to send" in bad.value.message
    with pytest.raises(anthropic.BadRequestError) as bad:
        _create(claude, messages=empty)
    assert "the messages hold nothing to send" in bad.value.message


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory, "anthropic-keyed", "--api-key", "sk-local", "--strict-model-names"
    )


@slow
def test_x_api_key_is_checked_in_anthropics_shape(keyed: ServerProcess) -> None:
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _create(keyed.anthropic("wrong"))
    assert denied.value.status_code == 401
    assert denied.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }
    with keyed.http() as http:
        missing = http.post("/v1/messages/count_tokens", json={"messages": HELLO})
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    allowed = _create(keyed.anthropic("sk-local"), max_tokens=2, extra_body={"ignore_eos": True})
    assert allowed.usage.output_tokens == 2


@slow
def test_a_model_name_not_served(claude: anthropic.Anthropic, keyed: ServerProcess) -> None:
    # The one model serves a hard-coded name; with --strict-model-names it is a 404.
    served = _create(claude, model="claude-nope-1", max_tokens=2)
    assert served.model not in ("claude-nope-1", "default")
    with keyed.http(headers={"X-Api-Key": "sk-local"}) as http:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            body = {"messages": HELLO, "model": "claude-nope"}
            if path == "/v1/messages":
                body["max_tokens"] = 2
            response = http.post(path, json=body)
            assert response.status_code == 404, response.text
            error = response.json()["error"]
            assert error["type"] == "not_found_error" and "claude-nope" in error["message"]


# --- thinking, on a template with <think> tags ---


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "anthropic-thinker", "--chat-template-file", str(TEMPLATE))


def _alpha(text: str) -> bool:
    return text.replace(" ", "").isalpha()


THINK = {"type": "enabled", "budget_tokens": 1024}


@slow
def test_thinking_becomes_a_thinking_block(thinker: ServerProcess) -> None:
    client = thinker.anthropic()
    message = _create(
        client, thinking=THINK, max_tokens=2048, messages=HELLO, extra_body={"grammar": THINKING}
    )
    assert [block.type for block in message.content] == ["thinking", "text"]
    thought, text = message.content
    assert thought.type == "thinking" and _alpha(thought.thinking) and thought.signature == ""
    assert text.type == "text" and _alpha(text.text) and "<think>" not in text.text
    events, final = _stream(
        client, max_tokens=2048, thinking=THINK, extra_body={"grammar": THINKING}
    )
    thinking = _deltas(events, "thinking_delta")
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].type == "thinking" and thinking == final.content[0].thinking
    assert thinking == thought.thinking
    # Sent back, the thinking reaches the template in the assistant turn.
    again = [
        *HELLO,
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": "Again"},
    ]
    without = [
        *HELLO,
        {"role": "assistant", "content": [text]},
        {"role": "user", "content": "Again"},
    ]
    with_thought = client.messages.count_tokens(model="default", messages=again).input_tokens  # type: ignore[arg-type]
    bare = client.messages.count_tokens(model="default", messages=without).input_tokens  # type: ignore[arg-type]
    assert with_thought > bare


@slow
def test_thinking_settings_reach_the_template(thinker: ServerProcess) -> None:
    client = thinker.anthropic()

    def count(**body: Any) -> int:
        return client.messages.count_tokens(model="default", messages=HELLO, **body).input_tokens  # type: ignore[arg-type]

    default = count()
    enabled = count(thinking=THINK)
    disabled = count(thinking={"type": "disabled"})
    effort = count(thinking={"type": "adaptive"}, output_config={"effort": "high"})
    assert len({default, enabled, disabled}) == 3
    assert effort > default
