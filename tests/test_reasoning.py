"""Reasoning end to end: effort reaching the template, thinking split into reasoning items."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from mlxcel.protocol.responses import ResponsesRequest
from mlxcel.serving.responses_input import chat_messages
from tests.conftest import applied_prompt, start
from tests.server_process import ServerProcess

TEMPLATE = Path(__file__).parent / "data" / "thinking_template.jinja"
HELLO = [{"role": "user", "content": "Hello"}]
# Forces the default model (which never thinks) to write qwen3-style thinking, tags included.
THINKING = (
    'root ::= "<think>" [a-z]{2,8} (" " [a-z]{2,8}){0,3} "</think>" '
    '[A-Za-z]{2,8} (" " [A-Za-z]{2,8}){0,3}'
)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model behind a template with <think> tags: the reasoning parser is auto."""
    proc = start(tmp_path_factory.mktemp("thinker"), "--chat-template-file", str(TEMPLATE))
    yield proc
    proc.stop_soon()


@pytest.fixture(scope="module")
def client(thinker: ServerProcess) -> openai.OpenAI:
    return thinker.openai()


def _prompt(thinker: ServerProcess, **body: Any) -> str:
    return applied_prompt(thinker, HELLO, **body)


def test_reasoning_effort_reaches_the_template(thinker: ServerProcess) -> None:
    assert "Reasoning: high" in _prompt(thinker, reasoning_effort="high")
    assert "Reasoning" not in _prompt(thinker)
    assert _prompt(thinker, reasoning_effort="none").rstrip().endswith("<think></think>")
    assert not _prompt(thinker, reasoning_effort="low").rstrip().endswith("</think>")
    # chat_template_kwargs has the last word.
    kwargs = {"chat_template_kwargs": {"enable_thinking": True}}
    assert not _prompt(thinker, reasoning_effort="none", **kwargs).rstrip().endswith("</think>")


def test_earlier_thinking_is_sent_back_to_the_template(thinker: ServerProcess) -> None:
    turn = {"role": "assistant", "content": "Hi!", "reasoning_content": "a greeting"}
    messages = [*HELLO, turn, {"role": "user", "content": "Again"}]
    with thinker.http() as http:
        response = http.post("/apply-template", json={"messages": messages})
    assert response.status_code == 200, response.text
    assert "<think>a greeting</think>" in response.json()["prompt"]


def test_bad_effort_is_400(thinker: ServerProcess) -> None:
    with thinker.http() as http:
        chat = http.post(
            "/v1/chat/completions", json={"messages": HELLO, "reasoning_effort": "lots"}
        )
        responses = http.post("/v1/responses", json={"input": "Hi", "reasoning": {"effort": 3}})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "reasoning_effort"
    assert responses.status_code == 400
    assert responses.json()["error"]["param"] == "reasoning.effort"


def test_reasoning_items_become_the_assistant_turns_thinking() -> None:
    request = ResponsesRequest.model_validate(
        {
            "input": [
                {"role": "user", "content": "Hi"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "say hi"}],
                },
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Again"},
            ]
        }
    )
    messages = chat_messages(request.input)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["reasoning_content"] == "say hi"
    assert "reasoning_content" not in messages[2]


def _alpha(text: str) -> bool:
    return text.replace(" ", "").isalpha()


@pytest.mark.slow
def test_response_has_a_reasoning_item(client: openai.OpenAI) -> None:
    response = client.responses.create(
        input="Hello",
        reasoning={"effort": "low"},
        max_output_tokens=160,
        extra_body={"grammar": THINKING},
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    thought = response.output[0]
    assert thought.type == "reasoning" and thought.content is not None
    assert thought.id.startswith("rs_") and thought.status == "completed"
    text = thought.content[0].text
    assert _alpha(text) and "<think>" not in response.output_text
    assert _alpha(response.output_text)
    assert response.reasoning is not None and response.reasoning.effort == "low"
    details = response.usage.output_tokens_details  # type: ignore[union-attr]
    assert 0 < details.reasoning_tokens < response.usage.output_tokens  # type: ignore[union-attr]


@pytest.mark.slow
def test_streamed_reasoning_events(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            input="Hello", max_output_tokens=160, stream=True, extra_body={"grammar": THINKING}
        )
    )
    types = [event.type for event in events]
    deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
    assert deltas and all(d.output_index == 0 and d.content_index == 0 for d in deltas)
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert done.text == "".join(d.delta for d in deltas) and _alpha(done.text)
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    text = [e for e in events if e.type == "response.output_text.delta"]
    assert text and all(e.output_index == 1 for e in text)
    final = events[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == ["reasoning", "message"]
    assert final.response.output[0].content[0].text == done.text  # type: ignore[union-attr]


@pytest.mark.slow
def test_follow_up_keeps_the_reasoning_turn(client: openai.OpenAI) -> None:
    first = client.responses.create(
        input="Hello", max_output_tokens=160, extra_body={"grammar": THINKING}
    )
    # Sent back as clients do: the previous output items, the reasoning item among them.
    items: list[Any] = [
        {"role": "user", "content": "Hello"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": "Again"},
    ]
    second = client.responses.create(input=items, max_output_tokens=5)
    assert second.status in ("completed", "incomplete")
    chained = client.responses.create(
        input="Again", previous_response_id=first.id, max_output_tokens=5
    )
    assert chained.usage is not None and second.usage is not None
    assert chained.usage.input_tokens == second.usage.input_tokens


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_chat_usage_counts_reasoning_tokens(client: openai.OpenAI, stream: bool) -> None:
    body: dict[str, Any] = {
        "model": "default",
        "messages": HELLO,
        "max_tokens": 160,
        "extra_body": {"grammar": THINKING},
    }
    if stream:
        chunks = list(
            client.chat.completions.create(
                **body, stream=True, stream_options={"include_usage": True}
            )
        )
        usage = chunks[-1].usage
        thought = "".join(
            getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks[:-1]
        )
    else:
        answer = client.chat.completions.create(**body)
        usage = answer.usage
        thought = answer.choices[0].message.reasoning_content  # type: ignore[attr-defined]
    assert usage is not None and usage.completion_tokens_details is not None
    assert _alpha(thought)
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens


@pytest.mark.slow
def test_stateless_clients_get_reasoning_back_through_encrypted_content(
    client: openai.OpenAI,
) -> None:
    first = client.responses.create(
        input="Hello",
        store=False,
        include=["reasoning.encrypted_content"],
        max_output_tokens=160,
        extra_body={"grammar": THINKING},
    )
    thought = first.output[0]
    assert thought.type == "reasoning" and thought.content is not None
    assert thought.encrypted_content == thought.content[0].text
    # Sent back with only the opaque part, as Codex-style clients do.
    opaque = {"type": "reasoning", "summary": [], "encrypted_content": thought.encrypted_content}
    items: list[Any] = [
        {"role": "user", "content": "Hello"},
        opaque,
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Again"},
    ]
    messages = chat_messages(ResponsesRequest.model_validate({"input": items}).input)
    assert messages[1]["reasoning_content"] == thought.encrypted_content
    again = client.responses.create(input=items, store=False, max_output_tokens=5)
    assert again.status in ("completed", "incomplete")
