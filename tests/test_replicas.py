"""Local replicas of the default model (`--replicas 2`): a prompt's prefix returns to the
replica that holds it, a conversation keeps its replica, each replica is listed and measured,
the model's queue counts every replica's requests, greedy output is the same on either
replica, and a replica killed during a stream fails that stream alone and comes back."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxcel.config.file import ConfigError, read_config
from tests._client_util import default_gguf
from tests.conftest import serving
from tests.server_process import MLXCEL, ServerProcess, alive, free_port

# Two slots a replica, and the prompt cache: a replica holds every prompt it has seen, so a
# repeat misses only where its replica has not seen it (round-robin: about a third of repeats).
FLAGS = ("--replicas", "2", "-np", "2", "--ctx-size", "4096")
SYSTEMS = 4
REPEATS = 3
SEED = 42


def system_prompt(index: int) -> str:
    """A distinct ~150-token system prompt (they differ from their first word)."""
    rules = " ".join(f"Rule {j}: item {index * 1000 + j} is filed under {j % 7}." for j in range(8))
    return f"{['Alpha', 'Bravo', 'Charlie', 'Delta'][index]} desk. {rules}"


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model on two replicas, routed by prefix."""
    yield from serving(tmp_path_factory, "replicas", *FLAGS)


@pytest.fixture(scope="module")
def round_robin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same, with routing off (round-robin) and no queue beyond the four slots."""
    flags = (*FLAGS, "--replica-routing", "round-robin", "--queue-size", "0")
    yield from serving(tmp_path_factory, "round_robin", *flags)


def replicas(server: ServerProcess) -> list[dict[str, Any]]:
    with server.http() as http:
        model = http.get("/v1/models").json()["data"][0]
    listed: list[dict[str, Any]] = model["meta"]["replicas"]
    return listed


def chat(server: ServerProcess, system: str, question: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 1, "temperature": 0, **body},
        )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def served_by(server: ServerProcess) -> list[float]:
    """Prompt tokens each replica was sent so far."""
    return [server.metric("mlxcel_replica_prompt_tokens_total", replica=str(i)) for i in range(2)]


def repeat_hit_rate(server: ServerProcess) -> float:
    """The share of repeated system prompts answered with most of their prompt cached."""
    order = [i for i in range(SYSTEMS) for _ in range(REPEATS)]
    random.Random(SEED).shuffle(order)
    seen: set[int] = set()
    hits = repeats = 0
    for turn, index in enumerate(order):
        usage = chat(server, system_prompt(index), f"Question {turn}?")["usage"]
        if index in seen:
            repeats += 1
            hits += usage["prompt_tokens_details"]["cached_tokens"] > usage["prompt_tokens"] / 2
        seen.add(index)
    return hits / repeats


def test_each_replica_is_listed_with_its_process_and_share_of_the_cores(
    replicated: ServerProcess,
) -> None:
    listed = replicas(replicated)
    assert [r["replica"] for r in listed] == [0, 1]
    assert all(r["state"] == "serving" and alive(r["pid"]) for r in listed)
    assert len({r["pid"] for r in listed}) == 2
    assert set(replicated.workers()) >= {r["pid"] for r in listed}
    with replicated.http() as http:
        props = http.get("/props").json()
        model = http.get("/v1/models").json()["data"][0]
    assert props["replicas"] == 2 and props["threads"] == 1
    assert model["state"] == "loaded" and model["meta"]["threads_per_replica"] == 1
    assert replicated.metric("mlxcel_replica_up") == 2


def test_a_repeated_prefix_returns_to_the_replica_that_holds_it(
    replicated: ServerProcess, round_robin: ServerProcess
) -> None:
    routed = repeat_hit_rate(replicated)
    spread = repeat_hit_rate(round_robin)
    assert routed >= 0.9, (routed, spread)
    assert spread <= 0.8, (routed, spread)
    assert replicated.metric("mlxcel_replica_routed_total", decision="prefix") >= 0.9 * (
        SYSTEMS * (REPEATS - 1)
    )
    prefixes = [
        replicated.metric("mlxcel_replica_cached_prefixes", replica=str(i)) for i in range(2)
    ]
    assert all(count > 0 for count in prefixes)
    assert [r["cached_prefixes"] for r in replicas(replicated)] == prefixes


def test_a_conversation_keeps_its_replica_over_a_prefix_held_elsewhere(
    replicated: ServerProcess,
) -> None:
    for key_field in ("prompt_cache_key", "user"):
        key = {key_field: f"conversation-{key_field}"}
        before = served_by(replicated)
        chat(replicated, "You are terse.", "Hello?", **key)
        after = served_by(replicated)
        home = 0 if after[0] > before[0] else 1
        assert after[1 - home] == before[1 - home]
        # A prompt whose prefix the other replica holds, in the same conversation: it stays.
        other = system_prompt(0)
        chat(replicated, other, "Question A?")
        chat(replicated, other, "Question B?")
        before = served_by(replicated)
        affinity = replicated.metric("mlxcel_replica_routed_total", decision="affinity")
        chat(replicated, other, "Question C?", **key)
        after = served_by(replicated)
        assert after[home] > before[home] and after[1 - home] == before[1 - home]
        assert replicated.metric("mlxcel_replica_routed_total", decision="affinity") == affinity + 1


def test_greedy_output_is_the_same_whichever_replica_answers(round_robin: ServerProcess) -> None:
    answers = []
    for _ in range(2):
        before = served_by(round_robin)
        with round_robin.http() as http:
            body = {
                "prompt": "The capital of France is",
                "max_tokens": 24,
                "temperature": 0,
                "n_probs": 2,
            }
            answers.append(http.post("/completion", json=body).json())
        after = served_by(round_robin)
        answers[-1]["replica"] = 0 if after[0] > before[0] else 1
    assert answers[0]["replica"] != answers[1]["replica"]
    assert answers[0]["content"] == answers[1]["content"]
    assert answers[0]["tokens"] == answers[1]["tokens"] or "tokens" not in answers[0]
    assert answers[0]["completion_probabilities"] == answers[1]["completion_probabilities"]


def long_stream(
    server: ServerProcess, stack: ExitStack, prompt: str = "Once upon a time"
) -> Iterator[str]:
    """A streamed completion that runs until stopped: its SSE lines."""
    http = stack.enter_context(httpx.Client(base_url=server.root, timeout=120))
    body = {"prompt": prompt, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    response = stack.enter_context(http.stream("POST", "/v1/completions", json=body))
    assert response.status_code == 200
    return response.iter_lines()


def test_the_model_queue_counts_every_replica(round_robin: ServerProcess) -> None:
    with ExitStack() as stack:
        streams = [long_stream(round_robin, stack) for _ in range(4)]
        for lines in streams:
            assert next(line for line in lines if line.startswith("data: "))
        assert [r["running"] for r in replicas(round_robin)] == [2, 2]
        # The model's gauge adds up its replicas' (each replica's worker reports its own).
        assert round_robin.metric("mlxcel_requests_running") == 4
        with round_robin.http() as http:
            refused = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "server_busy"


def test_unload_ends_every_replica_and_load_starts_them_again(round_robin: ServerProcess) -> None:
    before = [r["pid"] for r in replicas(round_robin)]
    with round_robin.http() as http:
        unloaded = http.post("/models/unload", json={"model": "default"}).json()
        assert unloaded["state"] == "unloaded" and "replicas" not in unloaded["meta"]
        assert not any(alive(pid) for pid in before)
        assert http.post("/models/load", json={"model": "default"}).json()["state"] == "loaded"
    after = replicas(round_robin)
    assert all(r["state"] == "serving" and alive(r["pid"]) for r in after)
    assert not {r["pid"] for r in after} & set(before)


def test_a_killed_replica_fails_its_stream_alone_and_restarts(replicated: ServerProcess) -> None:
    with ExitStack() as stack:
        lines = long_stream(replicated, stack)
        assert next(line for line in lines if line.startswith("data: "))
        busy = next(r for r in replicas(replicated) if r["running"])
        os.kill(busy["pid"], signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == "model_unavailable" and "killed by SIGKILL" in error["message"]
    # The dead replica's share of the model's gauges goes with it (the other runs nothing).
    deadline = time.monotonic() + 10
    while replicated.metric("mlxcel_requests_running") != 0:
        assert time.monotonic() < deadline, "the dead replica's stream still counts"
        time.sleep(0.1)
    # The other replica serves at once; the model stays loaded.
    answer = chat(replicated, "You are terse.", "Still there?")
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = replicas(replicated)
        back = listed[busy["replica"]]
        if back["state"] == "serving":
            break
        time.sleep(0.2)
    assert back["state"] == "serving" and back["pid"] != busy["pid"] and back["restarts"] == 1
    assert replicated.metric("mlxcel_replica_restarts_total", replica=str(busy["replica"])) == 1
    with replicated.http() as http:
        assert http.get("/v1/models").json()["data"][0]["state"] == "loaded"


def test_the_config_file_sets_replicas_per_model(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n  - model: a.gguf\n    replicas: 3\n    replica_routing: round-robin\n"
        "    replica_imbalance: 0\n"
    )
    values = read_config(path).models[0].values
    assert (values["replicas"], values["replica_routing"], values["replica_imbalance"]) == (
        3,
        "round-robin",
        0,
    )
    for key, value, problem in (
        ("replicas", "0", "must be at least 1 and at most 64, got 0"),
        ("replica_routing", "random", "expected one of prefix, round-robin, power-of-two, got"),
    ):
        path.write_text(f"models:\n  - model: a.gguf\n    {key}: {value}\n")
        with pytest.raises(ConfigError, match=f"models\\[0\\].{key}: {problem}"):
            read_config(path)


def test_replica_flags_out_of_range_are_refused(tmp_path: Path) -> None:
    for flags, problem in (
        (("--replicas", "0"), "--replicas must be between 1 and 64"),
        (("--replica-imbalance", "-1"), "--replica-imbalance must be at least 0"),
    ):
        result = subprocess.run(
            [MLXCEL, "serve", *flags], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert result.returncode == 2 and problem in result.stderr.splitlines()[-1]


def test_the_memory_budget_counts_every_replica(tmp_path: Path) -> None:
    weights = default_gguf().stat().st_size
    # Room for one copy of the weights, not for two.
    budget = f"{weights * 3 // 2 >> 20}M"
    result = subprocess.run(
        [MLXCEL, "serve", "--port", str(free_port()), "--replicas", "2", "--max-memory", budget],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert f"it takes about {2 * weights / (1 << 20):.0f} MiB loaded" in result.stderr


def test_a_prompt_is_scored_on_the_replica_with_free_slots(replicated: ServerProcess) -> None:
    """Both slots of the first replica decode (one long prompt: its prefix keeps them
    together); an echo with logprobs, which needs a free slot, is scored on the other at once
    (on the first, it would wait for one of the streams to end)."""
    for attempt in range(8):
        with ExitStack() as stack:
            # A prefix no replica holds (the tests before sent the system prompts).
            prompt = f"Scored beside {attempt}. {system_prompt(attempt % SYSTEMS)} Once upon a"
            streams = [long_stream(replicated, stack, prompt) for _ in range(2)]
            for lines in streams:
                assert next(line for line in lines if line.startswith("data: "))
            if [r["running"] for r in replicas(replicated)] != [2, 0]:
                continue  # a new prefix goes to the emptier cache, then they take turns
            with replicated.http() as http:
                body = {"prompt": "The cat sat", "max_tokens": 0, "echo": True, "logprobs": 1}
                scored = http.post("/v1/completions", json=body, timeout=30)
            assert scored.status_code == 200, scored.text
            assert [r["running"] for r in replicas(replicated)] == [2, 0]
            return
    pytest.fail("no prompt's streams ran together on the first replica")
