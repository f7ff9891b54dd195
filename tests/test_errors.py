"""Every failure answers in one envelope with the right status, and the server keeps serving."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hi"}]


def assert_envelope(response: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_
    assert error["message"]
    assert "Traceback" not in response.text
    return dict(error)


@pytest.fixture
def http(server: ServerProcess) -> httpx.Client:
    return server.http()


def test_malformed_json(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_envelope(response, 400, "invalid_request_error")


def test_schema_violation_names_the_field(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"messages": HELLO, "temperature": "hot"})
    assert assert_envelope(response, 400, "invalid_request_error")["param"] == "temperature"
    response = http.post("/v1/chat/completions", json={"messages": []})
    assert assert_envelope(response, 400, "invalid_request_error")["param"] == "messages"
    response = http.post("/v1/completions", json={})
    assert assert_envelope(response, 400, "invalid_request_error")["param"] == "prompt"


def test_a_value_no_member_of_a_union_takes_is_named_by_its_field(http: httpx.Client) -> None:
    """pydantic puts the union's member in an error's path ('stop.str'): the param is the
    field the client sent, and the message says what every member wanted."""
    for url, body, param, wanted in (
        ("/v1/chat/completions", {"messages": HELLO, "stop": 5}, "stop", "string or a valid list"),
        ("/v1/chat/completions", {"messages": HELLO, "tool_choice": 5}, "tool_choice", "'auto'"),
        ("/v1/completions", {"prompt": {}}, "prompt", "string or a valid list"),
    ):
        error = assert_envelope(http.post(url, json=body), 400, "invalid_request_error")
        assert error["param"] == param, error
        assert error["message"].startswith(f"'{param}': "), error
        assert wanted in error["message"], error
    # The member that got furthest into the value says what is wrong, under its own path.
    forced = {"type": "function", "function": {"name": 5}}
    response = http.post("/v1/chat/completions", json={"messages": HELLO, "tool_choice": forced})
    assert assert_envelope(response, 400, "invalid_request_error")["param"] == (
        "tool_choice.function.name"
    )
    # The Messages API says it in its own envelope.
    body = {"max_tokens": 5, "messages": HELLO, "system": 5}
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "'system': Input should be a valid string or a valid list"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tool_choice", "required"),
        ("made_up_field", 1),
    ],
)
def test_unimplemented_fields_get_400_naming_them(
    http: httpx.Client, field: str, value: object
) -> None:
    response = http.post("/v1/chat/completions", json={"messages": HELLO, field: value})
    error = assert_envelope(response, 400, "invalid_request_error")
    assert error["param"] == field
    assert field in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias.0.1"),
        ({"prompt": "x", "logit_bias": {"5": "high"}}, "logit_bias.0.1"),
        ({"prompt": "x", "logit_bias": [[5, True]]}, "logit_bias.0.1"),
        ({"prompt": "x", "logit_bias": [[5]]}, "logit_bias.0.1"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ],
)
def test_completions_reject_bad_fields(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    response = http.post("/v1/completions", json=body)
    assert assert_envelope(response, 400, "invalid_request_error")["param"] == param


def test_chat_rejects_inconsistent_fields(http: httpx.Client) -> None:
    for body, param in (
        ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": HELLO, "continue_final_message": True}, "continue_final_message"),
    ):
        response = http.post("/v1/chat/completions", json=body)
        assert assert_envelope(response, 400, "invalid_request_error")["param"] == param


def test_token_ids_outside_the_vocabulary(http: httpx.Client) -> None:
    for body in (
        {"prompt": [1, 2, 10_000_000]},
        {"prompt": "x", "logit_bias": {"10000000": 5}},
        {"prompt": "x", "stop_token_ids": [-1]},
    ):
        response = http.post("/v1/completions", json=body)
        assert_envelope(response, 400, "invalid_request_error")


def test_omitted_model_means_the_loaded_one(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2})
    assert response.status_code == 200
    model_id = http.get("/v1/models").json()["data"][0]["id"]
    assert response.json()["model"] == model_id
    named = http.post("/v1/completions", json={"model": model_id, "prompt": "a", "max_tokens": 1})
    assert named.status_code == 200


def test_prompt_longer_than_context(http: httpx.Client) -> None:
    long_prompt = "word " * 5000
    response = http.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 1})
    error = assert_envelope(response, 400, "invalid_request_error")
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    response = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": long_prompt}], "stream": True},
    )
    error = assert_envelope(response, 400, "invalid_request_error")
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")


def test_body_too_large(http: httpx.Client) -> None:
    big = b'{"prompt": "' + b"a" * (33 * 1024 * 1024) + b'"}'
    response = http.post(
        "/v1/completions", content=big, headers={"content-type": "application/json"}
    )
    assert_envelope(response, 413, "invalid_request_error")


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_envelope(http.get("/v1/nothing-here"), 404, "invalid_request_error")
    assert_envelope(http.get("/v1/chat/completions"), 405, "invalid_request_error")


def test_a_405_allows_every_method_of_the_path(http: httpx.Client) -> None:
    """Starlette named the first route whose path matched: OPTIONS /models/load said only GET
    (of /models/{model}), though POST loads a model there."""
    for method in ("OPTIONS", "PUT", "DELETE"):
        response = http.request(method, "/models/load")
        assert_envelope(response, 405, "invalid_request_error")
        assert response.headers["allow"] == "GET, POST", method
    assert http.request("PUT", "/v1/chat/completions").headers["allow"] == "POST"


def test_server_still_serves_after_errors(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="default", messages=HELLO, max_tokens=3)
    assert response.choices[0].message.content is not None


def test_form_encoded_json_is_read_as_json(http: httpx.Client) -> None:
    body = b'{"prompt": "Hello", "max_tokens": 2}'
    for content_type in ("application/x-www-form-urlencoded", "text/plain"):
        response = http.post(
            "/v1/completions", content=body, headers={"content-type": content_type}
        )
        assert response.status_code == 200, response.text
