"""Legacy completions' `echo` with `logprobs`: the prompt's tokens scored, on both engines.

The llama.cpp server runs the real default model, the MLX one a tiny random-weight model;
every check holds for any model: the shape OpenAI gives, and scores that must equal what the
same server reports for the same tokens when it generates them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import openai
import pytest

from tests.conftest import on_each_engine
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

PROMPT = "The cat sat on the"
GREEDY = {"temperature": 0, "ignore_eos": True}
# What the engines report for the same token in two forward passes of different shapes; both
# give the same float here, and a GPU's kernels may differ in the last bits.
TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def engine(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    # Two slots: a prompt is scored in a free one while the other decodes.
    proc = on_each_engine(request, "-c", "2048", "--parallel", "2")
    yield proc
    proc.stop_soon()


@pytest.fixture(scope="module")
def client(engine: ServerProcess) -> openai.OpenAI:
    return engine.openai()


def post(engine: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    with engine.http() as http:
        response = http.post(path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def token_ids(engine: ServerProcess, text: str) -> list[int]:
    return list(post(engine, "/tokenize", {"content": text, "add_special": True})["tokens"])


def generated_ids(engine: ServerProcess, prompt: object, n: int) -> list[int]:
    """The tokens a greedy generation of `n` gives after `prompt`."""
    body = {"prompt": prompt, "n_predict": n, "return_tokens": True, **GREEDY}
    return list(post(engine, "/completion", body)["tokens"])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, abs_tol=TOLERANCE)


def check_shape(logprobs: Any, n_prompt: int, n_generated: int, top_n: int) -> None:
    """OpenAI's echo shape: the prompt's tokens then the answer's, the first without scores."""
    tokens, scores = logprobs.tokens, logprobs.token_logprobs
    tops, offsets = logprobs.top_logprobs, logprobs.text_offset
    assert len(tokens) == len(scores) == len(tops) == len(offsets) == n_prompt + n_generated
    assert scores[0] is None and tops[0] is None and offsets[0] == 0
    assert all(s is not None and s <= 0 for s in scores[1:])
    for score, top in zip(scores[1:], tops[1:], strict=True):
        # Pieces that decode alike (a split UTF-8 character) share one key.
        assert 1 <= len(top) <= top_n
        assert all(v <= 0 for v in top.values())
        # The chosen token need not be among the top N, but none of them is below it unless
        # the N are all above it.
        assert max(top.values()) >= score - TOLERANCE
    assert offsets == sorted(offsets)
    # The echoed tokens spell the prompt, and the answer's text starts where they end.
    assert "".join(tokens[:n_prompt]) == PROMPT
    assert offsets[n_prompt] == len(PROMPT)


def test_shape_for_strings_ids_batches_and_n(client: openai.OpenAI, engine: ServerProcess) -> None:
    ids = token_ids(engine, PROMPT)
    answer = client.completions.create(
        model="default",
        prompt=[PROMPT, ids],  # type: ignore[arg-type]
        n=2,
        max_tokens=3,
        logprobs=2,
        echo=True,
        extra_body=GREEDY,
        temperature=0,
    )
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    for choice in answer.choices:
        assert choice.logprobs is not None and choice.text.startswith(PROMPT)
        check_shape(choice.logprobs, len(ids), 3, 2)
    # The same prompt as text or ids is scored alike in every choice.
    first = answer.choices[0].logprobs
    assert first is not None
    for choice in answer.choices[1:]:
        other = choice.logprobs
        assert other is not None and first.token_logprobs and other.token_logprobs
        pairs = zip(first.token_logprobs[1:], other.token_logprobs[1:], strict=True)
        assert all(close(a, b) for a, b in pairs)


# 140 tokens: the prompt scored crosses the chunks of both engines (32 and 128 rows).
@pytest.mark.parametrize("length", [6, 140])
def test_prompt_scores_equal_the_generated_tokens_scores(
    engine: ServerProcess, length: int
) -> None:
    prompt = token_ids(engine, PROMPT)
    answer = generated_ids(engine, prompt, length)
    body = {"prompt": prompt, "max_tokens": length, "logprobs": 3, **GREEDY}
    generated = post(engine, "/v1/completions", body)["choices"][0]["logprobs"]
    # The prompt and its greedy answer, scored without generating: the classic use.
    scored = post(
        engine,
        "/completions",
        {"prompt": prompt + answer, "max_tokens": 0, "logprobs": 3, "echo": True},
    )["choices"][0]
    assert scored["finish_reason"] == "length"
    echoed = scored["logprobs"]
    assert len(echoed["tokens"]) == len(prompt) + len(answer)
    at = len(prompt)
    assert echoed["tokens"][at:] == generated["tokens"]
    for mine, theirs in zip(
        echoed["token_logprobs"][at:], generated["token_logprobs"], strict=True
    ):
        assert close(mine, theirs)
    # The last prompt position's alternatives are the first generated token's, and so on.
    for mine, theirs in zip(echoed["top_logprobs"][at:], generated["top_logprobs"], strict=True):
        assert mine.keys() == theirs.keys()
        assert all(close(mine[k], theirs[k]) for k in mine)


def test_streamed_echo_carries_the_prompt_scores_first(engine: ServerProcess) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "logprobs": 1, "echo": True, **GREEDY}
    whole = post(engine, "/v1/completions", body)["choices"][0]
    with engine.http() as http:
        events = http.post("/v1/completions", json={**body, "stream": True}, timeout=60)
    chunks = [
        json.loads(line[6:]) for line in events.text.splitlines() if line.startswith("data: {")
    ]
    parts = [c["choices"][0] for c in chunks if c["choices"][0]["logprobs"]]
    assert parts[0]["text"].startswith(PROMPT)
    assert parts[0]["logprobs"]["token_logprobs"][0] is None
    merged: dict[str, list[Any]] = {key: [] for key in whole["logprobs"]}
    for part in parts:
        for key, values in part["logprobs"].items():
            merged[key] += values
    assert "".join(p["text"] for p in parts) == whole["text"]
    assert merged["tokens"] == whole["logprobs"]["tokens"]
    assert merged["text_offset"] == whole["logprobs"]["text_offset"]
    pairs = zip(merged["token_logprobs"][1:], whole["logprobs"]["token_logprobs"][1:], strict=True)
    assert all(close(a, b) for a, b in pairs)


def _text(lines: list[str]) -> str:
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return "".join(chunk["choices"][0]["text"] for chunk in data)


# The long stream's tokens: about two seconds of decoding left after the short one ends (the
# real model takes about 8 ms a token on two cores, the tiny MLX one about 1 ms), so three
# scorings come back while it still decodes, even on a loaded machine.
LONG_STORY = {"llamacpp": 300, "mlx": 2000}


# With two streams both slots are busy: the scoring waits for the shorter one to end.
@pytest.mark.parametrize("streams", [1, 2])
def test_scoring_beside_streams_leaves_them_as_they_were(
    engine: ServerProcess, streams: int, request: pytest.FixtureRequest
) -> None:
    long = LONG_STORY[request.node.callspec.params["engine"]]
    stories = [
        {"prompt": "Once upon a time", "max_tokens": long, **GREEDY},
        {"prompt": "In a land far away", "max_tokens": 60, **GREEDY},
    ][:streams]
    solo = [post(engine, "/v1/completions", story)["choices"][0]["text"] for story in stories]
    prompts = ["A quick brown fox", "Numbers: 1, 2, 3, 4", PROMPT]
    alone = [score(engine, p) for p in prompts]
    with ExitStack() as stack:
        http = stack.enter_context(engine.http())
        lines = [
            stack.enter_context(
                http.stream("POST", "/v1/completions", json={**story, "stream": True})
            ).iter_lines()
            for story in stories
        ]
        heads = [[next(each) for _ in range(4)] for each in lines]
        beside = [score(engine, p) for p in prompts]
        # The longest stream was still decoding when the scores came back.
        assert any(slot["is_processing"] for slot in http.get("/slots").json())
        texts = [_text(head + list(rest)) for head, rest in zip(heads, lines, strict=True)]
    assert texts == solo
    for one, other in zip(alone, beside, strict=True):
        assert len(one) == len(other)
        assert all(close(a, b) for a, b in zip(one[1:], other[1:], strict=True))


def score(engine: ServerProcess, prompt: str) -> list[float]:
    body = {"prompt": prompt, "max_tokens": 0, "logprobs": 1, "echo": True}
    scores: list[float] = post(engine, "/v1/completions", body)["choices"][0]["logprobs"][
        "token_logprobs"
    ]
    return scores


def test_bad_echo_requests_are_400s(engine: ServerProcess) -> None:
    with engine.http() as http:
        too_many = http.post("/v1/completions", json={"prompt": "x", "echo": True, "logprobs": 21})
        with_suffix = http.post(
            "/v1/completions",
            json={"prompt": "x", "echo": True, "logprobs": 1, "suffix": "y"},
        )
    for response, param in ((too_many, "logprobs"), (with_suffix, "suffix")):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param


def test_echo_without_logprobs_is_unchanged(client: openai.OpenAI) -> None:
    plain = client.completions.create(
        model="default", prompt=PROMPT, max_tokens=3, temperature=0, echo=True
    )
    assert plain.choices[0].logprobs is None and plain.choices[0].text.startswith(PROMPT)


def test_echo_logprobs_over_httpx_without_v1(engine: ServerProcess) -> None:
    with engine.http() as http:
        answer = http.post(
            "/completions", json={"prompt": PROMPT, "max_tokens": 1, "logprobs": 0, "echo": True}
        ).json()["choices"][0]["logprobs"]
    assert answer["top_logprobs"][0] is None
    assert all(top == {} for top in answer["top_logprobs"][1:])
