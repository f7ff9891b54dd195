"""llama-server's own routes over HTTP: tokens, templates, /props and /completion."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ok, start
from tests.portable import stop_inside
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

COUNTING = "1, 2, 3, 4,"
HELLO = [{"role": "user", "content": "Tell me a joke about owls."}]


def bad_request(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


def tokenize(http: httpx.Client, content: str, **options: bool) -> Any:
    return ok(http.post("/tokenize", json={"content": content, **options}))["tokens"]


def complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    result: dict[str, Any] = ok(http.post("/completion", json={"temperature": 0, **body}))
    return result


@pytest.mark.parametrize("text", ["Hello world", "héllo 世界", "emoji 🦉 and\nnewline"])
@pytest.mark.parametrize("add_special", [False, True])
def test_tokenize_detokenize_round_trip(http: httpx.Client, text: str, add_special: bool) -> None:
    tokens = tokenize(http, text, add_special=add_special)
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert ok(http.post("/detokenize", json={"tokens": tokens})) == {"content": text}


def test_with_pieces_gives_ids_and_the_bytes_of_each(http: httpx.Client) -> None:
    text = "héllo 世界"
    pieces = tokenize(http, text, with_pieces=True)
    assert [p["id"] for p in pieces] == tokenize(http, text)
    data = b""
    for piece in pieces:
        assert set(piece) == {"id", "piece"}
        if isinstance(piece["piece"], str):
            data += piece["piece"].encode()
        else:
            # Not valid UTF-8 on its own: llama-server sends the byte values instead.
            assert all(0 <= b < 256 for b in piece["piece"])
            data += bytes(piece["piece"])
    assert data.decode() == text


def test_parse_special(http: httpx.Client) -> None:
    marker = "<|im_start|>"
    assert len(tokenize(http, marker)) == 1
    assert len(tokenize(http, marker, parse_special=False)) > 1


def test_detokenize_rejects_ids_outside_the_vocabulary(http: httpx.Client) -> None:
    for tokens in ([-1], [1, 10**9]):
        error = bad_request(http.post("/detokenize", json={"tokens": tokens}))
        assert error["param"] == "tokens"
    assert bad_request(http.post("/detokenize", json={"tokens": "abc"}))["param"] == "tokens"
    assert bad_request(http.post("/tokenize", json={"text": "x"}))["param"] in ("content", "text")


def test_apply_template_renders_the_generation_prompt(http: httpx.Client) -> None:
    prompt = ok(http.post("/apply-template", json={"messages": HELLO}))["prompt"]
    assert HELLO[0]["content"] in prompt
    assert prompt.endswith("assistant\n")
    assert prompt.index(HELLO[0]["content"]) < prompt.rindex("assistant")
    bad = http.post("/apply-template", json={"messages": [{"role": "robot", "content": "x"}]})
    assert bad_request(bad)["param"].startswith("messages")


def test_props_describe_the_server(http: httpx.Client) -> None:
    props = ok(http.get("/props"))
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 2048
    params = settings["params"]
    assert params["n_predict"] == -1
    for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n"):
        assert isinstance(params[name], (int, float)), name
    assert props["total_slots"] == 1 and props["batched_decode"] is True
    assert props["model_path"].endswith(".gguf")
    assert "messages" in props["chat_template"]
    assert props["modalities"] == {"vision": False, "audio": False}
    assert props["build_info"].startswith("mlxcel ")


def test_completion_to_the_limit(http: httpx.Client) -> None:
    result = complete(http, prompt=COUNTING, n_predict=6)
    assert result["content"]
    assert result["stop"] is True
    assert result["stop_type"] == "limit"
    assert result["stopping_word"] == ""
    assert result["tokens_predicted"] == 6
    assert result["tokens_evaluated"] == len(tokenize(http, COUNTING, add_special=True))
    assert result["generation_settings"]["n_predict"] == 6
    assert result["truncated"] is False
    timings = result["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == result["tokens_evaluated"]
    assert timings["cache_n"] == result["tokens_cached"]
    assert timings["predicted_n"] == 6
    assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0


def test_stop_word(http: httpx.Client) -> None:
    full = complete(http, prompt=COUNTING, n_predict=12, ignore_eos=True)["content"]
    stop = stop_inside(full)
    result = complete(http, prompt=COUNTING, n_predict=12, ignore_eos=True, stop=[stop])
    assert result["stop_type"] == "word"
    assert result["stopping_word"] == stop
    assert result["content"] == full[: full.index(stop)]


def test_max_tokens_fallback(http: httpx.Client) -> None:
    body = {"prompt": COUNTING, "max_tokens": 3, "temperature": 0}
    result = ok(http.post("/completion", json=body))
    assert result["tokens_predicted"] == 3
    assert result["content"] == complete(http, prompt=COUNTING, n_predict=3)["content"]


def test_n_predict_zero_generates_nothing(http: httpx.Client) -> None:
    result = complete(http, prompt=COUNTING, n_predict=0)
    assert (result["content"], result["tokens_predicted"], result["stop_type"]) == ("", 0, "limit")


def test_streaming_chunks_then_the_final_object(http: httpx.Client) -> None:
    body = {"prompt": COUNTING, "n_predict": 8, "temperature": 0, "stream": True}
    with http.stream("POST", "/completion", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert "data: [DONE]" not in lines
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    *chunks, final = events
    assert chunks and all(c["stop"] is False for c in chunks)
    assert final["stop"] is True and final["content"] == ""
    assert final["tokens_predicted"] == 8 and final["stop_type"] == "limit"
    streamed = "".join(c["content"] for c in chunks)
    assert streamed == complete(http, prompt=COUNTING, n_predict=8)["content"]


def test_prompt_as_token_ids_equals_prompt_as_text(http: httpx.Client) -> None:
    ids = tokenize(http, COUNTING, add_special=True)
    as_text = complete(http, prompt=COUNTING, n_predict=8)
    as_ids = complete(http, prompt=ids, n_predict=8)
    assert as_ids["content"] == as_text["content"]
    assert as_ids["tokens_evaluated"] == as_text["tokens_evaluated"] == len(ids)
    assert as_ids["prompt"] == as_text["prompt"]


def test_completion_rejects_what_it_cannot_do(http: httpx.Client) -> None:
    # This server loads no LoRA adapter: id 0 names none (docs/lora.md).
    lora = http.post("/completion", json={"prompt": COUNTING, "lora": [{"id": 0, "scale": 1}]})
    assert bad_request(lora)["param"] == "lora[0].id"
    for field, value in (
        ("mirostat", 3),
        ("id_slot", 1),
        ("samplers", ["infill"]),
        ("samplers", "kq"),
        ("response_fields", "content"),
    ):
        response = http.post("/completion", json={"prompt": COUNTING, field: value})
        assert bad_request(response)["param"] == field
    response = http.post("/completion", json={"prompt": [1, 10**9]})
    assert bad_request(response)["param"] == "prompt"
    response = http.post("/completion", json={"prompt": COUNTING, "n_predict": -2})
    assert bad_request(response)["param"] == "n_predict"
    assert bad_request(http.post("/completion", json={"prompt": ""}))["param"] == "prompt"


def test_input_tokens_match_the_chat_prompt(http: httpx.Client) -> None:
    counted = ok(http.post("/v1/chat/completions/input_tokens", json={"messages": HELLO}))
    assert counted["object"] == "response.input_tokens"
    chat = ok(http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1}))
    assert counted["input_tokens"] == chat["usage"]["prompt_tokens"]
    prompt = ok(http.post("/apply-template", json={"messages": HELLO}))["prompt"]
    assert counted["input_tokens"] == len(tokenize(http, prompt, add_special=True))


def test_input_tokens_count_prompts_longer_than_the_context(http: httpx.Client) -> None:
    long = [{"role": "user", "content": "owl " * 3000}]
    counted = ok(http.post("/v1/chat/completions/input_tokens", json={"messages": long}))
    assert counted["input_tokens"] > 2048
    chat = http.post("/v1/chat/completions", json={"messages": long, "max_tokens": 1})
    assert bad_request(chat)["code"] == "context_length_exceeded"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start(tmp_path_factory.mktemp("native-keyed"), "--api-key", "sesame")
    yield proc
    proc.stop_soon()


def test_native_routes_need_the_key(keyed: ServerProcess) -> None:
    requests = [
        ("POST", "/tokenize", {"content": "hi"}),
        ("POST", "/detokenize", {"tokens": [1]}),
        ("POST", "/apply-template", {"messages": HELLO}),
        ("GET", "/props", None),
        ("POST", "/completion", {"prompt": "hi", "n_predict": 1}),
        ("POST", "/v1/chat/completions/input_tokens", {"messages": HELLO}),
    ]
    with keyed.http() as http:
        for method, path, body in requests:
            assert http.request(method, path, json=body).status_code == 401, path
            keyed_response = http.request(method, path, json=body, headers={"X-Api-Key": "sesame"})
            assert keyed_response.status_code == 200, (path, keyed_response.text)
