"""Clients keep their code: routes without /v1, any model name, CORS, llama-server's flags.

Each over HTTP with the client that sends it: LangChain's ChatOpenAI at its defaults (model
gpt-3.5-turbo, base URL without /v1), the openai SDK (models.retrieve, LiteLLM-style hard-coded
names), raw httpx for CORS preflights.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from tests.conftest import serving
from tests.server_process import ServerProcess
from tests.test_cut_calls import WEATHER

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hi"}]
KEY = "sesame"
APP = "http://app.example:3000"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Strict names, two aliases (one a hub-style id), an API key, CORS for one origin."""
    yield from serving(
        tmp_path_factory,
        "guarded",
        "--strict-model-names",
        "--alias",
        "smol,tiny/smol-135m",
        "--api-key",
        KEY,
        "--cors-origins",
        f"{APP}/,http://other.example",
    )


@pytest.fixture(scope="module")
def loose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """CORS for any origin, a server seed, and llama.cpp's load and attention flags."""
    yield from serving(
        tmp_path_factory,
        "loose",
        "--cors-origins",
        "*",
        "-s",
        "7",
        "-fa",
        "off",
        "--no-mmap",
        "--mlock",
        "-ngl",
        "0",
        "--log-level",
        "debug",
    )


def _served_name(server: ServerProcess) -> str:
    with server.http() as http:
        name: str = http.get("/v1/models").json()["data"][0]["id"]
    return name


def test_openai_routes_answer_without_v1(server: ServerProcess) -> None:
    bare = openai.OpenAI(base_url=server.root, api_key="x", max_retries=0)
    assert bare.models.list().data[0].id == _served_name(server)
    chat = bare.chat.completions.create(model="default", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert chat.object == "chat.completion"
    text = bare.completions.create(model="default", prompt="1, 2,", max_tokens=2)
    assert text.object == "text_completion" and text.choices[0].text is not None
    response = bare.responses.create(model="default", input="hi", max_output_tokens=16, store=True)
    assert bare.responses.retrieve(response.id).id == response.id
    with server.http() as http:
        native = http.post("/completion", json={"prompt": "1, 2,", "n_predict": 2}).json()
        assert "content" in native and "choices" not in native


def test_models_retrieve_by_id(server: ServerProcess) -> None:
    name = _served_name(server)
    for base_url in (server.base_url, server.root):
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        model = client.models.retrieve(name)
        assert (model.id, model.object, model.owned_by) == (name, "model", "mlxcel")
    with pytest.raises(openai.NotFoundError):
        server.openai().models.retrieve("gpt-4o")


def test_system_fingerprint_in_chat_and_completion_objects(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model="default", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    text = client.completions.create(model="default", prompt="1, 2,", max_tokens=2)
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=HELLO,  # type: ignore[arg-type]
            max_tokens=2,
            stream=True,
        )
    )
    fingerprint = chat.system_fingerprint
    assert fingerprint and re.fullmatch(r"mlxcel-\S+-llama\.cpp-\S+", fingerprint)
    assert text.system_fingerprint == fingerprint
    assert {c.system_fingerprint for c in chunks} == {fingerprint}


def test_a_hard_coded_model_name_is_served_by_the_one_model(server: ServerProcess) -> None:
    name = _served_name(server)
    client = server.openai()
    for asked in ("gpt-3.5-turbo", "gpt-4o", "openai/gpt-4o-mini"):
        chat = client.chat.completions.create(model=asked, messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
        assert chat.model == name
    text = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="1,", max_tokens=2)
    assert text.model == name
    logged = [line for line in server.log().splitlines() if "'gpt-4o' are served by" in line]
    assert len(logged) == 1


def test_langchain_chat_openai_at_its_defaults(server: ServerProcess) -> None:
    llm = ChatOpenAI(base_url=server.root, api_key="x", max_retries=0, max_tokens=4)  # type: ignore[arg-type]
    assert llm.model_name == "gpt-3.5-turbo"
    reply = llm.invoke("hi")
    assert isinstance(reply.content, str)
    assert reply.response_metadata["model_name"] == _served_name(server)
    assert reply.response_metadata["system_fingerprint"].startswith("mlxcel-")
    streamed = list(llm.stream("hi"))
    assert streamed and all(isinstance(chunk.content, str) for chunk in streamed)
    caller = llm.bind_tools([WEATHER], tool_choice="get_weather", max_tokens=60)
    forced = caller.invoke("Weather in Paris?")
    assert [(call["name"], call["args"]) for call in forced.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_strict_names_404_with_the_served_names(guarded: ServerProcess) -> None:
    client = openai.OpenAI(base_url=guarded.base_url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=HELLO)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found"
    assert "smol, tiny/smol-135m" in error["message"]
    for alias in ("smol", "tiny/smol-135m"):
        chat = client.chat.completions.create(model=alias, messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
        assert chat.model == "smol"


def test_aliases_are_listed_and_retrieved(guarded: ServerProcess) -> None:
    client = openai.OpenAI(base_url=guarded.root, api_key=KEY, max_retries=0)
    [listed] = client.models.list().data
    assert listed.id == "smol" and listed.model_extra == {
        **(listed.model_extra or {}),
        "aliases": ["smol", "tiny/smol-135m"],
        "tags": [],
    }
    assert client.models.retrieve("tiny/smol-135m").id == "smol"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("tiny/other")


def _preflight(
    server: ServerProcess, origin: str, path: str = "/v1/chat/completions"
) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang",
    }
    with server.http() as http:
        return http.options(path, headers=headers)


def test_cors_preflight_for_a_listed_origin(guarded: ServerProcess) -> None:
    for path in ("/v1/chat/completions", "/chat/completions", "/v1/models"):
        response = _preflight(guarded, APP, path)
        assert response.status_code == 204, response.text
        headers = response.headers
        assert headers["access-control-allow-origin"] == APP
        assert headers["access-control-allow-credentials"] == "true"
        assert "Origin" in headers["vary"]
        assert {m.strip() for m in headers["access-control-allow-methods"].split(",")} >= {
            "GET",
            "POST",
            "OPTIONS",
        }
        allowed = {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
        assert allowed >= {"authorization", "x-api-key", "content-type", "x-stainless-lang"}
    refused = _preflight(guarded, "http://evil.example")
    assert refused.status_code == 403
    assert "access-control-allow-origin" not in refused.headers


def test_cors_requests_still_need_the_key(guarded: ServerProcess) -> None:
    with guarded.http(headers={"Origin": APP}) as http:
        unkeyed = http.get("/v1/models")
        keyed = http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        elsewhere = http.get(
            "/v1/models", headers={"Origin": "http://evil.example", "X-Api-Key": KEY}
        )
    assert unkeyed.status_code == 401
    assert unkeyed.headers["access-control-allow-origin"] == APP  # the browser may read the 401
    assert keyed.status_code == 200 and keyed.headers["access-control-allow-origin"] == APP
    # Another origin is refused whatever the key: a page elsewhere cannot drive the server.
    assert elsewhere.status_code == 403
    assert elsewhere.json()["error"]["code"] == "cors_origin_not_allowed"
    assert "access-control-allow-origin" not in elsewhere.headers


def test_cors_any_origin_never_allows_credentials(loose: ServerProcess) -> None:
    response = _preflight(loose, "https://anywhere.example")
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in response.headers
    with loose.http(headers={"Origin": "https://anywhere.example"}) as http:
        answer = http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in answer.headers


def test_cors_is_off_by_default(server: ServerProcess) -> None:
    assert _preflight(server, APP).status_code == 403
    with server.http(headers={"Origin": APP}) as http:
        refused = http.get("/v1/models")
    assert refused.status_code == 403
    assert "access-control-allow-origin" not in refused.headers


def test_server_seed_is_a_request_without_one(loose: ServerProcess) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.5, "top_k": 0}
    with loose.http() as http:
        texts = [
            http.post("/v1/completions", json={**body, **seed}).json()["choices"][0]["text"]
            for seed in ({}, {"seed": 7}, {})
        ]
        native = http.post("/completion", json={"prompt": "x", "n_predict": 1}).json()
    assert texts[0] == texts[1] == texts[2]
    assert native["generation_settings"]["seed"] == 7


def test_llama_cpp_load_and_attention_flags_take_effect(loose: ServerProcess) -> None:
    log = loose.log()
    assert re.search(r"load_mode = mlock\b", log), log[-3000:]
    assert re.search(r"flash_attn\s*=\s*disabled", log), log[-3000:]
