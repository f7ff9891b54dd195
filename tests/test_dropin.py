"""llama-server's flags and shapes that its own tests (tools/server/tests) use, over HTTP.

One server started with llama-server's spellings (a `localhost` CORS keyword, a bare host name)
answers in the shapes llama-server's test suite asserts, beside ours.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import serving
from tests.server_process import MLXCEL, ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dropin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """llama-server's spellings of the listening and CORS flags."""
    yield from serving(
        tmp_path_factory,
        "dropin",
        "--host",
        "127.0.0.1,::1",
        "--cors-origins",
        "localhost,app.example",
        "--alias",
        "tiny-2,fim,code",
        "--tags",
        "chat,fim,small",
    )


def _preflight(server: ServerProcess, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization",
    }
    with server.http() as http:
        return http.options("/completions", headers=headers)


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:8080",
        "http://127.0.0.1:3000",
        "http://[::1]:3000",
        "https://app.example",
        "http://app.example:5173",
    ],
)
def test_cors_localhost_keyword_and_host_names_allow_any_port(
    dropin: ServerProcess, origin: str
) -> None:
    response = _preflight(dropin, origin)
    assert response.status_code == 204, response.text
    assert response.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize(
    "origin",
    ["http://evil.com", "http://notlocalhost", "http://localhost.evil.com", "ftp://app.example"],
)
def test_cors_localhost_keyword_refuses_other_hosts(dropin: ServerProcess, origin: str) -> None:
    response = _preflight(dropin, origin)
    assert response.status_code == 403
    assert "access-control-allow-origin" not in response.headers
    with dropin.http(headers={"Origin": origin}) as http:
        assert http.get("/v1/models").status_code == 403


def test_every_v1_route_answers_without_the_prefix(dropin: ServerProcess) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with dropin.http() as http:
        counts = [
            http.post(f"{prefix}/chat/completions/input_tokens", json=chat)
            for prefix in ("/v1", "")
        ]
    assert [c.status_code for c in counts] == [200, 200], counts[1].text
    assert counts[0].json() == counts[1].json()
    assert counts[0].json()["input_tokens"] > 0


def test_aliases_list_every_name_given_and_tags_are_listed(dropin: ServerProcess) -> None:
    with dropin.http() as http:
        (model,) = http.get("/models").json()["data"]
    # The id is the first alias as given (llama-server takes the first alphabetically).
    assert model["id"] == "tiny-2"
    assert model["aliases"] == ["tiny-2", "fim", "code"]
    assert model["tags"] == ["chat", "fim", "small"]
    client = dropin.openai()
    assert {client.models.retrieve(name).id for name in ("fim", "code")} == {"tiny-2"}


def test_default_names_the_model_in_models_retrieve(dropin: ServerProcess) -> None:
    client = dropin.openai()
    served = client.models.list().data[0].id
    assert client.models.retrieve("default").id == served
    with dropin.http() as http:
        assert http.get("/models/default").json()["id"] == served
        assert http.get("/v1/models/nonexistent").status_code == 404


LLAMA_COUNTERS = (
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "prompt_seconds_total",
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_drafts_total",
)
LLAMA_GAUGES = (
    "prompt_tokens_seconds",
    "predicted_tokens_seconds",
    "requests_processing",
    "requests_deferred",
    "n_busy_slots_per_decode",
    "n_tokens_max",
)


def _llama_series(text: str) -> dict[str, tuple[str, float]]:
    """The unlabelled `llamacpp:*` samples of a /metrics page: name -> (type, value)."""
    types = {}
    series = {}
    for line in text.splitlines():
        if line.startswith("# TYPE llamacpp:"):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split(" ", 1)
            series[name.removeprefix("llamacpp:")] = (types[name], float(value))
    return series


def test_metrics_carry_llama_server_names_beside_ours(dropin: ServerProcess) -> None:
    prompt = "the quick brown fox jumps over the lazy dog"
    with dropin.http() as http:
        before = _llama_series(http.get("/metrics").text)
        answers = [
            http.post("/completion", json={"prompt": prompt, "n_predict": 4}).json()
            for _ in range(2)
        ]
        dropin.wait_idle()  # the gauges come from the model's worker a moment after the answer
        text = http.get("/metrics").text
    series = _llama_series(text)
    grown = {name: value - before[name][1] for name, (_, value) in series.items()}
    assert {n: series[n][0] for n in LLAMA_COUNTERS} == dict.fromkeys(LLAMA_COUNTERS, "counter")
    assert {n: series[n][0] for n in LLAMA_GAUGES} == dict.fromkeys(LLAMA_GAUGES, "gauge")
    for name in (*LLAMA_COUNTERS, *LLAMA_GAUGES):
        assert f"# HELP llamacpp:{name} " in text
    timings = [answer["timings"] for answer in answers]
    assert grown["prompt_tokens_total"] == sum(t["prompt_n"] for t in timings)
    assert grown["prompt_tokens_cached_total"] == sum(t["cache_n"] for t in timings) > 0
    assert grown["tokens_predicted_total"] == sum(t["predicted_n"] for t in timings)
    assert series["n_decode_total"][1] == dropin.metric("mlxcel_decode_steps_total") > 0
    assert grown["prompt_seconds_total"] > 0 and series["prompt_tokens_seconds"][1] > 0
    assert series["n_tokens_max"][1] >= max(t["prompt_n"] + t["cache_n"] for t in timings)
    assert series["requests_processing"][1] == 0
    assert series["n_busy_slots_per_decode"][1] >= 1


def test_several_host_addresses_are_each_listened_on(dropin: ServerProcess) -> None:
    for root in (f"http://127.0.0.1:{dropin.port}", f"http://[::1]:{dropin.port}"):
        with httpx.Client(base_url=root, timeout=30) as http:
            assert http.get("/health").json() == {"status": "ok"}
            assert http.get("/v1/models").status_code == 200
    assert f"http://127.0.0.1:{dropin.port}, http://[::1]:{dropin.port}" in dropin.log()


def test_completion_batch_mixes_token_lists_and_prompt_objects(dropin: ServerProcess) -> None:
    text = "I believe the meaning of life is"
    greedy = {"n_predict": 4, "temperature": 0}
    with dropin.http() as http:
        tokens = http.post("/tokenize", json={"content": text, "add_special": True}).json()
        answers = http.post(
            "/completion", json={"prompt": [tokens["tokens"], {"prompt_string": text}], **greedy}
        )
        with_media = http.post(
            "/completion",
            json={"prompt": [text, {"prompt_string": "<__media__>", "multimodal_data": ["AAAA"]}]},
        )
    assert answers.status_code == 200, answers.text
    first, second = answers.json()
    assert first["content"] == second["content"]
    assert first["tokens_evaluated"] == second["tokens_evaluated"]
    assert with_media.status_code == 400
    assert with_media.json()["error"]["param"] == "prompt.1.multimodal_data"


def test_slots_next_token_is_llama_servers_list(dropin: ServerProcess) -> None:
    body = {"prompt": "Once", "n_predict": 1000, "ignore_eos": True, "stream": True}
    with dropin.http() as http:
        with http.stream("POST", "/completion", json=body) as stream:
            lines = stream.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)
            busy = [s for s in http.get("/slots").json() if s["is_processing"]]
        dropin.wait_idle()
        idle = http.get("/slots").json()
    [(running,)] = [s["next_token"] for s in busy]
    assert running["has_next_token"] is True
    assert running["n_remain"] + running["n_decoded"] == 1000 and running["n_decoded"] > 0
    assert isinstance(running["has_new_line"], bool)
    for slot in idle:
        assert slot["is_processing"] is False
        assert slot["next_token"] == [
            {"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}
        ]


def test_json_object_schema_takes_draft_7_tuple_items(dropin: ServerProcess) -> None:
    messages = [{"role": "user", "content": "Write an example"}]
    bare = {"items": [{"type": "integer"}]}
    closed = {"type": "array", "items": [{"type": "integer"}], "additionalItems": False}
    with dropin.http() as http:
        answers = [
            http.post(
                "/chat/completions",
                json={
                    "messages": messages,
                    "max_tokens": 40,
                    "temperature": 0,
                    "response_format": {"type": "json_object", "schema": schema},
                },
            )
            for schema in (bare, closed)
        ]
        invalid = http.post(
            "/chat/completions",
            json={
                "messages": messages,
                "response_format": {"type": "json_object", "schema": {"type": "hiccup"}},
            },
        )
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    choice = answers[1].json()["choices"][0]
    if choice["finish_reason"] == "stop":
        value = json.loads(choice["message"]["content"])
        assert isinstance(value, list) and len(value) <= 1
        assert all(isinstance(item, int) for item in value)
    assert invalid.status_code == 400
    assert invalid.json()["error"]["code"] == "invalid_json_schema"


PLAIN_TEMPLATE = "This is not a chat template, it is"


@pytest.fixture(scope="module")
def plain_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A --chat-template of plain text: valid Jinja with no tags."""
    yield from serving(tmp_path_factory, "plain-template", "--chat-template", PLAIN_TEMPLATE)


def test_plain_text_chat_template_is_the_prompt(plain_template: ServerProcess) -> None:
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "Hey"}]
    with plain_template.http() as http:
        applied = http.post("/apply-template", json={"messages": messages}).json()
        chat = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        prompt = http.post("/tokenize", json={"content": PLAIN_TEMPLATE, "add_special": True})
    assert applied["prompt"] == PLAIN_TEMPLATE
    assert chat.status_code == 200
    assert chat.json()["usage"]["prompt_tokens"] == len(prompt.json()["tokens"])


def test_a_misspelt_template_name_is_still_refused() -> None:
    run = subprocess.run(
        [MLXCEL, "serve", "--chat-template", "chatm1"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert "'chatm1': not a template" in run.stderr


def test_anthropic_sdk_lists_models_in_its_shape_and_needs_max_tokens(
    dropin: ServerProcess,
) -> None:
    claude = dropin.anthropic()
    [model] = claude.models.list().data
    assert model.type == "model" and model.id == "tiny-2" and model.display_name == "tiny-2"
    assert model.created_at.tzinfo is not None
    assert claude.models.retrieve("code").id == "tiny-2"
    with dropin.http() as http:
        # Without Anthropic's header the same route answers OpenAI's shape.
        assert http.get("/v1/models").json()["object"] == "list"
        missing = http.post(
            "/v1/messages",
            json={"model": "default", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert missing.status_code == 400
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]


def test_responses_stream_progress_and_timings_when_asked(dropin: ServerProcess) -> None:
    body = {
        "input": "This is a test" * 10,
        "max_output_tokens": 8,
        "stream": True,
        "timings_per_token": True,
        "return_progress": True,
    }
    with dropin.http() as http, http.stream("POST", "/v1/responses", json=body) as stream:
        events = [
            json.loads(line.removeprefix("data: "))
            for line in stream.iter_lines()
            if line.startswith("data: ")
        ]
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[0]["prompt_progress"]["processed"] == progress[0]["prompt_progress"]["cache"]
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete")
    assert final["timings"]["predicted_n"] == final["response"]["usage"]["output_tokens"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_post_sampling_probs_are_those_the_sampler_chain_left(dropin: ServerProcess) -> None:
    """llama-server's post_sampling_probs: `prob` and `top_probs` after the chain, no 0
    probabilities listed, and fewer than n_probs only when they already sum to 1; the token
    drawn is the one the same seed draws without it."""
    body = {"prompt": "Today was the day. Today I would finally become a", "n_probs": 10}
    body |= {"temperature": 1.0, "n_predict": 5, "seed": 42}
    with dropin.http() as http:
        post = http.post("/completion", json={**body, "post_sampling_probs": True}).json()
        plain = http.post("/completion", json=body).json()
        top3 = http.post(
            "/completion", json={**body, "post_sampling_probs": True, "top_k": 3}
        ).json()
        greedy = http.post(
            "/completion", json={**body, "post_sampling_probs": True, "temperature": 0}
        ).json()
        chat = http.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
                "logprobs": True,
                "top_logprobs": 4,
                "top_k": 2,
                "post_sampling_probs": True,
            },
        ).json()
    assert post["tokens"] == plain["tokens"]
    for entry in post["completion_probabilities"]:
        assert set(entry) == {"id", "token", "bytes", "prob", "top_probs"}
        assert 0.0 < entry["prob"] <= 1.0
        probs = [t["prob"] for t in entry["top_probs"]]
        assert all(0.0 < p <= 1.0 for p in probs) and probs == sorted(probs, reverse=True)
        if len(probs) < 10:
            assert sum(probs) == pytest.approx(1.0)
    assert "logprob" in plain["completion_probabilities"][0]
    for entry in top3["completion_probabilities"]:
        # top_k 3 leaves three candidates: their probabilities, renormalised, are all there is.
        assert len(entry["top_probs"]) <= 3
        assert sum(t["prob"] for t in entry["top_probs"]) == pytest.approx(1.0)
        assert entry["prob"] in [t["prob"] for t in entry["top_probs"]]
    for entry in greedy["completion_probabilities"]:
        assert entry["prob"] == 1.0
        same = {k: entry[k] for k in ("id", "token", "bytes")}
        assert entry["top_probs"] == [{**same, "prob": 1.0}]
    for entry in chat["choices"][0]["logprobs"]["content"]:
        assert len(entry["top_probs"]) <= 2
        assert sum(t["prob"] for t in entry["top_probs"]) == pytest.approx(1.0)
