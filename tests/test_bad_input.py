"""Bad input is a 400 in the envelope before any work: invalid Unicode on every route, empty
prompt lists, JSON and schema nesting and size limits, invalid tool schemas, and prompts far
beyond the context refused from their size."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess

USER = [{"role": "user", "content": "Hi"}]
# Each text route, with a body whose one string field takes the bad text.
ROUTES: list[tuple[str, Any]] = [
    ("/v1/chat/completions", lambda t: {"messages": [{"role": "user", "content": t}]}),
    (
        "/v1/chat/completions",
        lambda t: {"messages": [{"role": "user", "content": t}], "stream": True},
    ),
    ("/v1/completions", lambda t: {"prompt": t}),
    ("/completion", lambda t: {"prompt": t}),
    ("/v1/responses", lambda t: {"input": t}),
    ("/tokenize", lambda t: {"content": t}),
    ("/apply-template", lambda t: {"messages": [{"role": "user", "content": t}]}),
    ("/v1/chat/completions/input_tokens", lambda t: {"messages": [{"role": "user", "content": t}]}),
    (
        "/v1/messages",
        lambda t: {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": t}]},
    ),
    ("/v1/images/generations", lambda t: {"prompt": t}),
]
# A lone surrogate as JSON writes it escaped (its raw bytes are invalid UTF-8).
ESCAPED = "\\ud800"


def _post_raw(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"Content-Type": "application/json"})


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    error: dict[str, Any] = body["error"]
    return error


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_a_lone_surrogate_is_a_400_on_every_route(http: httpx.Client, path: str, body: Any) -> None:
    marker = "MARKER"
    text = json.dumps(body(marker))
    escaped = text.replace(marker, ESCAPED).encode()
    raw = text.replace(marker, "").encode()
    raw = raw.replace(b'""', b'"\xed\xa0\x80"', 1)
    for data, code in ((escaped, "invalid_unicode"), (raw, "invalid_utf8")):
        response = _post_raw(http, path, data)
        assert response.status_code == 400, (path, data, response.text)
        if path == "/v1/messages":
            assert response.json()["type"] == "error"
        else:
            assert _error(response)["code"] == code


def test_a_surrogate_pair_is_text(http: httpx.Client) -> None:
    body = b'{"content": "\\ud83d\\ude00", "with_pieces": true}'
    response = _post_raw(http, "/tokenize", body)
    assert response.status_code == 200, response.text


def test_a_surrogate_in_a_key_is_named(http: httpx.Client) -> None:
    body = b'{"messages": [{"role": "user", "content": "x"}], "metadata": {"\\udfff": "v"}}'
    response = _post_raw(http, "/v1/chat/completions", body)
    assert response.status_code == 400 and _error(response)["param"] == "metadata"


@pytest.mark.parametrize("prompt", [[], [[]], ""])
def test_an_empty_prompt_is_a_400(http: httpx.Client, prompt: Any) -> None:
    response = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert response.status_code == 400, response.text
    assert _error(response)["param"] == "prompt"


@pytest.mark.parametrize("depth", [65, 5000, 200_000])
def test_deep_nesting_is_a_400_naming_the_limit(http: httpx.Client, depth: int) -> None:
    body = b'{"messages": [], "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    response = _post_raw(http, "/v1/chat/completions", body)
    assert response.status_code == 400
    error = _error(response)
    assert error["code"] == "json_too_deep" and "64 levels" in error["message"]


@pytest.mark.parametrize(
    "field",
    [
        lambda s: {
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
        },
        lambda s: {"json_schema": s},
        lambda s: {"tools": [{"type": "function", "function": {"name": "f", "parameters": s}}]},
    ],
)
def test_a_schema_past_the_limits_is_a_400(http: httpx.Client, field: Any) -> None:
    deep = http.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 1, **field(_nested_schema(21))},
    )
    assert deep.status_code == 400, deep.text
    assert _error(deep)["code"] == "json_schema_too_deep" and "40 levels" in _error(deep)["message"]
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(12_000)}}
    large = http.post(
        "/v1/chat/completions", json={"messages": USER, "max_tokens": 1, **field(wide)}
    )
    assert large.status_code == 400, large.text
    assert _error(large)["code"] == "json_schema_too_large"
    fine = http.post(
        "/v1/chat/completions", json={"messages": USER, "max_tokens": 1, **field(_nested_schema(5))}
    )
    assert fine.status_code == 200, fine.text


def test_invalid_tool_parameters_are_a_400_even_unforced(http: httpx.Client) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]
    for choice in ("auto", "none"):
        body = {"messages": USER, "max_tokens": 1, "tools": tools, "tool_choice": choice}
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = _error(response)
        assert error["code"] == "invalid_json_schema"
        assert error["param"] == "tools.0.function.parameters"


def test_a_prompt_far_beyond_the_context_is_refused_from_its_size(
    server: ServerProcess, http: httpx.Client
) -> None:
    # 8 MB: the context is 2048 tokens and no token of the model stands for 1 KB.
    text = "word " * 1_600_000
    for path, body in (
        ("/v1/completions", {"prompt": text, "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
        ("/v1/responses", {"input": text}),
        ("/tokenize", {"content": text}),
    ):
        response = http.post(path, json=body)
        assert response.status_code == 400, (path, response.text)
        error = _error(response)
        assert error["code"] == "context_length_exceeded" and "bytes" in error["message"]
    assert (
        http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1}).status_code
        == 200
    )
