"""llama-server's request fields on every text route, over raw HTTP as its clients send them.

Sampling fields are checked by their effects against the same server's own baseline (greedy
output, a seed's determinism, a distribution forced through logit_bias), never by words.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mlxcel.serving.native import ANSWER_FIELDS
from tests.conftest import ok, serving
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Tell me a story about a cat."}]
COUNTING = "1, 2, 3, 4,"


def chat(http: httpx.Client, **body: Any) -> dict[str, Any]:
    result: dict[str, Any] = ok(
        http.post("/v1/chat/completions", json={"messages": STORY, "max_tokens": 12, **body})
    )
    return result


def chat_text(http: httpx.Client, **body: Any) -> str:
    return str(chat(http, **body)["choices"][0]["message"]["content"])


def complete(http: httpx.Client, **body: Any) -> Any:
    return ok(http.post("/completion", json={"prompt": COUNTING, "temperature": 0, **body}))


def stream(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_n_predict_on_every_route(http: httpx.Client) -> None:
    body = {"n_predict": 5, "ignore_eos": True, "temperature": 0}
    cmpl = ok(http.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 50, **body}))
    assert cmpl["usage"]["completion_tokens"] == 5
    assert chat(http, **body)["usage"]["completion_tokens"] == 5
    assert complete(http, **body)["tokens_predicted"] == 5


def test_n_probs_on_every_route(http: httpx.Client) -> None:
    body = {"n_probs": 3, "ignore_eos": True, "temperature": 0}
    cmpl = ok(http.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 4, **body}))
    logprobs = cmpl["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 4 and all(len(t) == 3 for t in logprobs["top_logprobs"])
    content = chat(http, max_tokens=4, **body)["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(t["top_logprobs"]) == 3 for t in content)
    native = complete(http, n_predict=4, **body)
    probabilities = native["completion_probabilities"]
    assert len(probabilities) == 4
    for entry in probabilities:
        assert set(entry) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and entry["id"] == tops[0]["id"]
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
    assert "".join(e["token"] for e in probabilities) == native["content"]


def test_tokens_cached_and_cache_prompt(http: httpx.Client) -> None:
    prompt = "The quick brown fox jumps over the lazy dog, again and again,"
    first = complete(http, prompt=prompt, n_predict=3)
    again = complete(http, prompt=prompt, n_predict=3)
    assert again["tokens_cached"] == again["timings"]["cache_n"] == first["tokens_evaluated"] - 1
    assert again["timings"]["prompt_n"] == 1
    fresh = complete(http, prompt=prompt, n_predict=3, cache_prompt=False)
    assert fresh["tokens_cached"] == fresh["timings"]["cache_n"] == 0
    assert fresh["timings"]["prompt_n"] == fresh["tokens_evaluated"]
    assert fresh["content"] == again["content"]
    usage = chat(http, cache_prompt=False)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_timings_in_every_answer(http: httpx.Client) -> None:
    whole = chat(http, temperature=0)
    timings, usage = whole["timings"], whole["usage"]
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    assert timings["predicted_n"] == usage["completion_tokens"]
    body = {"messages": STORY, "max_tokens": 6, "temperature": 0}
    plain = stream(http, "/v1/chat/completions", body)
    assert [("timings" in c) for c in plain] == [False] * (len(plain) - 1) + [True]
    per_token = stream(http, "/v1/chat/completions", {**body, "timings_per_token": True})
    content = [c for c in per_token if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content and all("timings" in c for c in content)
    predicted = [c["timings"]["predicted_n"] for c in content]
    assert predicted == sorted(predicted)
    text = stream(http, "/v1/completions", {"prompt": COUNTING, "max_tokens": 4})
    assert "timings" in text[-1]
    native = stream(
        http, "/completion", {"prompt": COUNTING, "n_predict": 4, "timings_per_token": True}
    )
    assert all("timings" in c for c in native)


def test_return_tokens_and_streamed_token_ids(http: httpx.Client) -> None:
    body = {"n_predict": 8, "ignore_eos": True}
    assert complete(http, **body)["tokens"] == []
    whole = complete(http, return_tokens=True, **body)
    assert len(whole["tokens"]) == whole["tokens_predicted"] == 8
    text = ok(http.post("/detokenize", json={"tokens": whole["tokens"]}))["content"]
    assert text == whole["content"]
    chunks = stream(http, "/completion", {"prompt": COUNTING, "temperature": 0, **body})
    assert [t for c in chunks for t in c["tokens"]] == whole["tokens"]


def test_response_fields(http: httpx.Client) -> None:
    wanted = ["content", "generation_settings/n_predict", "timings/cache_n", "no_such_field"]
    answer = complete(http, n_predict=3, response_fields=wanted)
    assert set(answer) == {"content", "generation_settings/n_predict", "timings/cache_n"}
    assert answer["generation_settings/n_predict"] == 3


def test_response_fields_never_answer_an_empty_object(http: httpx.Client) -> None:
    """Fields that name nothing of the answer made /completion answer {}: a 400 naming
    response_fields, before any work when no top-level name is a field."""
    for wanted in (["no_such_field"], ["nope", "timings/cache_n/x"], ["timings/nothing"]):
        response = http.post(
            "/completion", json={"prompt": COUNTING, "n_predict": 2, "response_fields": wanted}
        )
        assert response.status_code == 400, (wanted, response.text)
        assert response.json()["error"]["param"] == "response_fields"
        assert "content" in response.json()["error"]["message"]
    # Every field the answer has can be asked for.
    full = complete(http, n_predict=2, n_probs=1)
    assert set(full) <= ANSWER_FIELDS and "completion_probabilities" in full


def test_batch_prompts_on_completion(http: httpx.Client) -> None:
    prompts = [COUNTING, "Once upon a time"]
    singles = [complete(http, prompt=p, n_predict=4)["content"] for p in prompts]
    batch = complete(http, prompt=prompts, n_predict=4)
    assert [a["index"] for a in batch] == [0, 1]
    assert [a["content"] for a in batch] == singles
    ids = ok(http.post("/tokenize", json={"content": COUNTING, "add_special": True}))["tokens"]
    split = ok(http.post("/tokenize", json={"content": " 4,"}))["tokens"]
    head = ids[: len(ids) - len(split)]
    assert ids[len(head) :] == split
    mixed = complete(http, prompt=[*head, " 4,"], n_predict=4)
    assert mixed["content"] == singles[0]
    as_ids = complete(http, prompt=[ids, prompts[1]], n_predict=4)
    assert [a["content"] for a in as_ids] == singles
    chunks = stream(http, "/completion", {"prompt": prompts, "n_predict": 4, "temperature": 0})
    finals = {c["index"]: c for c in chunks if c["stop"]}
    assert set(finals) == {0, 1}
    for index, single in enumerate(singles):
        assert "".join(c["content"] for c in chunks if c["index"] == index) == single


def test_return_progress(http: httpx.Client) -> None:
    body = {"prompt": COUNTING, "n_predict": 2, "return_progress": True, "timings_per_token": True}
    chunks = stream(http, "/completion", body)
    reports = [c for c in chunks if "prompt_progress" in c]
    first, last = reports[0]["prompt_progress"], reports[-1]["prompt_progress"]
    # As llama-server's: a first report before any token is evaluated, at time 0.
    assert first["processed"] == first["cache"] and first["time_ms"] == 0
    assert reports[0]["timings"]["prompt_ms"] == 0 and reports[0]["timings"]["predicted_n"] == 0
    assert last["total"] == chunks[-1]["tokens_evaluated"] == last["processed"]
    assert all(r["prompt_progress"]["total"] == last["total"] for r in reports)
    processed = [r["prompt_progress"]["processed"] for r in reports]
    assert processed == sorted(set(processed)) and len(processed) >= 2
    chat = {"messages": STORY, "max_tokens": 2, "return_progress": True}
    chat_reports = [c for c in stream(http, "/v1/chat/completions", chat) if "prompt_progress" in c]
    assert all(c["choices"] == [] for c in chat_reports)
    assert chat_reports[-1]["prompt_progress"]["processed"] > 0


def test_logit_bias_in_llama_server_forms(http: httpx.Client) -> None:
    assert chat_text(http, temperature=0, max_tokens=3, logit_bias=[[" banana", 100]]) == (
        " banana" * 3
    )
    greedy = complete(http, n_predict=1, n_probs=1)["completion_probabilities"][0]["id"]
    banned = complete(http, n_predict=1, logit_bias=[[greedy, False]], return_tokens=True)
    assert banned["tokens"] != [greedy]
    as_string_key = complete(http, n_predict=1, logit_bias={str(greedy): False}, return_tokens=True)
    assert as_string_key["tokens"] == banned["tokens"]


def test_json_object_with_a_schema(http: httpx.Client) -> None:
    schema = {"type": "string", "enum": ["yes", "no"]}
    content = chat_text(
        http, max_tokens=10, response_format={"type": "json_object", "schema": schema}
    )
    assert json.loads(content) in ("yes", "no")


def test_t_max_predict_ms_stops_after_a_newline(http: httpx.Client) -> None:
    body = {"n_predict": 40, "ignore_eos": True, "logit_bias": [["\n", 100]]}
    assert complete(http, **body)["tokens_predicted"] == 40
    timed = complete(http, t_max_predict_ms=1, **body)
    assert timed["stop_type"] == "limit" and 2 <= timed["tokens_predicted"] < 40
    # No newline, no time limit.
    body["logit_bias"] = [["\n", False]]
    assert complete(http, t_max_predict_ms=1, **body)["tokens_predicted"] == 40


def _seeds(http: httpx.Client, **body: Any) -> set[str]:
    return {chat_text(http, seed=seed, **body) for seed in (1, 2, 3)}


def test_samplers_leave_out_and_reorder_stages(http: httpx.Client) -> None:
    greedy = chat_text(http, temperature=0)
    assert _seeds(http, temperature=1.5, top_k=1, samplers="kt") == {greedy}
    assert _seeds(http, temperature=1.5, top_k=1, samplers=["top-k", "temp"]) == {greedy}
    assert len(_seeds(http, temperature=1.5, top_k=1, samplers=["temperature"])) > 1


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat(http: httpx.Client, version: int) -> None:
    greedy = chat_text(http, temperature=0)
    # A target surprise near zero leaves only the likeliest token.
    assert _seeds(http, temperature=1.0, mirostat=version, mirostat_tau=0.01) == {greedy}
    loose = {"temperature": 1.0, "mirostat": version, "mirostat_tau": 10, "mirostat_eta": 0.1}
    assert len(_seeds(http, **loose)) > 1
    assert chat_text(http, seed=5, **loose) == chat_text(http, seed=5, **loose)
    settings = complete(http, n_predict=1, mirostat=version)["generation_settings"]
    assert settings["mirostat"] == version


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, "two-slots", "-np", "2", "-c", "4096")


def test_id_slot_runs_in_that_slot(two_slots: ServerProcess) -> None:
    prompt = "A prompt kept in the second slot only, word for word."
    with two_slots.http() as http:
        first = complete(http, prompt=prompt, n_predict=2, id_slot=1)
        assert first["id_slot"] == 1
        again = complete(http, prompt=prompt, n_predict=2, id_slot=1)
        assert again["id_slot"] == 1 and again["tokens_cached"] == first["tokens_evaluated"] - 1
        other = complete(http, prompt=prompt, n_predict=2, id_slot=0)
        assert other["id_slot"] == 0 and other["tokens_cached"] == 0
        error = http.post("/completion", json={"prompt": prompt, "id_slot": 2}).json()["error"]
        assert error["param"] == "id_slot"
        usage = chat(http, id_slot=1)["usage"]
        assert usage["completion_tokens"] > 0
