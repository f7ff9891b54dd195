"""Replicas on a Ray cluster (`serve --ray`): a two-node cluster that the test starts, the
head here (`ray start --head`, its own temp dir) and a second node in a network namespace
joined by a veth pair, two replicas of the default model deployed on it, one per node.
Requests are answered through Ray with the same greedy output as a local server, a repeated
prefix returns to the replica that holds it, a replica whose worker is killed fails its
stream with 503 and Ray replaces it, the model's queue counts every Ray replica, a replica no
node can take fails its model at the start deadline, the model is outside --max-memory, the
cluster lost mid-run is 503 until it is back and then serves again, and an unreachable
cluster is one line and exit 2."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._client_util import default_gguf
from tests._ray_cluster import HEAD, NODE, Cluster
from tests.conftest import start
from tests.server_process import MLXCEL, ServerProcess, free_port

pytestmark = pytest.mark.slow

SYSTEMS = 3
REPEATS = 3
# The model's gauges of sequences running and waiting.
GAUGES = ("running", "waiting")
# Counted by the replicas' engines (the first two) and per replica by the HTTP process.
SERIES = (
    "mlxcel_prompt_tokens_total",
    "mlxcel_generation_tokens_total",
    "mlxcel_replica_prompt_tokens_total",
    "mlxcel_replica_cached_tokens_total",
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The two-node cluster (tests/_ray_cluster.py), ended after the module whatever
    happens."""
    made = Cluster()
    try:
        made.start()
        yield made
    finally:
        made.end()


@pytest.fixture(scope="module")
def ray_address(cluster: Cluster) -> str:
    return cluster.address


@pytest.fixture(scope="module")
def on_ray(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model as two replicas on the cluster, one CPU and one thread each."""
    tmp = tmp_path_factory.mktemp("ray")
    config = tmp / "models.yaml"
    config.write_text(
        f"ray:\n  address: {ray_address}\n"
        f"models:\n  - model: {default_gguf()}\n    replicas: 2\n    parallel: 2\n"
        "    ctx_size: 4096\n    ray_actor_options: {num_cpus: 1}\n"
    )
    # A memory budget far below the model's weights: replicas on Ray are outside it.
    server = start(tmp, "--config", str(config), "--max-memory", "1M", ready_timeout=180)
    yield server
    server.stop()


def replicas(server: ServerProcess) -> list[dict[str, Any]]:
    with server.http() as http:
        listed: list[dict[str, Any]] = http.get("/v1/models").json()["data"][0]["meta"]["replicas"]
    return listed


def chat(server: ServerProcess, messages: list[dict[str, str]], **body: Any) -> httpx.Response:
    with server.http() as http:
        return http.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 8, "temperature": 0, **body},
        )


def system_prompt(index: int) -> str:
    rules = " ".join(f"Rule {j}: item {index * 1000 + j} is filed under {j % 7}." for j in range(8))
    return f"{['Alpha', 'Bravo', 'Charlie'][index]} desk. {rules}"


def long_stream(
    server: ServerProcess, lines: list[str], content: str = "Count slowly.", **body: Any
) -> threading.Thread:
    """A stream of 1,500 tokens read on a thread of its own into `lines` (its end: the
    server's, or the connection's when the server stops)."""
    request = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        **body,
    }

    def stream() -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            server.http() as http,
            http.stream("POST", "/v1/chat/completions", json=request) as response,
        ):
            lines.extend(line for line in response.iter_lines() if line)

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    return reader


def ray_server(tmp: Path, address: str, model: str, ray: str = "") -> ServerProcess:
    """A server of one model on the cluster: `model`, its config keys (YAML flow)."""
    config = tmp / "models.yaml"
    config.write_text(
        f"ray: {{address: {address}{ray}}}\n"
        f"models:\n  - {{model: {default_gguf()}, ctx_size: 4096, threads: 1, {model}}}\n"
    )
    return start(tmp, "--config", str(config), ready_timeout=180)


def test_greedy_output_through_ray_equals_local(on_ray: ServerProcess, server: Any) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    through_ray = chat(on_ray, messages)
    local = chat(server, messages)
    assert through_ray.status_code == 200, through_ray.text
    assert through_ray.json()["choices"][0]["message"] == local.json()["choices"][0]["message"]
    listed = replicas(on_ray)
    assert listed and all(r["node"] in (HEAD, NODE) and r["pid"] > 0 for r in listed)
    with on_ray.http() as http:
        meta = http.get("/v1/models").json()["data"][0]["meta"]
    assert meta["placement"] == "ray" and meta["in_memory_budget"] is False
    assert meta["memory_bytes"] is None


def test_repeated_prefix_returns_to_its_replica(on_ray: ServerProcess) -> None:
    hits = repeats = 0
    before = {name: on_ray.metric(name) for name in SERIES}
    sent = dict.fromkeys(SERIES, 0)
    for round_ in range(REPEATS):
        for index in range(SYSTEMS):
            messages = [
                {"role": "system", "content": system_prompt(index)},
                {"role": "user", "content": f"Where is item {round_}?"},
            ]
            response = chat(on_ray, messages, max_tokens=1)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            sent["mlxcel_prompt_tokens_total"] += usage["prompt_tokens"]
            sent["mlxcel_generation_tokens_total"] += usage["completion_tokens"]
            sent["mlxcel_replica_prompt_tokens_total"] += usage["prompt_tokens"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            sent["mlxcel_replica_cached_tokens_total"] += cached
            if round_ > 0:
                repeats += 1
                hits += cached >= usage["prompt_tokens"] // 2
    assert hits >= 0.9 * repeats, (hits, repeats)
    # New prompts spread: both replicas answered, one on each node (one CPU each).
    listed = replicas(on_ray)
    assert len([r for r in listed if r["state"] == "serving"]) == 2
    assert {r["node"] for r in listed} == {HEAD, NODE}
    prefix = on_ray.metric("mlxcel_replica_routed_total", decision="prefix")
    assert prefix >= 0.9 * repeats
    # The replicas' engines counted what their requests carried, in the server's /metrics
    # (each request's series by the replica that served it).
    assert {name: on_ray.metric(name) - before[name] for name in SERIES} == sent
    for replica in listed:
        assert on_ray.metric("mlxcel_replica_up", replica=replica["replica"]) == 1
        assert on_ray.metric("mlxcel_replica_prompt_tokens_total", replica=replica["replica"]) > 0


def test_killed_replica_fails_its_stream_and_ray_replaces_it(on_ray: ServerProcess) -> None:
    lines: list[str] = []
    reader = long_stream(on_ray, lines)
    deadline = time.monotonic() + 30
    while not (busy := [r for r in replicas(on_ray) if r["running"] > 0]) or len(lines) < 3:
        assert time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.1)
    os.kill(busy[0]["pid"], signal.SIGKILL)
    reader.join(30)
    assert not reader.is_alive(), "the stream hangs"
    assert lines[-1] == "data: [DONE]"
    assert '"model_unavailable"' in lines[-2] and "SIGKILL" in lines[-2]
    # The dead replica's share of the model's gauges goes with it (the other runs nothing).
    deadline = time.monotonic() + 10
    while on_ray.metric("mlxcel_requests_running") != 0:
        assert time.monotonic() < deadline, "the dead replica's stream still counts"
        time.sleep(0.1)
    # Ray starts another replica, which new prompts reach (the emptiest cache); meanwhile a
    # request may get 503, never hang.
    before = {r["pid"] for r in replicas(on_ray)}
    deadline = time.monotonic() + 60
    for attempt in range(1000):
        messages = [
            {"role": "system", "content": f"Desk {attempt}. Items are filed by number."},
            {"role": "user", "content": "Where is item 7?"},
        ]
        response = chat(on_ray, messages, max_tokens=1)
        assert response.status_code in (200, 503), response.text
        if response.status_code == 200 and {r["pid"] for r in replicas(on_ray)} - before:
            break
        assert time.monotonic() < deadline, "no replica came back"
        time.sleep(0.2)
    listed = replicas(on_ray)
    assert len(listed) == 2 and all(r["state"] == "serving" for r in listed), listed
    assert busy[0]["pid"] not in {r["pid"] for r in listed}


def test_the_model_queue_counts_every_ray_replica(ray_address: str, tmp_path: Path) -> None:
    # Two replicas of one slot and a queue of one: the model takes three sequences in all, as
    # local replicas do (each replica's own queue would take four). No CPU asked: the
    # cluster's two are the module's server's.
    server = ray_server(
        tmp_path,
        ray_address,
        "name: tiny-queue, replicas: 2, parallel: 1, queue_size: 1, "
        "replica_routing: round-robin, ray_actor_options: {num_cpus: 0}",
    )
    try:
        streams: list[list[str]] = [[], [], []]
        for index, lines in enumerate(streams):
            long_stream(server, lines, f"Count slowly from {index}.")
            deadline = time.monotonic() + 30
            while sum(r["running"] for r in replicas(server)) <= index:
                assert time.monotonic() < deadline, "the stream did not reach a replica"
                time.sleep(0.1)
        assert all(r["running"] for r in replicas(server))
        # The model's gauges add up what each replica's worker reports along its stream.
        deadline = time.monotonic() + 30
        while (load := [server.metric(f"mlxcel_requests_{s}") for s in GAUGES]) != [2, 1]:
            assert time.monotonic() < deadline, load
            time.sleep(0.2)
        with server.http() as http:
            refused = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "server_busy"
    finally:
        server.stop()


def test_an_unplaceable_replica_fails_its_model_at_the_deadline(
    ray_address: str, tmp_path: Path
) -> None:
    server = ray_server(
        tmp_path,
        ray_address,
        "name: tiny-gpu, replicas: 2, on_demand: true, "
        "ray_actor_options: {num_cpus: 0, resources: {gpu_x: 1}}",
        ray=", start_timeout: 5",
    )
    try:
        began = time.monotonic()
        response = chat(server, [{"role": "user", "content": "Hi"}], model="tiny-gpu")
        assert time.monotonic() - began < 60
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "model_unavailable"
        message = error["message"]
        assert "within 5s" in message and "gpu_x 1" in message and "no node has that" in message
        assert f"{HEAD}: CPU 1" in message and f"{NODE}: CPU 1" in message, message
        with server.http() as http:
            listed = http.get("/v1/models").json()["data"][0]
        assert listed["state"] == "failed"
    finally:
        server.stop()


def test_the_cluster_lost_mid_run_is_503_then_serves_again(
    on_ray: ServerProcess, cluster: Cluster
) -> None:
    lines: list[str] = []
    reader = long_stream(on_ray, lines)
    deadline = time.monotonic() + 30
    while len(lines) < 3:
        assert time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.1)
    cluster.stop()
    reader.join(30)
    assert not reader.is_alive(), "the stream hangs"
    # The stream fails with its replica (or with the cluster, once the server sees it lost).
    assert lines[-1] == "data: [DONE]"
    assert '"model_unavailable"' in lines[-2], lines[-2]
    lost = f"the Ray cluster at {cluster.address} is lost"
    deadline = time.monotonic() + 20
    while True:
        response = chat(on_ray, [{"role": "user", "content": "Hi"}])
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "model_unavailable"
        if lost in response.json()["error"]["message"]:
            break
        assert time.monotonic() < deadline, response.text
        time.sleep(0.5)
    assert on_ray.process.poll() is None
    # The cluster back at its address (a new cluster: Ray's GCS keeps no state without
    # Redis): the server joins it again and deploys the model there, within a bound.
    cluster.start()
    back = time.monotonic()
    while (response := chat(on_ray, [{"role": "user", "content": "Hi"}])).status_code != 200:
        assert response.status_code == 503, response.text
        assert time.monotonic() - back < 120, "the model did not serve again"
        time.sleep(1)
    listed = replicas(on_ray)
    assert len(listed) >= 1 and all(r["state"] == "serving" for r in listed), listed
    assert "joined the Ray cluster at" in on_ray.log()


def test_unreachable_cluster_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [MLXCEL, "serve", "--replicas", "2", "--ray", f"127.0.0.1:{port}", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"mlxcel: the Ray cluster at 127.0.0.1:{port} cannot be reached: Connection refused"
    ]


def test_a_ray_client_address_is_refused_in_one_line(tmp_path: Path) -> None:
    # Refused before anything is reached: Serve cannot stream over Ray Client.
    done = subprocess.run(
        [MLXCEL, "serve", "--replicas", "2", "--ray", "ray://127.0.0.1:10001", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("mlxcel: ray://127.0.0.1:10001 is a Ray Client address"), line
    assert "GCS address" in line
