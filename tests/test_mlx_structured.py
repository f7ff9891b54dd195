"""Structured outputs on the MLX engine (llguidance), over real HTTP, on a tiny random model.

Random weights produce garbage unless constrained, so every valid answer here is the grammar's
doing, not the model's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

pytest.importorskip("mlx_lm")

from tests.conftest import LLAMA_DIR, serving
from tests.server_process import ServerProcess
from tests.test_tools import WEATHER

pytestmark = pytest.mark.slow

CAT = [{"role": "user", "content": "Describe a cat."}]
PET: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 10},
                "indoor": {"type": "boolean"},
            },
            "required": ["name", "indoor"],
        },
        "toys": {
            "type": "array",
            "items": {"type": "string", "maxLength": 8},
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["name", "kind", "owner", "toys"],
}


@pytest.fixture(scope="module")
def mlx_server(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(
        tmp_path_factory,
        "mlx-structured",
        *("-m", str(models / LLAMA_DIR), "--backend", "mlx", "--parallel", "2", "-c", "4096"),
    )


@pytest.fixture(scope="module")
def client(mlx_server: ServerProcess) -> openai.OpenAI:
    return mlx_server.openai()


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def _pet(client: openai.OpenAI, **kwargs: Any) -> openai.types.chat.ChatCompletion:
    kwargs = {"model": "default", "messages": CAT, "max_tokens": 300, **kwargs}
    return client.chat.completions.create(response_format=_format(PET), **kwargs)  # type: ignore[no-any-return]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_validates(client: openai.OpenAI, seed: int) -> None:
    response = _pet(client, temperature=1.0, seed=seed)
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].message.content or ""), PET)


def test_streamed_json_schema_output_validates(client: openai.OpenAI) -> None:
    chunks = client.chat.completions.create(
        model="default",
        messages=CAT,  # type: ignore[arg-type]
        max_tokens=300,
        temperature=0,
        stream=True,
        response_format=_format(PET),  # type: ignore[arg-type]
    )
    choices = [c.choices[0] for c in chunks if c.choices]
    jsonschema.validate(json.loads("".join(c.delta.content or "" for c in choices)), PET)
    assert choices[-1].finish_reason == "stop"


def test_the_grammar_composes_with_the_other_samplers(
    client: openai.OpenAI, mlx_server: ServerProcess
) -> None:
    # A bias that would force a token the grammar forbids first: the grammar comes first.
    with mlx_server.http() as http:
        brace = http.post("/tokenize", json={"content": "}"}).json()["tokens"][-1]
    response = _pet(
        client,
        temperature=0.9,
        top_p=0.8,
        seed=5,
        presence_penalty=1.5,
        frequency_penalty=1.0,
        logit_bias={str(brace): 100},
        extra_body={"top_k": 20, "min_p": 0.05, "dry_multiplier": 0.8, "xtc_probability": 0.5},
    )
    jsonschema.validate(json.loads(response.choices[0].message.content or ""), PET)


def test_json_object_mode(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=300,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(response.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("seed", range(4))
def test_gbnf_grammar_on_completions(client: openai.OpenAI, seed: int) -> None:
    choice = client.completions.create(
        model="default",
        prompt="Is the sky blue?",
        max_tokens=10,
        temperature=1.5,
        seed=seed,
        extra_body={"grammar": 'root ::= "yes" | "no"'},
    ).choices[0]
    assert choice.text in ("yes", "no")
    assert choice.finish_reason == "stop"


def test_required_tool_choice_makes_a_valid_call(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=120,
        temperature=0.7,
        seed=4,
        parallel_tool_calls=False,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
    function = choice.message.tool_calls[0].function  # type: ignore[union-attr]
    assert function.name == "get_weather"
    jsonschema.validate(json.loads(function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]


def test_invalid_constraints_are_400s(mlx_server: ServerProcess) -> None:
    cases = [
        # Caught by the meta-schema check before the engine sees it.
        {"response_format": _format({"type": "nonsense"})},
        # Valid JSON Schema that llguidance cannot enforce (an external reference).
        {"response_format": _format({"$ref": "https://example.com/schema.json"})},
        # GBNF naming a rule it never defines.
        {"grammar": "root ::= answer"},
    ]
    with mlx_server.http() as http:
        for fields in cases:
            response = http.post(
                "/v1/chat/completions", json={"messages": CAT, "max_tokens": 10, **fields}
            )
            assert response.status_code == 400, fields
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        # The engine is still serving afterwards.
        after = http.post("/v1/chat/completions", json={"messages": CAT, "max_tokens": 2})
        assert after.status_code == 200


def test_constrained_and_unconstrained_run_together(client: openai.OpenAI) -> None:
    def free() -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model="default",
            messages=CAT,  # type: ignore[arg-type]
            max_tokens=40,
            temperature=0,
            extra_body={"ignore_eos": True},
        )

    with ThreadPoolExecutor(2) as pool:
        constrained = pool.submit(_pet, client, temperature=0.8, seed=9)
        unconstrained = pool.submit(free)
        pet, text = constrained.result(), unconstrained.result()
    jsonschema.validate(json.loads(pet.choices[0].message.content or ""), PET)
    assert text.choices[0].finish_reason == "length"
    assert text.usage is not None and text.usage.completion_tokens == 40
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.choices[0].message.content or "")


def test_a_reused_prompt_prefix_does_not_confuse_the_grammar(client: openai.OpenAI) -> None:
    first = _pet(client, temperature=0)
    again = _pet(client, temperature=0)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert (again.usage.prompt_tokens_details.cached_tokens or 0) > 0
    assert again.choices[0].message.content == first.choices[0].message.content
    jsonschema.validate(json.loads(again.choices[0].message.content or ""), PET)
