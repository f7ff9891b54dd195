"""Ollama's API over HTTP with the official `ollama` client, and its NDJSON framing with httpx.

One server with an API key serves several models from a config file: the default model twice
(once behind a template that opens <think>), and on demand a tiny GGUF with FIM tokens, a tiny
GGUF with a vision projector and MiniLM; the real tool model (Qwen2.5-Coder-0.5B) on a server
of its own for the slow tool-call test. Only
structure, agreement with the same server's OpenAI and llama-server routes, and forced output
are asserted, never a model's words.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import ollama
import pytest
from bench.models import SHAPES, tiny
from bench.vision_models import VisionShape
from bench.vision_models import build as build_projector

from mlxcel.weights import default_model_path
from tests.cached_data import coder_gguf
from tests.conftest import serving
from tests.media_util import image_bytes
from tests.server_process import ServerProcess, free_port

KEY = "ollama-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEMPLATE = Path(__file__).parent / "data" / "ollama_thinking.jinja"
GREEDY = {"temperature": 0, "num_predict": 8}
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
COUNTERS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, fim_gguf: Path, tiny_gguf: Path
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ollama-models")
    projector = build_projector(VisionShape(tiny(SHAPES["smollm2-135m"]).hidden), root)
    config = root / "models.yaml"
    config.write_text(
        "models:\n"
        f"  - {{model: {default_model_path()}, name: smol, ctx_size: 1024}}\n"
        f"  - {{model: {default_model_path()}, name: thinker, ctx_size: 1024,"
        f" chat_template_file: {TEMPLATE}}}\n"
        f"  - {{model: {fim_gguf}, name: fim, ctx_size: 512, on_demand: true}}\n"
        f"  - {{model: {tiny_gguf}, name: vision, mmproj: {projector}, ctx_size: 512,"
        f" on_demand: true}}\n"
        "  - {model: default, kind: embedding, name: minilm, on_demand: true}\n"
    )
    port = str(free_port())
    yield from serving(
        tmp_path_factory, "ollama", "--config", str(config), "--api-key", KEY, "--ollama-port", port
    )


@pytest.fixture(scope="module")
def client(served: ServerProcess) -> ollama.Client:
    return ollama.Client(host=served.root, headers=AUTH)


@pytest.fixture
def http(served: ServerProcess) -> Iterator[httpx.Client]:
    with served.http(headers=AUTH) as client:
        yield client


def _lines(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed answer's NDJSON lines, each checked to be one JSON object."""
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        text = response.read().decode()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    message: str = body["error"]
    return message


def test_version_list_show_and_ps(client: ollama.Client, http: httpx.Client) -> None:
    assert http.get("/api/version").json()["version"].count(".") == 2
    listed = {m.model: m for m in client.list().models}
    assert {"smol:latest", "thinker:latest", "fim:latest", "minilm:latest"} <= set(listed)
    smol = listed["smol:latest"]
    assert smol.details is not None and smol.size and smol.digest and smol.modified_at
    assert (smol.details.format, smol.details.family) == ("gguf", "llama")
    assert smol.details.quantization_level == "Q4_1" and smol.details.parameter_size

    shown = client.show("smol")  # with or without :latest
    assert shown.capabilities == ["completion"]
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 1024
    assert shown.template and "temperature" in (shown.parameters or "")
    assert "thinking" in (client.show("thinker:latest").capabilities or [])
    assert "insert" in (client.show("fim").capabilities or [])
    assert client.show("minilm").capabilities == ["embedding"]

    running = {m.model: m for m in client.ps().models}
    assert running["smol:latest"].context_length == 1024
    assert running["smol:latest"].size and running["smol:latest"].expires_at


def test_chat_whole_and_streamed_agree(client: ollama.Client) -> None:
    whole = client.chat("smol", messages=HELLO, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    parts = list(client.chat("smol:latest", messages=HELLO, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    last = parts[-1]
    assert (last.eval_count, last.prompt_eval_count) == (whole.eval_count, whole.prompt_eval_count)


def test_ndjson_framing_and_counters(http: httpx.Client) -> None:
    body = {"model": "smol", "prompt": "Count: one, two,", "options": GREEDY}
    lines = _lines(http, "/api/generate", body)
    *pieces, last = lines
    assert pieces and all(line["done"] is False and "response" in line for line in pieces)
    assert last["done"] is True and last["done_reason"] in ("stop", "length")
    for name in COUNTERS:
        assert isinstance(last[name], int) and last[name] >= 0, name
    assert last["eval_count"] <= 8 and last["prompt_eval_count"] > 0
    assert last["total_duration"] >= last["eval_duration"] > 0
    # `context` carries the conversation on: the prompt's tokens and the answer's (an
    # end-of-generation token that ended it left out).
    context = last["context"]
    assert 0 <= last["prompt_eval_count"] + last["eval_count"] - len(context) <= 1
    more = http.post(
        "/api/generate", json={**body, "prompt": "three", "context": context, "stream": False}
    ).json()
    assert more["prompt_eval_count"] > len(context)
    assert more["context"][: len(context)] == context


def test_options_are_honoured(client: ollama.Client, http: httpx.Client) -> None:
    short = client.generate("smol", "Tell me a long story.", options={"num_predict": 3})
    assert (short.eval_count, short.done_reason) == (3, "length")
    sampled = {"temperature": 1.5, "top_k": 100, "top_p": 1.0, "seed": 7, "num_predict": 12}
    first = client.generate("smol", "Write a word:", options=sampled).response
    assert client.generate("smol", "Write a word:", options=sampled).response == first
    # Load-time options are accepted and change nothing.
    same = client.generate("smol", "Write a word:", options={**sampled, "num_ctx": 8192}).response
    assert same == first
    # A stop string ends the answer where it would appear.
    baseline = client.generate("smol", "Count: one, two,", options=GREEDY).response
    assert len(baseline) > 2
    stop = baseline[1:3]
    stopped = client.generate("smol", "Count: one, two,", options={**GREEDY, "stop": [stop]})
    assert stopped.response == baseline[: baseline.index(stop)]
    # Bad values and unknown options are a 400 naming them.
    bad = {"model": "smol", "prompt": "Hi", "stream": False, "options": {"temperature": 9}}
    assert "options.temperature" in _error(http.post("/api/generate", json=bad), 400)
    bad["options"] = {"nonsense": 1}
    assert "options.nonsense" in _error(http.post("/api/generate", json=bad), 400)


def test_format_json_and_schema(client: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 96}
    chat = client.chat("smol", messages=HELLO, format=SCHEMA, options=options)
    jsonschema.validate(json.loads(chat.message.content or ""), SCHEMA)
    streamed = client.generate("smol", "A person:", format=SCHEMA, options=options, stream=True)
    jsonschema.validate(json.loads("".join(p.response for p in streamed)), SCHEMA)
    answer = client.generate("smol", "Some JSON:", format="json", options=options).response
    assert isinstance(json.loads(answer), dict)


def test_think_splits_thinking_and_false_turns_it_off(client: ollama.Client) -> None:
    thought = client.chat("thinker", messages=HELLO, think=True, options=GREEDY)
    assert thought.message.thinking and not thought.message.content
    streamed = list(client.chat("thinker", messages=HELLO, think=True, options=GREEDY, stream=True))
    assert "".join(p.message.thinking or "" for p in streamed) == thought.message.thinking
    plain = client.chat("thinker", messages=HELLO, think=False, options=GREEDY)
    assert plain.message.content and not plain.message.thinking
    generated = client.generate("thinker", "Hello", think=True, options=GREEDY)
    assert generated.thinking and not generated.response


def test_generate_with_suffix_is_infill(client: ollama.Client, http: httpx.Client) -> None:
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    filled = client.generate("fim", prefix, suffix=suffix, options=GREEDY)
    native = http.post(
        "/infill",
        json={"model": "fim", "input_prefix": prefix, "input_suffix": suffix,
              "temperature": 0, "n_predict": 8},
    )  # fmt: skip
    assert native.status_code == 200, native.text
    assert filled.response == native.json()["content"] and filled.eval_count


def test_raw_generate_is_the_prompt_as_is(client: ollama.Client, http: httpx.Client) -> None:
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    raw = client.generate("smol", prompt, raw=True, options=GREEDY)
    native = http.post(
        "/completion", json={"model": "smol", "prompt": prompt, "temperature": 0, "n_predict": 8}
    )
    assert raw.response == native.json()["content"]


def test_embed_and_older_embeddings(client: ollama.Client, http: httpx.Client) -> None:
    texts = ["A cat sat on the mat.", "The stock market fell."]
    vectors = client.embed("minilm", texts).embeddings
    assert len(vectors) == 2 and len(vectors[0]) == 384
    openai = http.post("/v1/embeddings", json={"model": "minilm", "input": texts}).json()
    assert np.allclose(vectors, [item["embedding"] for item in openai["data"]], atol=1e-5)
    one = client.embed("minilm", texts[0], dimensions=64).embeddings
    assert len(one) == 1 and len(one[0]) == 64
    older = client.embeddings("minilm", texts[0]).embedding
    assert np.allclose(older, vectors[0], atol=1e-5)


def test_images_reach_a_vision_model(client: ollama.Client) -> None:
    picture = base64.b64encode(image_bytes()).decode()
    ask = {"role": "user", "content": "What is this?"}
    without = client.chat("vision", messages=[ask], options=GREEDY)
    seen = client.chat("vision", messages=[{**ask, "images": [picture]}], options=GREEDY)
    assert (seen.prompt_eval_count or 0) > (without.prompt_eval_count or 0)
    generated = client.generate("vision", "What is this?", images=[picture], options=GREEDY)
    assert generated.prompt_eval_count == seen.prompt_eval_count and generated.done


def _state(http: httpx.Client, name: str) -> str:
    models = http.get("/v1/models").json()["data"]
    state: str = next(m["state"] for m in models if m["id"] == name)
    return state


def _wait_for(http: httpx.Client, name: str, state: str) -> None:
    deadline = time.monotonic() + 20
    while _state(http, name) != state:
        assert time.monotonic() < deadline, f"{name} never became {state}"
        time.sleep(0.1)


def test_keep_alive_loads_and_unloads(client: ollama.Client, http: httpx.Client) -> None:
    # A request with nothing to generate loads the model, or with keep_alive 0 unloads it.
    assert client.generate("vision", keep_alive=0).done_reason == "unload"
    assert _state(http, "vision") == "unloaded"
    assert client.generate("vision").done_reason == "load"
    assert _state(http, "vision") == "loaded"
    assert client.chat("vision", messages=[], keep_alive="0s").done_reason == "unload"
    # keep_alive 0 on a request: unloaded once it is answered.
    answer = client.chat("vision", messages=HELLO, options=GREEDY, keep_alive=0)
    assert answer.load_duration and answer.load_duration > 0
    _wait_for(http, "vision", "unloaded")
    # A duration: listed in /api/ps with its expiry, unloaded once it passes.
    client.chat("vision", messages=HELLO, options=GREEDY, keep_alive="1s")
    assert "vision:latest" in {m.model for m in client.ps().models}
    _wait_for(http, "vision", "unloaded")


@pytest.fixture(scope="module")
def coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ollama.Client]:
    """The real tool model (Qwen2.5-Coder-0.5B), which calls the weather tool at temperature 0
    (tests/test_agents_real_model.py)."""
    for proc in serving(
        tmp_path_factory, "ollama-coder", "-m", str(coder_gguf()), "--alias", "coder",
        "--ctx-size", "2048",
    ):  # fmt: skip
        yield ollama.Client(host=proc.root)


@pytest.mark.slow
def test_tool_calls_come_back_as_objects(coder: ollama.Client) -> None:
    client = coder
    assert "tools" in (client.show("coder").capabilities or [])
    ask = [{"role": "user", "content": "What's the weather in Paris right now?"}]
    options = {"temperature": 0, "num_predict": 64}
    whole = client.chat("coder", messages=ask, tools=[WEATHER], options=options)
    calls = whole.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather"
    jsonschema.validate(calls[0].function.arguments, WEATHER["function"]["parameters"])  # type: ignore[index]
    streamed = list(
        client.chat("coder", messages=ask, tools=[WEATHER], options=options, stream=True)
    )
    pieces = [c for p in streamed for c in p.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in pieces] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    # The call and its result go back through the template on the next turn.
    turns = [*ask, whole.message, {"role": "tool", "content": "18 C", "tool_name": "get_weather"}]
    after = client.chat("coder", messages=turns, tools=[WEATHER], options=options)
    assert (
        after.done and after.prompt_eval_count and after.prompt_eval_count > whole.prompt_eval_count
    )


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("POST", "/api/chat", {"model": "nope", "messages": HELLO}, 404, "'nope' does not exist"),
        ("POST", "/api/chat", {"model": "smol", "messages": "x"}, 400, "messages"),
        ("POST", "/api/chat", {"model": "smol", "messages": HELLO, "bogus": 1}, 400, "bogus"),
        ("POST", "/api/generate", {"model": "smol", "prompt": "a", "template": "{{ .Prompt }}"},
         400, "template"),
        ("POST", "/api/generate", {"model": "smol", "prompt": "a", "keep_alive": "5 parsecs"},
         400, "keep_alive"),
        ("POST", "/api/generate", {"model": "smol", "prompt": "a", "keep_alive": True},
         400, "keep_alive"),
        ("POST", "/api/generate", {"model": "smol", "prompt": "a", "suffix": "b"},
         400, "FIM tokens"),
        ("POST", "/api/chat", {"model": "smol", "messages": HELLO, "format": {"type": 5}},
         400, "format"),
        ("POST", "/api/embed", {"model": "smol", "input": "a"}, 400, "smol"),
        ("POST", "/api/show", {}, 400, "model"),
        ("POST", "/api/pull", {"model": "llama3.2"}, 403, "--allow-downloads"),
        ("POST", "/api/create", {"model": "x", "from": "y"}, 400, "-m"),
        ("POST", "/api/copy", {"source": "smol", "destination": "x"}, 400, "-m"),
        ("POST", "/api/push", {"model": "smol"}, 400, "-m"),
        ("DELETE", "/api/delete", {"model": "smol"}, 403, "--allow-downloads"),
    ],
)  # fmt: skip
def test_errors_in_ollama_shape(
    http: httpx.Client, method: str, path: str, body: dict[str, Any], status: int, words: str
) -> None:
    if path in ("/api/chat", "/api/generate"):
        body = {"stream": False, **body}
    assert words in _error(http.request(method, path, json=body), status)


def test_the_api_key_applies(served: ServerProcess) -> None:
    with served.http() as bare:
        assert "API key" in _error(bare.get("/api/tags"), 401)
        body = {"model": "smol", "messages": HELLO}
        assert "API key" in _error(bare.post("/api/chat", json=body), 401)
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=served.root).list()
    assert caught.value.status_code == 401


def test_the_second_port_answers_too(served: ServerProcess) -> None:
    port = served.args[served.args.index("--ollama-port") + 1]
    other = ollama.Client(host=f"http://127.0.0.1:{port}", headers=AUTH)
    assert {m.model for m in other.list().models} == {
        m.model for m in ollama.Client(host=served.root, headers=AUTH).list().models
    }


def test_names_with_a_tag_and_unknown_names_on_one_model(server: ServerProcess) -> None:
    # The shared one-model server: `default:latest` is `default`, and an unknown name is the
    # one model, as on the OpenAI routes (unless --strict-model-names).
    client = ollama.Client(host=server.root)
    for name in ("default:latest", "llama3.2:latest"):
        answer = client.chat(name, messages=HELLO, options={"num_predict": 2})
        assert answer.model == name and answer.eval_count == 2
