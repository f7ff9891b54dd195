"""Structured outputs: JSON that validates, whatever the (tiny) model would rather say."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

CAT = [{"role": "user", "content": "Describe a cat."}]
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0},
            "indoor": {"type": "boolean"},
        },
        "required": ["name", "age", "indoor"],
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["black", "white", "orange"]},
            "toys": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        },
        "required": ["color", "toys"],
    },
    {
        "type": "object",
        "properties": {
            "owner": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "pets": {"type": "integer"},
                },
                "required": ["name", "pets"],
            },
            "scores": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
        },
        "required": ["owner", "scores"],
    },
]


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.parametrize("schema", SCHEMAS)
def test_chat_output_validates_against_the_schema(
    client: openai.OpenAI, schema: dict[str, Any]
) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=CAT,
        max_tokens=200,
        temperature=0.8,
        seed=3,
        response_format=_format(schema),  # type: ignore[arg-type]
    )
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].message.content or ""), schema)


# Keywords a GBNF conversion tends to drop (llama-cpp-python's ignores all of these): numeric
# bounds, string lengths with patterns, exclusive minimums and item counts.
BOUNDED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "temp": {"type": "number", "exclusiveMinimum": -50, "maximum": 60},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "nick": {"type": "string", "minLength": 2, "maxLength": 5},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["days", "temp", "code", "nick", "tags"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", range(4))
def test_bounds_and_lengths_hold_at_high_temperature(client: openai.OpenAI, seed: int) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=CAT,
        max_tokens=200,
        temperature=1.5,
        seed=seed,
        response_format=_format(BOUNDED),  # type: ignore[arg-type]
    )
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].message.content or ""), BOUNDED)


def test_streamed_output_validates_too(client: openai.OpenAI) -> None:
    chunks = client.chat.completions.create(
        model="default",
        messages=CAT,
        max_tokens=200,
        temperature=0,
        stream=True,
        response_format=_format(SCHEMAS[1]),  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMAS[1])


def test_json_object_mode(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(response.choices[0].message.content or ""), dict)


class Pet(BaseModel):
    name: str = Field(max_length=12)
    kind: Literal["cat", "dog", "bird"]
    legs: int


def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model="default", messages=CAT, max_tokens=150, temperature=0, response_format=Pet
    )
    pet = completion.choices[0].message.parsed
    assert isinstance(pet, Pet)


def test_responses_parse_with_text_format(client: openai.OpenAI) -> None:
    response = client.responses.parse(
        model="default",
        input="Describe a pet.",
        max_output_tokens=150,
        temperature=0,
        text_format=Pet,
    )
    assert isinstance(response.output_parsed, Pet)


def test_llama_server_json_schema_and_grammar_fields(server: ServerProcess) -> None:
    with server.http() as http:
        body = {"prompt": "A cat:", "max_tokens": 150, "temperature": 0, "json_schema": SCHEMAS[0]}
        text = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
        jsonschema.validate(json.loads(text), SCHEMAS[0])
        grammar = 'root ::= ("yes" | "no") "."'
        answer = http.post(
            "/v1/chat/completions",
            json={"messages": CAT, "max_tokens": 10, "grammar": grammar},
        ).json()["choices"][0]["message"]["content"]
        assert answer in ("yes.", "no.")
        native = http.post(
            "/completion", json={"prompt": "Is it?", "n_predict": 10, "grammar": grammar}
        ).json()
        assert native["content"] in ("yes.", "no.")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "grammar"),
        ({"grammar": "this is not gbnf"}, "grammar"),
        # A keyword the grammar engine cannot enforce is refused, never silently dropped.
        ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
                }
            },
            "response_format",
        ),
    ],
)
def test_bad_constraints_are_400(
    server: ServerProcess, body: dict[str, Any], param: str | None
) -> None:
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={"messages": CAT, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    with server.http() as http:
        assert http.get("/health").status_code == 200


def test_masked_alternatives_have_finite_logprobs(server: ServerProcess) -> None:
    """A grammar-masked alternative's logprob is -inf, which JSON cannot carry (it was a 500):
    OpenAI's -9999.0, on every route that returns logprobs."""
    schema = SCHEMAS[0]
    chat = {
        "messages": CAT,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 20,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    }
    with server.http() as http:
        answer = http.post("/v1/chat/completions", json=chat)
        streamed = http.post("/v1/chat/completions", json={**chat, "stream": True})
        text = http.post(
            "/v1/completions",
            json={"prompt": "A cat:", "max_tokens": 8, "logprobs": 20, "json_schema": schema},
        )
    assert answer.status_code == streamed.status_code == text.status_code == 200, answer.text
    tokens = answer.json()["choices"][0]["logprobs"]["content"]
    values = [top["logprob"] for t in tokens for top in t["top_logprobs"]]
    assert min(values) == -9999.0  # the schema masks most of the 20 at '{'
    assert "-Infinity" not in streamed.text and "NaN" not in streamed.text
    alternatives = text.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert min(lp for top in alternatives for lp in top.values()) >= -9999.0
