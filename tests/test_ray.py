"""Replicas on a Ray cluster (`serve --ray`): a two-node cluster that the test starts, the
head here (`ray start --head`, its own temp dir) and a second node in a network namespace
joined by a veth pair, two replicas of the default model deployed on it, one per node.
Requests are answered through Ray with the same greedy output as a local server, a repeated
prefix returns to the replica that holds it, a replica whose worker is killed fails its
stream with 503 and Ray replaces it, and an unreachable cluster is one line and exit 2."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._client_util import default_gguf
from tests.conftest import start
from tests.server_process import MLXCEL, ServerProcess, free_port

pytestmark = pytest.mark.slow

RAY = Path(MLXCEL).with_name("ray")
SYSTEMS = 3
REPEATS = 3
# The head node's address (here, on the veth) and the second node's (in the namespace).
HEAD, NODE = "10.213.42.1", "10.213.42.2"


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _cluster_pids(temp_dir: str, netns: str) -> list[int]:
    """The cluster's processes: those naming its temp dir (the head's, its workers and
    replica actors) and those in its network namespace (the second node's)."""
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    found = [int(pid) for pid in pids.split()]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if temp_dir.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _end_cluster(nodes: list[subprocess.Popen[bytes]], temp_dir: str, netns: str) -> None:
    """End every process of the test's cluster, then its namespace and temp dir."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, sig)
        _kill(_cluster_pids(temp_dir, netns), sig)
        time.sleep(2 if sig == signal.SIGTERM else 0.5)
    for node in nodes:
        node.wait(10)
    subprocess.run(["ip", "netns", "del", netns], check=False)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _ray_node(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*prefix, str(RAY), "start", "--block", "--disable-usage-stats", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        start_new_session=True,
    )


def _network(netns: str) -> None:
    """A namespace joined to this one by a veth pair: HEAD here, NODE there."""
    veth = f"m42r{os.getpid() % 100000}"
    for command in (
        f"ip netns add {netns}",
        f"ip link add {veth}h type veth peer name {veth}n",
        f"ip link set {veth}n netns {netns}",
        f"ip addr add {HEAD}/24 dev {veth}h",
        f"ip link set {veth}h up",
        f"ip -n {netns} addr add {NODE}/24 dev {veth}n",
        f"ip -n {netns} link set {veth}n up",
        f"ip -n {netns} link set lo up",
    ):
        subprocess.run(command.split(), check=True, capture_output=True)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A two-node Ray cluster, no dashboard, no usage stats: the head here on the veth's
    address, the second node in a network namespace the test creates."""
    temp_dir = tempfile.mkdtemp(prefix="mlxc42r-", dir="/tmp")
    netns = f"mlxc42r-{os.getpid()}"
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        _network(netns)
        port = free_port()
        address = f"{HEAD}:{port}"
        nodes.append(
            _ray_node(
                "--head",
                f"--node-ip-address={HEAD}",
                f"--port={port}",
                f"--temp-dir={temp_dir}",
                "--include-dashboard=false",
                "--num-cpus=1",
            )
        )
        _wait_for_nodes(address, 1, nodes)
        nodes.append(
            _ray_node(
                f"--address={address}",
                f"--node-ip-address={NODE}",
                "--num-cpus=1",
                prefix=("ip", "netns", "exec", netns),
            )
        )
        _wait_for_nodes(address, 2, nodes)
        yield address
    finally:
        _end_cluster(nodes, temp_dir, netns)


def _wait_for_nodes(address: str, count: int, nodes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 90
    while True:
        status = subprocess.run(
            [str(RAY), "status", f"--address={address}"], capture_output=True, text=True
        )
        if status.returncode == 0 and status.stdout.count(" node_") >= count:
            return
        assert all(node.poll() is None for node in nodes), "a Ray node failed to start"
        assert time.monotonic() < deadline, f"the Ray cluster has not {count} nodes"
        time.sleep(1)


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
    server = start(tmp, "--config", str(config), ready_timeout=180)
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


def test_greedy_output_through_ray_equals_local(on_ray: ServerProcess, server: Any) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    through_ray = chat(on_ray, messages)
    local = chat(server, messages)
    assert through_ray.status_code == 200, through_ray.text
    assert through_ray.json()["choices"][0]["message"] == local.json()["choices"][0]["message"]
    listed = replicas(on_ray)
    assert listed and all(r["node"] in (HEAD, NODE) and r["pid"] > 0 for r in listed)


def test_repeated_prefix_returns_to_its_replica(on_ray: ServerProcess) -> None:
    hits = repeats = 0
    for round_ in range(REPEATS):
        for index in range(SYSTEMS):
            messages = [
                {"role": "system", "content": system_prompt(index)},
                {"role": "user", "content": f"Where is item {round_}?"},
            ]
            response = chat(on_ray, messages, max_tokens=1)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            if round_ > 0:
                repeats += 1
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                hits += cached >= usage["prompt_tokens"] // 2
    assert hits >= 0.9 * repeats, (hits, repeats)
    # New prompts spread: both replicas answered, one on each node (one CPU each).
    listed = replicas(on_ray)
    assert len([r for r in listed if r["state"] == "serving"]) == 2
    assert {r["node"] for r in listed} == {HEAD, NODE}
    prefix = on_ray.metric("mlxcel_replica_routed_total", decision="prefix")
    assert prefix >= 0.9 * repeats


def test_killed_replica_fails_its_stream_and_ray_replaces_it(on_ray: ServerProcess) -> None:
    lines: list[str] = []
    body = {
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }

    def stream() -> None:
        with (
            on_ray.http() as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            lines.extend(line for line in response.iter_lines() if line)

    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.monotonic() + 30
    while not (busy := [r for r in replicas(on_ray) if r["running"] > 0]) or len(lines) < 3:
        assert time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.1)
    os.kill(busy[0]["pid"], signal.SIGKILL)
    reader.join(30)
    assert not reader.is_alive(), "the stream hangs"
    assert lines[-1] == "data: [DONE]"
    assert '"model_unavailable"' in lines[-2] and "SIGKILL" in lines[-2]
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
