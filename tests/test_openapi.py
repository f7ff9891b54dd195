"""/openapi.json is truthful: schemathesis sends what it documents, and every answer is a
status it lists, in the content type and schema it gives, never a server error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.conftest import serving
from tests.openapi_check import check_operations
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

KEY = "openapi-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# Cases per operation: the whole run takes about a minute on two cores.
EXAMPLES = 6


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a key, a short context and two slots."""
    yield from serving(
        tmp_path_factory, "openapi", "--api-key", KEY, "--ctx-size", "512", "-np", "2", "-n", "4"
    )


def test_every_operation_answers_as_documented(keyed: ServerProcess) -> None:
    """A bounded schemathesis run over every operation, with the key and (ignored_auth)
    without it."""
    assert check_operations(keyed.root, AUTH, EXAMPLES) >= 20
    with keyed.http(headers=AUTH) as http:
        assert http.get("/health").status_code == 200
        assert http.post("/tokenize", json={"content": "still answering"}).status_code == 200


def test_the_document_is_behind_the_key(keyed: ServerProcess) -> None:
    with keyed.http() as http:
        assert http.get("/openapi.json").status_code == 401
        document = http.get("/openapi.json", headers=AUTH).json()
    assert set(document["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert "HTTPValidationError" not in document["components"]["schemas"]
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert "422" not in chat["responses"]
    assert {"400", "401", "403", "404", "413", "503"} <= set(chat["responses"])
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    responses = document["components"]["schemas"]["ResponsesRequest"]["properties"]
    assert not {"max_tokens", "n", "background"} & set(responses)
    assert document["paths"]["/metrics"]["get"]["responses"]["200"]["content"] == {
        "text/plain": {"schema": {"type": "string", "description": "Prometheus text"}}
    }


def test_the_document_holds_what_this_server_serves(keyed: ServerProcess) -> None:
    """A route for a kind of model the server does not have answers 400 to every request:
    the document of a chat-only server leaves those routes out instead of calling their
    requests valid (schemathesis found ~4,100 such refusals)."""
    with keyed.http(headers=AUTH) as http:
        document = http.get("/openapi.json").json()
        paths = document["paths"]
        assert {"/v1/chat/completions", "/completion", "/tokenize", "/v1/messages"} <= set(paths)
        for path in ("/v1/embeddings", "/v1/rerank", "/v1/audio/speech", "/v1/images/edits"):
            assert path not in paths
            assert http.post(path, json={}).status_code == 400


def test_prompts_and_token_ids_are_documented_as_the_routes_check_them(
    keyed: ServerProcess,
) -> None:
    """An empty prompt and a negative token id are refused (400): the document says so."""
    with keyed.http(headers=AUTH) as http:
        schemas = http.get("/openapi.json").json()["components"]["schemas"]
        for body, valid in (
            ({"prompt": ""}, False),
            ({"prompt": []}, False),
            ({"prompt": [-1]}, False),
            ({"prompt": ["Hi", ""]}, False),
            ({"prompt": "Hi"}, True),
            ({"prompt": [1, 2]}, True),
        ):
            documented = _valid(schemas, "NativeCompletionRequest", body)
            assert documented == valid, body
            answered = http.post("/completion", json={**body, "n_predict": 1}).status_code
            assert answered == (200 if valid else 400), (body, answered)
        assert not _valid(schemas, "DetokenizeRequest", {"tokens": [-5]})
        assert http.post("/detokenize", json={"tokens": [-5]}).status_code == 400


def _valid(schemas: dict[str, Any], model: str, body: dict[str, Any]) -> bool:
    """Whether `body` is valid against the document's schema of `model`."""
    schema = {**schemas[model], "components": {"schemas": schemas}}
    return jsonschema.Draft202012Validator(schema).is_valid(body)


def test_public_openapi_serves_it_without_the_key(tmp_path_factory: pytest.TempPathFactory) -> None:
    for proc in serving(tmp_path_factory, "public", "--api-key", KEY, "--public-openapi"):
        with proc.http() as http:
            assert http.get("/openapi.json").status_code == 200
            assert http.get("/v1/models").status_code == 401


def test_without_a_key_nothing_claims_security(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    assert all(
        "security" not in operation
        for operations in document["paths"].values()
        for operation in operations.values()
    )
